"""Out of memory, as users meet it, with the default DataLoader (workers on): the
micro-batch that fits found at start (`trainer.micro_batch_size=auto`), a step retried at
half the micro-batch (`trainer.on_oom=retry`), and exit 4 when nothing smaller is left or
the policy is `stop`. The device's OOM error comes from `fault.kind=oom fault.micro_batch=N`
(a device that holds N sequences per micro-batch), so that it is the real error type the
real loop catches.

Exactness: the long run (tests/reference_runs.py) trains at micro-batch 2 (accumulation 2).
A run that ends up at 2 from its first step, by the search or by a retry of step 1, must
reproduce its losses bit for bit: the same sequences per micro-step, summed in the same
order, and nothing of the abandoned attempt kept (its gradients zeroed, no random numbers
drawn). The first 12 steps suffice with the long run's schedule (`lr_decay_steps=60`).
The search and the retry of step 1 are two points of one multirun launch. A retry later in
the run is compared with a resume at the smaller size from the
checkpoint before it: the steps before the retry ran at the larger size, whose sums round
differently, so no launch from the start at the smaller size could match them exactly.
"""

from __future__ import annotations

import json

import pytest

from launcher.resilience import exit_codes

from launch import explain, losses, metrics, summary, sweep_of_points, torchrun
from reference import cut_at
from reference_runs import LONG

FRONT_DOOR = "launcher.torchrun"
# The long run's first 12 steps: its schedule, checkpoints at 20 (none) and the end.
FIRST_12 = [*LONG, "trainer.max_steps=12", "trainer.lr_decay_steps=60"]


@pytest.fixture
def reference(long_run):
    return losses(long_run)


def log_of(run_dir, rank: int) -> str:
    return (run_dir / "logs" / f"rank{rank}.log").read_text()


def test_auto_and_a_retry_of_the_first_step_take_the_size_every_rank_fits(reference, tmp_path):
    """Two points of one multirun launch (the same model, data and seed; each its own job):

    `auto`: rank 1's device holds 2 sequences, rank 0's any: the search tries 4 (the
    per-rank batch), rank 1 runs out, and both take 2; the global batch of 8 stays
    (accumulation 2) and the run is the long run's, exactly.

    `retry`: launched at 4, rank 0 runs out in step 1: both ranks halve to 2 and redo step 1
    from its start (the same sequences, the loader reopened at its window): the long run's
    losses, exactly; the change is in metrics.jsonl, TensorBoard and summary.json."""
    shared = [*FIRST_12, "fault.kind=oom", "fault.micro_batch=2", "logger=tensorboard"]
    points = {
        "auto": [*shared, "trainer.micro_batch_size=auto", "fault.rank=1"],
        "retry": [*shared, "trainer.micro_batch_size=4", "trainer.on_oom=retry", "fault.rank=0"],
    }
    args = sweep_of_points(tmp_path / "conf", points)
    proc = torchrun([*args, f"run.root={tmp_path}", "run.id=m"])
    assert proc.returncode == 0, explain(proc)

    run_dir = tmp_path / "m" / "point=auto"
    assert losses(run_dir) == {s: reference[s] for s in range(1, 13)}
    chose = "trainer.micro_batch_size=auto: 2 sequences per micro-batch fit (tried 4, 2), "
    chose += "2 micro-steps per rank, global batch 8 kept"
    assert chose in log_of(run_dir, 0) and chose in log_of(run_dir, 1)
    records = [r for r in metrics(run_dir) if "loss" in r]
    assert {(r["micro_batch"], r["oom/retries"]) for r in records} == {(2, 0)}
    assert (summary(run_dir)["micro_batch"], summary(run_dir)["tokens"]) == (2, 12 * 8 * 64)
    meta = json.loads((run_dir / "checkpoints" / "step_00000012" / "meta.json").read_text())
    assert (meta["micro_batch"], meta["accum"]) == (2, 2)  # what a resume reads of what ran

    run_dir = tmp_path / "m" / "point=retry"
    assert losses(run_dir) == {s: reference[s] for s in range(1, 13)}
    line = (
        "out of memory in step 1 on rank(s) [0]: micro-batch 4 -> 2, 1 -> 2 micro-steps per "
        "rank (global batch 8 kept); the step is redone from its start (trainer.on_oom=retry)"
    )
    assert line in log_of(run_dir, 0) and line in log_of(run_dir, 1)
    records = [r for r in metrics(run_dir) if "loss" in r]
    assert {(r["micro_batch"], r["oom/retries"]) for r in records} == {(2, 1)}
    from tb_readback import read_runs  # needs tensorboard: imported where it is used

    scalars = read_runs(run_dir)["tb"]["scalars"]  # the sinks get them as the counts are
    assert scalars["micro_batch"] == [(s, 2.0) for s in range(1, 13)]
    assert scalars["oom/retries"] == [(s, 1.0) for s in range(1, 13)]
    s = summary(run_dir)
    assert (s["status"], s["steps"], s["micro_batch"], s["oom/retries"]) == ("completed", 12, 2, 1)
    assert s["replicas_in_sync"] is True


