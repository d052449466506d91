"""The memory tier (launcher.checkpoint.memory, docs/checkpoints.md): a rank killed between
two durable checkpoints costs at most `trainer.memory_checkpoint_interval` steps after
torchrun's restart, with the uninterrupted run's losses; a memory checkpoint of another run,
world size or lineage is never loaded; an engine that cannot write the tier is refused in
one line.
"""

from __future__ import annotations

import math
import os
import re
import signal
from pathlib import Path

import pytest
import torch

from launcher.checkpoint import memory
from launcher.checkpoint.resume import identity
from launcher.config import ConfigError, compose
from launcher.runtime.process import Runtime
from launcher.train.preflight import check_config, shm_need

from launch import (
    explain,
    finish,
    losses,
    metrics,
    run_dir_of,
    start_torchrun,
    summary,
    torchrun,
    wait_for,
)
from reference_runs import LONG

# -- in process: which memory checkpoints a launch may load -----------------------------------
IDENTITY = {"model": {"name": "m"}, "strategy": {"name": "ddp"}, "world_size": 1}


def runtime(run_dir: Path, run_id: str = "r", world_size: int = 1) -> Runtime:
    return Runtime(0, 0, world_size, torch.device("cpu"), None, run_id=run_id, run_dir=run_dir)


def tier(root: Path, rt: Runtime, lineage: str = "line-a") -> memory.MemoryTier:
    made = memory.MemoryTier(str(root), 2, rt, {**IDENTITY, "world_size": rt.world_size})
    made.follow(lineage)
    return made


def write_step(t: memory.MemoryTier, step: int) -> None:
    t.save(step, lambda folder: (folder / "model.pt").write_bytes(b"x"), {"data_step": step})
    t.complete()


def test_a_launch_loads_only_its_own_runs_memory_checkpoints(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    root, run = tmp_path / "shm", tmp_path / "runs" / "r"
    writer = tier(root, runtime(run))
    write_step(writer, 4)
    write_step(writer, 6)  # keeps the newest one only
    assert sorted(p.name for p in writer.folder.glob("step_*")) == ["step_00000006"]
    assert writer.newest_common("line-a", after=2) == writer.folder / "step_00000006"
    assert writer.newest_common("line-a", after=6) is None  # not newer than the durable one
    assert writer.newest_common("line-b", after=0) is None  # another lineage
    assert tier(root, runtime(run, run_id="other")).usable("line-a") == {}  # another run id
    assert tier(root, runtime(run, world_size=2)).usable("line-a") == {}  # another world size
    elsewhere = tier(root, runtime(tmp_path / "runs" / "r2"))  # another run directory
    assert elsewhere.folder != writer.folder and elsewhere.usable("line-a") == {}
    # Before the first durable checkpoint, only the same launch's (none here: no launch id).
    assert writer.usable(None) == {}
    writer.close(remove=True)
    assert not writer.folder.exists() and not writer.folder.parent.exists()


def test_before_a_durable_checkpoint_only_the_same_launch_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "launch-1")
    root, run = tmp_path / "shm", tmp_path / "runs" / "r"
    write_step(tier(root, runtime(run)), 4)
    assert sorted(tier(root, runtime(run)).usable(None)) == [4]  # a restart of the launch
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "launch-2")
    assert tier(root, runtime(run)).usable(None) == {}  # a later launch of the run directory


def test_a_memory_checkpoint_the_resume_check_refuses_is_skipped(tmp_path):
    """Written by another model shape (a changed config between two launches of the run)."""
    root, run = tmp_path / "shm", tmp_path / "runs" / "r"
    written = tier(root, runtime(run))
    written.writer.meta.update(identity(compose([]), None, 1))
    write_step(written, 4)
    same = tier(root, runtime(run))
    same.identity = identity(compose([]), None, 1)
    assert sorted(same.usable("line-a")) == [4]
    deeper = tier(root, runtime(run))
    deeper.identity = identity(compose(["model.n_layer=4"]), None, 1)
    assert deeper.usable("line-a") == {}


def test_the_interval_default_follows_torchruns_restarts():
    cfg = compose([])
    assert memory.interval(cfg, restarts=0) == 0
    assert memory.interval(cfg, restarts=3) == memory.DEFAULT_INTERVAL == 10
    assert memory.interval(compose(["strategy=fsdp2"]), restarts=3) == 0  # cannot: off
    assert memory.interval(compose(["trainer.memory_checkpoint_interval=0"]), restarts=3) == 0
    # /dev/shm holds the kept checkpoint and the one being written, on top of the loaders'.
    tiered = shm_need(cfg, restarts=3) - shm_need(cfg, restarts=0)
    assert tiered == 2 * memory.state_bytes(cfg) > 0
    elsewhere = compose(["trainer.memory_checkpoint_dir=/tmp/ram"])
    assert shm_need(elsewhere, restarts=3) == shm_need(cfg, restarts=0)


@pytest.mark.parametrize("engine", ["fsdp2", "deepspeed"])
def test_an_engine_without_the_tier_is_refused_in_one_line(engine):
    cfg = compose([f"strategy={engine}", "trainer.memory_checkpoint_interval=5"])
    with pytest.raises(ConfigError) as refused:
        check_config(cfg, 2)
    assert str(refused.value) == (
        f"trainer.memory_checkpoint_interval=5 needs strategy=ddp; strategy={engine} cannot "
        "write the memory tier yet: set trainer.memory_checkpoint_interval=0 (its durable "
        "checkpoints are kept as before)"
    )


# -- launched: SIGKILL between two durable checkpoints -----------------------------------------
def worker_pid(run_dir: Path, rank: int) -> int:
    text = (run_dir / "logs" / f"rank{rank}.log").read_text()
    return int(re.findall(r"pid (\d+)\)", text)[-1])


def test_killed_rank_resumes_from_the_memory_tier(long_run, tmp_path):
    """The long run (durable checkpoints at 20, 40, 60) under torchrun --max-restarts=1, the
    tier at its default (every 10 steps under restarts, in /dev/shm): rank 1 is SIGKILLed as
    soon as step 30's memory checkpoint is sealed. The restart resumes from step 30, not the
    durable 20, and ends with the uninterrupted run's losses, bit for bit."""
    output, root = tmp_path / "out.txt", tmp_path / "runs"
    proc = start_torchrun(
        [*LONG, f"run.root={root}"], output, "--max-restarts=1", runner="torch.distributed.run"
    )
    wait_for(lambda: run_dir_of(root) is not None, proc)
    run_dir = run_dir_of(root)
    sealed = memory.rank_folder("/dev/shm", run_dir, 1) / "step_00000030" / "meta.json"
    wait_for(sealed.exists, proc)
    os.kill(worker_pid(run_dir, 1), signal.SIGKILL)
    out = finish(proc, output)
    assert proc.returncode == 0, out
    log = (run_dir / "logs" / "rank0.log").read_text()
    first, again = log.split("memory tier: step 30 is newer than the durable step_00000020")
    assert "resumed from step 30" in again
    reached = max(int(s) for s in re.findall(r"step (\d+)/60", first))
    assert 30 <= reached <= 30 + memory.DEFAULT_INTERVAL  # the steps the kill lost
    assert losses(run_dir) == losses(long_run)
    assert summary(run_dir)["steps"] == 60
    kept = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
    assert kept == ["step_00000040", "step_00000060"]
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
