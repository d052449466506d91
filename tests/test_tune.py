"""launcher.tune: tuning rounds inside one torchrun launch, from planted slow starting
points to a measured, confirmed speed-up, and the winner written back as an experiment.

The launches plant big effects (several times the step time) so that the decisions hold on
a busy two-core machine: a data source with a high latency read without workers together
with accumulation far beyond need; tiny DDP buckets; and a single process with nothing to
fix. The pure logic (candidates, the keep/reject rule, tuned.yaml) is tested without
launches.
"""

from __future__ import annotations

import json
import os
import signal

import pytest
from omegaconf import OmegaConf

from launcher.config import ConfigError, compose, normalize
from launcher.submit.__main__ import main as submit_main
from launcher.tune.__main__ import check
from launcher.tune.candidates import propose
from launcher.tune.decision import Measured, Trial, best, judge
from launcher.tune.report import write_tuned_yaml

from launch import base_env, explain, finish, losses, start, summary, torchrun_cmd, wait_for
from wandb_readback import private_wandb_env, records

TUNE_TIMEOUT = 420
SMALL = [
    "trainer.seq_len=64",
    "data.max_bytes=400000",
    "data.bpe_vocab_size=512",
    "tune.trial_steps=7",  # 3 warm-up steps, 4 timed
    "tune.repeats=2",
    "tune.confirm_steps=12",
    "tune.min_gain=0.2",  # a busy shared machine: only big gains count here
]


def tune_launch(args: list[str], *, nproc: int = 2, env=None):
    import subprocess

    cmd = torchrun_cmd(args, nproc=nproc, module="launcher.tune")
    return subprocess.run(
        cmd, env=env or base_env(), capture_output=True, text=True, timeout=TUNE_TIMEOUT
    )


def report(run_dir):
    return json.loads((run_dir / "tune" / "report.json").read_text())


def cfg_of(*overrides: str, world: int = 2):
    cfg = compose(list(overrides))
    normalize(cfg, world)
    return cfg


# The pure logic


def test_candidates_follow_the_evidence_and_only_it():
    cfg = cfg_of("data.num_workers=0", "data.persistent_workers=false")
    names = [c.name for c in propose([{"kind": "data_wait"}], cfg, 2, gpu=False)]
    assert names == ["data.num_workers=2"]  # pinning only matters with a GPU
    gpu_cfg = cfg_of("data.pin_memory=false")
    assert [c.name for c in propose([{"kind": "data_wait"}], gpu_cfg, 2, gpu=True)] == [
        "data.num_workers=4",
        "data.pin_memory=true",
    ]
    tiny = cfg_of("strategy.bucket_cap_mb=0.0005", "strategy.static_graph=true")
    comm = propose([{"kind": "exposed_comm"}], tiny, 2, gpu=False)
    assert [c.name for c in comm] == [
        "strategy.bucket_cap_mb=0.002",
        "strategy.bucket_cap_mb=25",
        "strategy.comm_hook=bf16",  # static_graph is already on: not proposed again
    ]
    assert [c.changes_math for c in comm] == [False, False, True]
    # Memory knobs only from memory pressure; micro-batches keep the global batch.
    accum = cfg_of("trainer.micro_batch_size=1", "trainer.global_batch_size=16")
    assert not any("grad_checkpointing" in c.name for c in propose([], accum, 2, gpu=False))
    more = propose([{"kind": "accumulation"}], accum, 2, gpu=False)
    assert [c.name for c in more] == ["trainer.micro_batch_size=4", "trainer.micro_batch_size=8"]
    assert all(c.changes_math for c in more)
    mem = propose([{"kind": "memory_pressure"}], cfg_of(), 2, gpu=True)
    assert [c.name for c in mem] == [
        "trainer.grad_checkpointing=true",
        "trainer.micro_batch_size=2",
    ]
    skip = cfg_of("strategy.bucket_cap_mb=0.0005", "tune.skip=[strategy.comm_hook]")
    assert "strategy.comm_hook=bf16" not in [
        c.name for c in propose([{"kind": "exposed_comm"}], skip, 2, gpu=False)
    ]
    assert propose([{"kind": "syncs"}], cfg, 2, gpu=False) == []  # no knob for it
    # Memory-bound kernels: compile; compiled already, the native GPT-2 (loss compiled too).
    fuse = propose([{"kind": "memory_bound"}], cfg_of("model.impl=hf"), 2, gpu=True)
    assert [c.name for c in fuse] == ["trainer.compile=default"]
    compiled = cfg_of("model.impl=hf", "trainer.compile=default")
    assert [c.name for c in propose([{"kind": "memory_bound"}], compiled, 2, gpu=True)] == [
        "model.impl=native"
    ]
    native = cfg_of("trainer.compile=default")  # native is the default
    assert propose([{"kind": "memory_bound"}], native, 2, gpu=True) == []
    bf16 = cfg_of("trainer.precision=bf16")
    attention = [c.name for c in propose([{"kind": "attention"}], bf16, 2, gpu=True)]
    assert attention == ["model.attention=cudnn", "model.attention=flash"]
    chose = cfg_of("trainer.precision=bf16", "model.attention=cudnn")
    assert [c.name for c in propose([{"kind": "attention"}], chose, 2, gpu=True)] == [
        "model.attention=flash"
    ]
    assert propose([{"kind": "attention"}], cfg_of("trainer.precision=fp32"), 2, gpu=True) == []
    assert propose([{"kind": "attention"}], bf16, 2, gpu=False) == []


