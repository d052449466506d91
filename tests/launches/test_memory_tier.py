"""The memory tier launched (launcher.checkpoint.memory, docs/checkpoints.md): a rank killed
between two durable checkpoints costs at most `trainer.memory_checkpoint_interval` steps after
torchrun's restart, with the uninterrupted run's losses (DDP against the long run; FSDP2's
shards and DeepSpeed ZeRO-2's partitions against the strategy sweep's points); a rewind
restores its newer step.
"""

from __future__ import annotations

import math
import os
import re
import signal
from pathlib import Path

import pytest

from launcher.checkpoint import memory

from launch import (
    FAST_USER_LOADER,
    explain,
    finish,
    losses,
    metrics,
    run_dir_of,
    start_torchrun,
    summary,
    torchrun,
    wait_for,
    worker_pid,
)
from reference_runs import LONG, STRATEGY_SCHEDULE, STRATEGY_STEPS


def kill_rank_1_when(args: list[str], root: Path, output: Path, ready) -> tuple[Path, str]:
    """`args` under torchrun --max-restarts=1 with rank 1 SIGKILLed once `ready(run_dir)`
    holds; the run directory and rank 0's log, after the restarted job ended with 0."""
    proc = start_torchrun(args, output, "--max-restarts=1", runner="torch.distributed.run")
    wait_for(lambda: run_dir_of(root) is not None, proc)
    run_dir = run_dir_of(root)
    wait_for(lambda: ready(run_dir), proc)
    os.kill(worker_pid(run_dir, 1), signal.SIGKILL)
    out = finish(proc, output)
    assert proc.returncode == 0, out
    return run_dir, (run_dir / "logs" / "rank0.log").read_text()


def test_killed_rank_resumes_from_the_memory_tier(long_run, tmp_path):
    """The long run (durable checkpoints at 20, 40, 60) under torchrun --max-restarts=1, the
    tier at its default (every 10 steps under restarts, in /dev/shm): rank 1 is SIGKILLed as
    soon as step 30's memory checkpoint is sealed. The restart resumes from step 30, not the
    durable 20, and ends with the uninterrupted run's losses, bit for bit."""
    output, root = tmp_path / "out.txt", tmp_path / "runs"

    def sealed(run_dir: Path) -> bool:  # step 30's memory checkpoint, on the killed rank
        return (memory.rank_folder("/dev/shm", run_dir, 1) / "step_00000030" / "meta.json").exists()

    run_dir, log = kill_rank_1_when([*LONG, f"run.root={root}"], root, output, sealed)
    first, again = log.split("memory tier: step 30 is newer than the durable step_00000020")
    assert "resumed from step 30" in again
    reached = max(int(s) for s in re.findall(r"step (\d+)/60", first))
    assert 30 <= reached <= 30 + memory.DEFAULT_INTERVAL  # the steps the kill lost
    assert losses(run_dir) == losses(long_run)
    assert summary(run_dir)["steps"] == 60
    kept = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
    assert kept == ["step_00000040", "step_00000060"]
    assert not memory.rank_folder("/dev/shm", run_dir, 0).parent.exists()  # freed at the end


@pytest.mark.parametrize("point", ["fsdp2", "zero2"])
def test_a_sharded_engines_killed_rank_resumes_its_shards(point, strategy_sweep, tmp_path):
    """The sweep point's run (durable checkpoints at 10 and 20) under torchrun
    --max-restarts=1 with the default DataLoader and the tier every 5 steps: rank 1 stalls
    as step 17 starts (step 15's memory checkpoint, every rank's own shard, sealed at 16) and
    is SIGKILLed there. The restart resumes from step 15, not the durable 10, and ends with
    the uninterrupted sweep point's losses, bit for bit."""
    output, root = tmp_path / "out.txt", tmp_path / "runs"
    every = 5
    stall = ["fault.kind=stall", "fault.rank=1", "fault.step=17"]
    run = [*FAST_USER_LOADER, *STRATEGY_SCHEDULE, f"strategy={point}", f"run.root={root}"]
    tier = [f"trainer.memory_checkpoint_interval={every}", *stall]
    run_dir, log = kill_rank_1_when(  # fault.rank1 is written as the stall starts
        [*run, *tier], root, output, lambda d: (d / "logs" / "fault.rank1").exists()
    )
    first, again = log.split("memory tier: step 15 is newer than the durable step_00000010")
    assert "resumed from step 15" in again
    reached = max(int(s) for s in re.findall(rf"step (\d+)/{STRATEGY_STEPS}", first))
    assert reached - 15 <= every  # the steps the kill lost
    assert losses(run_dir) == losses(strategy_sweep / f"strategy={point}")
    assert summary(run_dir)["steps"] == STRATEGY_STEPS
    assert not memory.rank_folder("/dev/shm", run_dir, 0).parent.exists()  # freed at the end


def test_a_rewind_restores_the_memory_tiers_newer_step(long_run, tmp_path):
    """trainer.on_nonfinite=rewind with the tier every 2 steps: rank 1's NaN in step 25
    rewinds to step 24's memory checkpoint (sealed first), not the durable step 20, and
    skips only step 25's data window: no step is redone."""
    run = [*LONG, f"run.root={tmp_path}", "run.id=rw", "trainer.memory_checkpoint_interval=2"]
    bad = ["trainer.on_nonfinite=rewind", "fault.kind=nonfinite", "fault.rank=1", "fault.step=25"]
    proc = torchrun([*run, *bad], runner="launcher.torchrun")
    assert proc.returncode == 0, explain(proc)
    assert (
        "rewound to step 24 (step_00000024) after the non-finite step 25; data window 24 is "
        "skipped" in proc.stderr
    )
    reference = losses(long_run)
    got = [r for r in metrics(tmp_path / "rw") if "loss" in r]
    assert [r["step"] for r in got] == [*range(1, 25), *range(25, 61)]  # nothing redone
    assert {r["step"]: r["loss"] for r in got[:24]} == {s: reference[s] for s in range(1, 25)}
    assert all(math.isfinite(r["loss"]) for r in got)
    s = summary(tmp_path / "rw")
    assert (s["status"], s["steps"], s["bad_steps/rewinds"]) == ("completed", 60, 1)