def test_retry_mid_run_redoes_the_step_with_nothing_of_it_kept(tmp_path):
    """Global batch 16 at micro-batch 4 (accumulation 2); from step 5 rank 1 holds only 2.
    In step 5 rank 0 has run a whole micro-step's backward (its gradients accumulated) when
    the ranks agree: they are zeroed, and steps 5-12 at micro-batch 2 equal a launch that
    resumes the step-4 checkpoint at micro-batch 2 directly, bit for bit."""
    shape = [
        *FIRST_12,
        "trainer.global_batch_size=16",
        "trainer.checkpoint_interval=4",
        "trainer.keep_checkpoints=3",
    ]
    fault = ["fault.kind=oom", "fault.rank=1", "fault.step=5", "fault.micro_batch=2"]
    args = [*shape, "trainer.micro_batch_size=4", "trainer.on_oom=retry", *fault]
    proc = torchrun([*args, f"run.root={tmp_path}", "run.id=mid"])
    assert proc.returncode == 0, explain(proc)
    retried = {r["step"]: r for r in metrics(tmp_path / "mid") if "loss" in r}
    assert sorted(retried) == list(range(1, 13))  # step 5 logged once
    assert [retried[s]["micro_batch"] for s in (4, 5)] == [4, 2]
    assert [retried[s]["oom/retries"] for s in (4, 5, 12)] == [0, 1, 1]
    assert "out of memory in step 5 on rank(s) [1]: micro-batch 4 -> 2, 2 -> 4" in proc.stderr

    cut_at(tmp_path / "mid", 4, tmp_path / "direct")
    again = torchrun(
        [*shape, "trainer.micro_batch_size=2", f"run.root={tmp_path}", "run.id=direct"]
    )
    assert again.returncode == 0, explain(again)
    assert losses(tmp_path / "direct") == {s: retried[s]["loss"] for s in range(5, 13)}


SHORT = [*LONG, "trainer.max_steps=2"]
OUT_OF_MEMORY = [
    pytest.param(
        ["trainer.micro_batch_size=auto", "fault.micro_batch=0"],
        "trainer.micro_batch_size=auto: not even a micro-batch of 1 fits (tried 4, 2, 1)",
        id="auto-nothing-fits",
    ),
    pytest.param(
        ["trainer.on_oom=retry", "fault.micro_batch=0"],
        "a micro-batch of 1 does not fit on rank(s) [0] and trainer.on_oom=retry has no "
        "smaller one",
        id="retry-below-1",
    ),
    pytest.param(  # the default policy, with the old line: nothing halved
        ["fault.micro_batch=1"],
        "(injected by fault.kind=oom: a micro-batch of 2 is above fault.micro_batch=1); "
        "no memory snapshot could be written; lower the memory per step",
        id="stop",
    ),
]


@pytest.mark.parametrize(("overrides", "why"), OUT_OF_MEMORY)
def test_out_of_memory_with_nothing_smaller_exits_4(tmp_path, overrides, why):
    args = [*SHORT, "fault.kind=oom", *overrides, f"run.root={tmp_path}", "run.id=x"]
    proc = torchrun(args, runner=FRONT_DOOR)
    assert proc.returncode == exit_codes.OOM, explain(proc)
    errors = [ln for ln in proc.stderr.splitlines() if "ERROR" in ln and "out of memory" in ln]
    rank0 = [ln for ln in errors if "CUDA out of memory on rank 0 in step 1 (" in ln]
    assert len(rank0) == 1 and why in rank0[0], proc.stderr
    assert summary(tmp_path / "x")["status"] == "failed: out of memory"