def measured(*p50s: float, loss: float = 6.0) -> Measured:
    return Measured(
        [
            Trial(f"t{i}", "completed", p50, p50 * 1.1, 1000 / p50, loss)
            for i, p50 in enumerate(p50s)
        ]
    )


RULE = {"loss_tolerance": 0.01, "min_gain": 0.05, "noise_multiple": 1.0}


def test_keep_only_what_beats_the_noise_within_the_loss_tolerance():
    inc = measured(0.100, 0.110)  # spread 10 ms
    clear = judge(inc, measured(0.050, 0.052), changes_math=False, **RULE)
    noisy = judge(inc, measured(0.098, 0.100), changes_math=False, **RULE)
    slower = judge(inc, measured(0.200, 0.210), changes_math=False, **RULE)
    assert clear.better and "(2.06x)" in clear.reason
    assert not noisy.better and "within the noise" in noisy.reason
    assert not slower.better and "slower" in slower.reason
    # A gain bigger than the noise but below min_gain is not worth a change.
    steady = measured(0.100, 0.1001)
    small = judge(steady, measured(0.097, 0.0971), changes_math=False, **RULE)
    assert not small.better and "min_gain" in small.reason
    # Changing the math: the loss must stay within the tolerance of the incumbent's.
    drifted = judge(inc, measured(0.05, 0.05, loss=6.5), changes_math=True, **RULE)
    assert not drifted.better and "tune.loss_tolerance=0.01" in drifted.reason
    same_math = judge(inc, measured(0.05, 0.05, loss=6.5), changes_math=False, **RULE)
    assert same_math.better  # the loss is checked only where the math changes
    failed = Measured([Trial("t0", "exit 4 (out of memory)")])
    assert not judge(inc, failed, changes_math=False, **RULE).better
    assert best({"a": clear, "b": noisy}) == "a" and best({"b": noisy}) is None


def test_tuned_yaml_composes_the_winner(tmp_path):
    user = ["profiler=steps", "trainer.micro_batch_size=1", "data.num_workers=0", "run.id=x"]
    user += ["tune.repeats=5", "data.persistent_workers=false"]
    kept = {"trainer.micro_batch_size": 8, "strategy.bucket_cap_mb": 25.0}
    (tmp_path / "tune").mkdir()
    write_tuned_yaml(tmp_path / "tune" / "tuned.yaml", user, kept, tmp_path)
    fresh = compose([f"hydra.searchpath=[file://{tmp_path}]", "+tune=tuned"])
    winner = compose(
        ["profiler=steps", "trainer.micro_batch_size=8", "data.num_workers=0"]
        + ["data.persistent_workers=false", "strategy.bucket_cap_mb=25"]
    )
    assert OmegaConf.to_container(fresh) == OmegaConf.to_container(winner)


def test_bad_input_is_refused_before_anything_starts():
    with pytest.raises(ConfigError, match=r"tune.repeats=1: must be at least 2"):
        check(["tune.repeats=1"])
    with pytest.raises(ConfigError, match="tunes one experiment"):
        check(["+exp=bucket_sweep"])


def test_submit_renders_the_tuner_on_every_node(tmp_path, capfd):
    args = ["cluster.nodes=2", f"run.root={tmp_path}", "run.id=t", "trainer.global_batch_size=64"]
    assert submit_main(["slurm", "--dry-run", "--tune", *args]) == 0
    script = (tmp_path / "t" / "submit" / "job.sbatch").read_text()
    assert "-m launcher.tune" in script and "launcher.train" not in script
    assert submit_main(["k8s", "--dry-run", "--tune", *args, "run.id=k"]) == 0
    manifests = "".join(p.read_text() for p in (tmp_path / "k" / "submit").iterdir())
    assert "launcher.tune" in manifests and "launcher.train" not in manifests
    assert submit_main(["slurm", "--dry-run", "--tune", *args, "+exp=bucket_sweep"]) == 2
    assert "tunes one experiment" in capfd.readouterr().err


