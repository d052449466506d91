"""Resume on real 2-rank launches, where ranks matter: nothing good is lost.

With the default DataLoader settings (workers, persistent, pinned memory): a refused
incompatible resume, an unloadable explicit resume=<path>, one rank's unreadable file
(all ranks fall back together), on a copy of the shared long run; two launches on one run
directory (the lock) and a stale lock from a killed launch. Every refused or fallback
launch leaves the good checkpoints' bytes as they were. A DeepSpeed ZeRO-2 checkpoint
relaunched as ZeRO-3 is refused in test_deepspeed.py (universal checkpoints). The damage
table of the run directory is tested in-process in test_run_dir_damage.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import signal
import subprocess
from pathlib import Path

from launcher.checkpoint import protocol as checkpoint

from launch import (
    FAST_USER_LOADER,
    explain,
    start_torchrun,
    summary,
    torchrun,
    wait_for,
)
from reference import copy_run
from reference_runs import LONG


def digest(folder: Path, skip=("logs",)) -> dict[str, str]:
    """Every file's hash under `folder`, except the per-rank logs (each launch appends)."""
    return {
        str(p.relative_to(folder)): hashlib.sha1(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.relative_to(folder).parts[0] not in skip
    }


def refused(proc: subprocess.CompletedProcess) -> bool:
    """The launch stopped on bad input: its first worker to end exited with code 2 (torchrun
    then stops the others and itself exits 1)."""
    root_cause = proc.stderr.rpartition("Root Cause")[2]
    codes = re.findall(r"exitcode\s*:\s*(-?\d+)", root_cause)
    return proc.returncode != 0 and codes[:1] == ["2"]


def errors(proc: subprocess.CompletedProcess) -> list[str]:
    """The launcher's own error lines (rank 0 prints one; the others none)."""
    return [ln for ln in proc.stderr.splitlines() if "ERROR launcher: error: " in ln]


def warnings_about(proc: subprocess.CompletedProcess, text: str) -> list[str]:
    return [ln for ln in proc.stderr.splitlines() if "WARNING" in ln and text in ln]


def test_refused_and_fallback_launches_lose_nothing(long_run, tmp_path):
    """A copy of the shared long run (tests/reference_runs.py: finished at 60, checkpoints
    at 40 and 60, the default DataLoader) relaunched: refused with a changed model, refused
    with resume=<its damaged newest checkpoint>, and with resume=auto every rank falls back
    to step 40 together; the refused launches change no byte."""
    run_dir = copy_run(long_run, tmp_path / "r")
    args = [*LONG, f"run.root={tmp_path}", "run.id=r"]
    ckpts = run_dir / "checkpoints"
    before = digest(run_dir)

    # A changed model: one line that says what differs and how to go on; nothing written.
    bigger = torchrun([*args, "trainer.max_steps=70", "model.n_layer=4"])
    assert refused(bigger), explain(bigger)
    (line,) = errors(bigger)
    assert "step_00000060 cannot be resumed with these settings" in line
    assert "model.n_layer is 2 there, 4 now" in line and "run with model.n_layer=2" in line
    assert "resume=archive" in line and "new run.id" in line
    assert digest(run_dir) == before  # checkpoints, metrics, config.yaml, summary

    # One rank's unreadable file in the newest checkpoint (full size, so it looks complete).
    rng1 = ckpts / "step_00000060" / "rng_rank1.pt"
    rng1.write_bytes(b"\0" * rng1.stat().st_size)
    damaged = digest(run_dir)

    # resume=<that checkpoint> cannot be loaded: an error, never a fresh start.
    explicit = torchrun([*args, f"resume={ckpts / 'step_00000060'}", "trainer.max_steps=70"])
    assert refused(explicit), explain(explicit)
    (line,) = errors(explicit)
    assert "could be loaded" in line and "rank 1:" in line and "step_00000060" in line
    assert digest(run_dir) == damaged

    # resume=auto: every rank falls back to step 40 together, with one warning.
    again = torchrun([*args, "trainer.max_steps=62"])
    assert again.returncode == 0, explain(again)
    (warning,) = warnings_about(again, "is unreadable")
    assert "step_00000060" in warning and "rank 1:" in warning and "rank 0:" not in warning
    assert "falling back to the previous one" in warning
    assert "resumed from step 40" in again.stderr
    assert summary(run_dir)["resumed_from_step"] == 40 and summary(run_dir)["steps"] == 62
    # The plan's forecast, calibrated on the run's own earlier launch, is over the 22 steps
    # left (and the checkpoint at 60), not the 62 of trainer.max_steps.
    forecast = summary(run_dir)["forecast"]
    assert forecast["steps"] == 22 and forecast["step_time_s"] > 0
    assert 22 * forecast["step_time_s"] < forecast["time_s"] < 23 * forecast["step_time_s"] + 5
    # The step-60 checkpoint it could not read is kept aside, not overwritten.
    (aside,) = (ckpts / "superseded").iterdir()
    assert digest(aside, skip=()) == {
        k.removeprefix("checkpoints/step_00000060/"): v
        for k, v in damaged.items()
        if k.startswith("checkpoints/step_00000060/")
    }
    assert sorted(p.name for p in ckpts.glob("step_*")) == ["step_00000060", "step_00000062"]
    assert not (run_dir / ".lock").exists()


def kill_launch(proc: subprocess.Popen, run_dir: Path) -> None:
    """SIGKILL a launch: its workers (each in a session of its own, with its DataLoader
    workers) and torchrun."""
    for rank in (0, 1):
        log = run_dir / "logs" / f"rank{rank}.log"
        for pid in re.findall(r"pid (\d+)\)", log.read_text() if log.exists() else ""):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(pid), signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def newest_resumable(folder: Path) -> int:
    """The step a relaunch resumes from after a kill: the newest complete checkpoint (a kill
    between sealing one and moving `latest` to it leaves `latest` a step behind), or a save
    whose every rank had written its files when the kill came before its seal (the relaunch
    seals it first)."""
    found = checkpoint.scan(folder)
    sealable = [
        checkpoint.parse_step(p.name.removeprefix(checkpoint.TMP_PREFIX))
        for p in found.leftovers
        if p.is_dir() and checkpoint.unsealed_problem(p) is None
    ]
    return max([checkpoint.step_of(found.complete[0]), *sealable])


def test_one_launch_per_run_directory(tmp_path):
    """A second launch on a run directory in use stops with one line naming the holder;
    once the holder is killed, its stale lock is taken over with one warning."""
    args = [*FAST_USER_LOADER, f"run.root={tmp_path}", "run.id=busy"]
    run_dir = tmp_path / "busy"
    long = [*args, "trainer.max_steps=100000", "trainer.checkpoint_interval=5"]
    holder = start_torchrun(long, tmp_path / "a.txt", runner="torch.distributed.run")
    try:
        wait_for(lambda: (run_dir / "checkpoints" / "latest").exists(), holder)
        config = (run_dir / "config.yaml").read_bytes()
        second = torchrun([*args, "trainer.max_steps=10"])
        assert refused(second), explain(second)
        (line,) = errors(second)
        assert "is in use by another launch (pid " in line and "another run.id" in line
        assert holder.poll() is None  # the holder runs on, undisturbed
        assert (run_dir / "config.yaml").read_bytes() == config
        assert "trainer.max_steps=10" not in (run_dir / "logs" / "rank0.log").read_text()
    finally:  # a crash of the whole launch: the lock stays behind
        kill_launch(holder, run_dir)
    assert (run_dir / ".lock").exists()
    step = newest_resumable(run_dir / "checkpoints")
    after = torchrun([*args, f"trainer.max_steps={step + 2}"])
    assert after.returncode == 0, explain(after)
    (warning,) = warnings_about(after, "took over the lock")
    assert "is no longer running" in warning
    assert f"resumed from step {step}" in after.stderr
    assert not (run_dir / ".lock").exists()
