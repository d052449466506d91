"""launcher.tune's pure logic: candidates follow the analyser's evidence, the keep/reject rule
against the noise and the loss tolerance, tuned.yaml, bad input, and the submitted tuner."""

from __future__ import annotations

import sys

import pytest
from omegaconf import OmegaConf

from launcher.config import ConfigError, compose, normalize
from launcher.submit.__main__ import main as submit_main
from launcher.tune.__main__ import check
from launcher.tune.__main__ import main as tune_main
from launcher.tune.candidates import propose
from launcher.tune.decision import Measured, Trial, best, judge
from launcher.tune.report import write_tuned_yaml


def cfg_of(*overrides: str, world: int = 2):
    cfg = compose(list(overrides))
    normalize(cfg, world)
    return cfg


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
    # bucket sizes come from the plan and a measured run (tests/unit/plan/test_comm.py)
    assert [c.name for c in comm] == [
        "strategy.comm_hook=bf16",  # static_graph is already on: not proposed again
    ]
    assert [c.changes_math for c in comm] == [True]
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
    user += ["tune.repeats=5", "data.persistent_workers=false", "fault.kind=slow_data"]
    kept = {"trainer.micro_batch_size": 8, "strategy.bucket_cap_mb": 25.0}
    (tmp_path / "tune").mkdir()
    write_tuned_yaml(tmp_path / "tune" / "tuned.yaml", user, kept, tmp_path)
    fresh = compose([f"hydra.searchpath=[file://{tmp_path}]", "+tune=tuned"])
    winner = compose(
        ["profiler=steps", "trainer.micro_batch_size=8", "data.num_workers=0"]
        + ["data.persistent_workers=false", "strategy.bucket_cap_mb=25"]
    )
    assert OmegaConf.to_container(fresh) == OmegaConf.to_container(winner)  # no fault.* kept


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


def test_each_trial_says_which_of_how_many_and_about_how_long_is_left(caplog):
    import logging

    from launcher.tune.trials import Trials

    caplog.set_level(logging.INFO, logger="launcher")
    trials = Trials([], budget_s=3600)
    trials.plan("round 1", 3)
    for label in ("r1-incumbent-1", "r1-x-1", "r1-incumbent-2"):
        trials.announce(label)
    said = [r.getMessage() for r in caplog.records]
    assert said[0].startswith("tune: round 1, trial 1 of 3 (r1-incumbent-1); 0:0")
    assert "left" not in said[0]  # nothing measured yet to estimate from
    assert said[2].startswith("tune: round 1, trial 3 of 3 (r1-incumbent-2); ")
    assert said[2].endswith(" left in it")


# The tuner's front door, in-process (each refused before any process group or trial): its
# own keys' ranges and choices, a sweep, a typo in tune.skip, an unknown flag, a run
# directory in a wrong form, and the trainer's own refusals through it.
FRONT_DOOR = [
    (["tune.repeats=1"], "tune.repeats=1: must be at least 2 (one trial cannot measure noise)"),
    (["tune.budget_s=nan"], "tune.budget_s=nan: must be a finite number greater than 0"),
    (["tune.noise_multiple=-1"], "tune.noise_multiple=-1.0: must be 0 or more"),
    (["tune.loss_tolerance=inf"], "tune.loss_tolerance=inf: must be a finite number 0 or more"),
    (["tune.trial_steps=2"], "tune.trial_steps=2: must be at least 4"),
    (["tune.skip=[data.num_wrkers]"], "tune.skip: data.num_wrkers is not a key of this "
     "experiment's config (did you mean data.num_workers?)"),
    (["+tune.foo=1"], "tune.foo: unknown key"),
    (["+exp=bucket_sweep"], "launcher.tune tunes one experiment, but the overrides sweep"),
    (["--bogus"], "--bogus: not a flag of this command; give overrides as key=value"),
    (["trainer.max_steps=0"], "trainer.max_steps=0: must be at least 1"),
    (["run.id=r", "RUN_DIR_AS_A_FILE"], "r is a file, where the launcher keeps a folder"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "words"), FRONT_DOOR, ids=[" ".join(a) for a, _ in FRONT_DOOR])
def test_the_front_door_refuses_in_one_line_before_anything_starts(
    monkeypatch, capsys, tmp_path, args, words
):
    if "RUN_DIR_AS_A_FILE" in args:
        (tmp_path / "r").write_text("not a run directory")
        args = ["run.id=r"]
    argv = ["launcher.tune", f"run.root={tmp_path}", *args]
    monkeypatch.setattr(sys, "argv", argv)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(SystemExit) as exit_info:
        tune_main()
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and err.count("\n") == 0, err
    assert err.startswith("error: ") and words in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written