# Real launches


def test_bad_tune_key_is_one_line_exit_2_before_the_process_group(tmp_path):
    proc = tune_launch([*SMALL, f"run.root={tmp_path}", "tune.loss_tolerance=-1"], nproc=1)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert proc.returncode != 0 and len(errors) == 1, explain(proc)
    assert "tune.loss_tolerance=-1.0: must be 0 or more" in errors[0]
    assert "process group created" not in proc.stderr and not list(tmp_path.iterdir())


@pytest.fixture(scope="module")
def slow_start(tmp_path_factory):
    """Slow storage read without workers, and 4 micro-batches of 1 per rank and step."""
    root = tmp_path_factory.mktemp("tune")
    args = [*SMALL, f"run.root={root}", "run.id=slow", "tune.max_rounds=2"]
    args += ["trainer.global_batch_size=8", "trainer.micro_batch_size=1"]
    args += ["data.num_workers=0", "data.persistent_workers=false"]
    args += ["fault.kind=slow_data", "fault.seconds=0.06"]
    args += ["tune.skip=[strategy.bucket_cap_mb,strategy.comm_hook]"]
    args += ["logger=wandb", "logger.mode=offline"]
    proc = tune_launch(args, env=base_env(**private_wandb_env(root)))
    assert proc.returncode == 0, explain(proc)
    return root / "slow", args, proc


def test_rounds_find_the_planted_changes_and_confirm_the_speedup(slow_start):
    run_dir, _, proc = slow_start
    assert proc.stderr.count("process group created") == 1, explain(proc)
    rep = report(run_dir)
    first = rep["rounds"][0]
    assert {a["kind"] for a in first["evidence"]} >= {"data_wait", "accumulation"}
    assert rep["kept"]["trainer.micro_batch_size"] > 1
    assert rep["kept"]["data.num_workers"] >= 2
    for r in rep["rounds"]:
        inc = r["incumbent"]
        assert inc["step_time_p50_spread_s"] is not None and len(inc["trials"]) == 2
        kept = [c for c in r["candidates"] if c["verdict"] == "kept"]
        assert len(kept) == 1 and kept[0]["name"] == r["kept"]
        assert kept[0]["step_time_p50_s"] < inc["step_time_p50_s"]
    (first_kept,) = [c for c in first["candidates"] if c["verdict"] == "kept"]
    assert rep["rounds"][1]["incumbent_changes"] == first_kept["changes"]
    confirm = rep["confirmation"]
    assert confirm["steps"] == 12 and confirm["speedup"] > 2.0, confirm
    md = (run_dir / "tune" / "report.md").read_text()
    assert f"**{confirm['speedup']:.2f}x faster per step**" in md and "| 2 |" in md
    assert (run_dir / "tune" / "step_time.png").read_bytes()[:4] == b"\x89PNG"
    # Every trial started from the same weights and data: the losses of the first step agree.
    trials = run_dir / "tune" / "trials"
    firsts = {
        round(min(losses(d).items())[1], 4)
        for d in trials.iterdir()
        if (d / "metrics.jsonl").exists()
    }
    assert len(firsts) == 1


def test_tune_report_goes_to_wandb(slow_start):
    run_dir, _, _ = slow_start
    found = [
        p
        for p in (run_dir / "wandb").glob("offline-run-*")
        if any(r.get("run", {}).get("job_type") == "tune_report" for r in records(p, run_dir))
    ]
    assert len(found) == 1
    (hist,) = [r["history"] for r in records(found[0], run_dir) if r["type"] == "history"]
    assert hist["item"]["tune_report._type"] == "table-file"
    assert hist["item"]["tune_plot._type"] == "image-file"
    table = json.loads((found[0] / "files" / hist["item"]["tune_report.path"]).read_text())
    assert [row[0] for row in table["data"]] == [1, 2]


