"""launcher.rehearse in process, no launches: the verdict table, the stop checkpoint's
extrapolation, the case selection, the shrunk experiment, the cluster case (it renders, it
starts nothing) and the rehearsed figure launcher.submit reads back."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest
from refusals import refusal

from launcher.config import ConfigError, compose
from launcher.rehearse import report
from launcher.rehearse.__main__ import main as rehearse_main
from launcher.rehearse.cases import NAMES
from launcher.rehearse.runner import plan, rehearse, selected
from launcher.submit import slurm, stop_time
from launcher.submit.job import prepare


def read_report(run_dir: Path) -> dict:
    return json.loads((run_dir / "rehearse" / "report.json").read_text())


def test_extrapolation_is_linear_in_the_state_bytes():
    assert report.extrapolate(0.05, 2_000_000, 1_500_000_000) == pytest.approx(37.5)
    assert report.extrapolate(0.0, 1000, 2000) == pytest.approx(0.002)  # timed as 0: 1 ms
    with pytest.raises(ValueError):
        report.extrapolate(1.0, 0, 10)
    ckpt = report.StopCheckpoint(0.02, 2_400_000, 1_488_000_000, "gpt2")
    assert ckpt.extrapolated_s == 12.4
    assert ckpt.why == (
        "rehearsed: the stop checkpoint took 0.02 s for 2.4 MB, scaled to 1.49 GB of gpt2 state"
    )


def test_verdict_table_has_the_columns_and_escapes_cells():
    rows = [
        report.Row("stop", "stop", "exit 143", "exit 143", True, "rehearse/stop"),
        report.Row("bad_input", "bad", "one line", "a|b", False, "rehearse/console/x.txt"),
    ]
    table = report.markdown_table(rows).splitlines()
    assert table[0] == "| fault | expected | observed | verdict | evidence path |"
    assert table[2] == "| stop | exit 143 | exit 143 | pass | `rehearse/stop` |"
    assert table[3] == "| bad | one line | a\\|b | FAIL | `rehearse/console/x.txt` |"
    assert not report.all_passed(rows) and report.all_passed(rows[:1])
    assert not report.all_passed([])


def test_only_and_skip_choose_cases_and_refuse_unknown_names():
    names = [c.name for c in selected(compose(["rehearse.only=[stop,hung_rank]"]))]
    assert names == ["stop", "hung_rank"]
    names = [c.name for c in selected(compose(["rehearse.skip=[stop]", "cluster=slurm"]))]
    assert names == [n for n in NAMES if n != "stop"]
    with pytest.raises(
        ConfigError, match="rehearse.only: unknown case 'stpo'; the cases are stop,"
    ):
        selected(compose(["rehearse.only=[stpo]"]))
    with pytest.raises(ConfigError, match="cluster=local renders no job"):
        selected(compose(["rehearse.only=[cluster]"]))
    with pytest.raises(ConfigError, match="leave no case"):
        selected(compose(["rehearse.only=[stop]", "rehearse.skip=[stop]"]))


def test_shrunk_experiment_keeps_the_fault_path_settings():
    user = ["model=gpt2", "strategy=fsdp2", "data.num_workers=3", "trainer.keep_checkpoints=1",
            "watchdog.straggler_frac=0.5", "trainer.max_steps=100000"]  # fmt: skip
    cfg, overrides, nproc, notes = plan(user)
    assert cfg.model.name == "gpt2" and cfg.trainer.max_steps == 100000  # the user's
    ran = compose(overrides)
    assert (ran.strategy.name, ran.data.num_workers, ran.watchdog.straggler_frac) == (
        "fsdp2", 3, 0.5,
    )  # fmt: skip
    assert (ran.model.n_layer, ran.model.n_embd, ran.trainer.max_steps) == (2, 64, 30)
    assert ran.trainer.keep_checkpoints == 2  # the world-size case needs a mid-run one
    assert ran.trainer.global_batch_size == 2 * 2 * nproc and ran.fault.kind == "none"
    assert notes == []
    with pytest.raises(ConfigError, match="rehearses one experiment"):
        plan(["+exp=bucket_sweep"])
    with pytest.raises(ConfigError, match="rehearse.nproc=1: must be at least 2"):
        plan(["rehearse.nproc=1"])


def test_cluster_case_checks_the_rendered_job(tmp_path, capsys):
    """No launch: the cluster case alone renders the job with launcher.submit's checks."""
    run = [f"run.root={tmp_path}", "run.id=c", "rehearse.only=[cluster]"]
    assert rehearse([*run, "cluster=slurm"]) == 0
    (row,) = read_report(tmp_path / "c")["rows"]
    assert row["verdict"] == "pass" and "requeue limited to 20" in row["observed"]
    assert (tmp_path / "c" / "rehearse" / "cluster" / "job.sbatch").is_file()
    assert rehearse([*run, "cluster=slurm", "cluster.slurm.max_requeues=null"]) == 1
    (row,) = read_report(tmp_path / "c")["rows"]
    assert "max_requeues=null: a failing job requeues forever" in row["observed"]
    k8s = ["cluster=k8s", "cluster.k8s.termination_grace_s=1", "trainer.global_batch_size=32"]
    assert rehearse([*run, *k8s]) == 1
    (row,) = read_report(tmp_path / "c")["rows"]
    assert "termination_grace_s=1 is too short to stop with a checkpoint" in row["observed"]
    assert "| the rendered cluster job |" in capsys.readouterr().out