def test_tuned_yaml_reproduces_the_winner_in_a_fresh_launch(slow_start, tmp_path):
    import subprocess

    run_dir, args, _ = slow_start
    base = [a for a in args if not a.startswith(("tune.", "run.", "logger"))]
    fresh = [f"hydra.searchpath=[file://{run_dir}]", "+tune=tuned", f"run.root={tmp_path}"]
    fresh += ["run.id=fresh", "trainer.max_steps=8", "trainer.log_interval=1"]
    fresh += ["trainer.eval_interval=0", "trainer.checkpoint_interval=0"]
    cmd = torchrun_cmd(fresh, nproc=2)
    proc = subprocess.run(cmd, env=base_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, explain(proc)
    used = OmegaConf.load(tmp_path / "fresh" / "config.yaml")
    winner = OmegaConf.load(run_dir / "tune" / "trials" / "confirm-winner" / "config.yaml")
    for key in [*report(run_dir)["kept"], *(a.split("=")[0] for a in base)]:
        assert OmegaConf.select(used, key) == OmegaConf.select(winner, key), key
    baseline = summary(run_dir / "tune" / "trials" / "confirm-baseline")["step_time_s/p50"]
    assert summary(tmp_path / "fresh")["step_time_s/p50"] < baseline / 2


def test_tiny_buckets_kept_bigger_and_compression_rejected_for_its_loss(tmp_path):
    """18 buckets of gpt2-tiny's 0.3M parameters: 18 all-reduces per step where one does,
    around a small step (one sequence of 32 tokens per rank)."""
    args = [a for a in SMALL if not a.startswith(("trainer.seq_len", "tune.trial_steps"))]
    args += [f"run.root={tmp_path}", "run.id=buckets", "tune.max_rounds=1"]
    args += ["trainer.seq_len=32", "trainer.global_batch_size=2", "trainer.micro_batch_size=1"]
    args += ["strategy.bucket_cap_mb=0.0005", "tune.loss_tolerance=0"]
    # Steps of a few ms: the median of 10 timed steps, not 4, so that one late wake-up on a
    # busy machine does not widen the measured noise past a 2.8x gain (a CI run kept nothing).
    args += ["tune.skip=[data.num_workers]", "tune.trial_steps=13"]
    proc = tune_launch(args)
    assert proc.returncode == 0, explain(proc)
    rep = report(tmp_path / "buckets")
    (r,) = rep["rounds"]
    assert "exposed_comm" in {a["kind"] for a in r["evidence"]}
    assert rep["kept"] == {"strategy.bucket_cap_mb": 25.0}
    hook = next(c for c in r["candidates"] if c["name"] == "strategy.comm_hook=bf16")
    assert hook["verdict"] == "rejected" and "tune.loss_tolerance=0" in hook["reason"]
    assert rep["confirmation"]["speedup"] > 1.5


def test_nothing_to_fix_ends_after_one_round_saying_so(tmp_path):
    args = [*SMALL, f"run.root={tmp_path}", "run.id=fine"]
    args += ["trainer.global_batch_size=4", "trainer.micro_batch_size=4"]
    proc = tune_launch(args, nproc=1)
    assert proc.returncode == 0, explain(proc)
    rep = report(tmp_path / "fine")
    assert len(rep["rounds"]) == 1 and rep["kept"] == {} and rep["confirmation"] is None
    assert rep["ended_because"].startswith(("nothing to fix", "no candidate beat"))
    assert "No change kept" in (tmp_path / "fine" / "tune" / "report.md").read_text()
    tuned = OmegaConf.load(tmp_path / "fine" / "tune" / "tuned.yaml")
    assert tuned.trainer.micro_batch_size == 4 and "strategy" not in tuned


def test_stop_during_tuning_writes_the_report_so_far_and_exits_143(tmp_path):
    args = [*SMALL, f"run.root={tmp_path}", "run.id=stop", "tune.trial_steps=30"]
    args += ["trainer.global_batch_size=16", "trainer.micro_batch_size=1"]
    # With the default loader workers: every trial starts new ones, and a SIGTERM while one
    # starts must not kill it (launcher.data.loader.stop_signals_held).
    cmd = torchrun_cmd(args, module="launcher.tune", runner="launcher.torchrun")
    output = tmp_path / "out.txt"
    proc = start(cmd, output)
    trials = tmp_path / "stop" / "tune" / "trials"
    wait_for(lambda: (trials / "r1-profile" / "metrics.jsonl").exists(), proc)  # it steps
    os.kill(proc.pid, signal.SIGTERM)
    out = finish(proc, output)
    assert proc.returncode == 143, out
    rep = report(tmp_path / "stop")
    assert rep["stopped"] and rep["ended_because"] == "stopped on request" and not rep["kept"]
    assert rep["confirmation"] is None and len(rep["rounds"]) == 1
    assert summary(trials / "r1-profile")["status"] == "stopped"  # at a step boundary