def test_submit_uses_the_rehearsed_stop_checkpoint_time(tmp_path):
    """A rehearsal's report in the run directory: its extrapolated figure is what the
    signal lead is checked against, named as rehearsed."""
    run = [f"run.root={tmp_path}", "run.id=r"]
    folder = tmp_path / "r" / "rehearse"
    folder.mkdir(parents=True)
    ckpt = report.StopCheckpoint(0.5, 1_000_000, 2_000_000_000, "gpt2-xl")  # 1000 s
    facts = {"run_dir": str(tmp_path / "r"), "nproc": 2, "wall_s": 1.0, "kept": [],
             "shrunk": [], "notes": []}  # fmt: skip
    report.write(tmp_path / "r", report.report_dict([], ckpt, facts))
    job = prepare("slurm", run)
    write = stop_time.checkpoint_write(job, job.cluster.slurm, "cluster.slurm")
    assert write.seconds == 1000.0 and write.why.startswith("rehearsed: the stop checkpoint took")
    with pytest.raises(ConfigError, match="signal_lead_s=300 is too short .* a 1000 s checkpoint "
                       "write \\(rehearsed: "):  # fmt: skip
        slurm.render(job)


def test_a_precision_this_device_refuses_runs_as_fp32_and_says_so():
    from launcher.strategy.deepspeed import cpu_has_fp16

    _, overrides, _, notes = plan(["strategy=deepspeed", "trainer.precision=fp16"])
    if cpu_has_fp16():  # this CPU runs DeepSpeed fp16: kept as it is
        assert "trainer.precision=fp32" not in overrides and notes == []
        return
    assert overrides[-1] == "trainer.precision=fp32"
    (note,) = notes
    assert note.startswith("trainer.precision=fp16 runs as fp32 here: ")


# The rehearsal's front door, in-process (each refused before any case launches): its own
# keys first (the shrunk experiment is computed from them), a sweep, an unknown case or
# flag, a run directory in a wrong form, and the trainer's refusals of the experiment.
FRONT_DOOR = [
    (["rehearse.nproc=0"], "rehearse.nproc=0: must be at least 2 (a killed, hung or slow rank"),
    (["rehearse.nproc=abc"], "rehearse.nproc: Value 'abc' of type 'str' could not be converted"),
    (["rehearse.timeout_s=-1"], "rehearse.timeout_s=-1.0: must be greater than 0"),
    (["rehearse.only=[stpo]"], "rehearse.only: unknown case 'stpo'; the cases are stop,"),
    (["rehearse.only=[cluster]"], "rehearse.only names cluster, but cluster=local renders no"),
    (["+exp=bucket_sweep"], "launcher.rehearse rehearses one experiment, but the overrides"),
    (["--bogus"], "--bogus: not a flag this command takes"),
    (["trainer.precision=fp64"], "trainer.precision=fp64: not one of fp32, bf16, fp16"),
    (["run.id=r", "RUN_DIR_AS_A_FILE"], "r is a file, where the launcher keeps a folder"),
]  # fmt: skip


@pytest.fixture
def own_signal_handlers():
    """The front door installs its stop handlers; the test process gets its own back."""
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in kept.items():
        signal.signal(sig, handler)


@pytest.mark.usefixtures("own_signal_handlers")
@pytest.mark.parametrize(("args", "words"), FRONT_DOOR, ids=[" ".join(a) for a, _ in FRONT_DOOR])
def test_the_front_door_refuses_in_one_line_before_any_case(
    monkeypatch, capsys, tmp_path, args, words
):
    if "RUN_DIR_AS_A_FILE" in args:
        (tmp_path / "r").write_text("not a run directory")
        args = ["run.id=r"]
    monkeypatch.setattr(sys, "argv", ["launcher.rehearse", f"run.root={tmp_path}", *args])
    before = sorted(p.name for p in tmp_path.iterdir())
    assert words in refusal(capsys, rehearse_main)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written
