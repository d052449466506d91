"""Every signal a scheduler or a person sends to `python -m launcher.torchrun` (real
launches: 2 CPU ranks, the default DataLoader with its worker processes).

The stop signals (Slurm's warnings SIGUSR1/SIGUSR2, SIGHUP; SIGTERM and SIGINT are in
test_faults.py) are forwarded to every rank: one stop checkpoint, exit 143. SIGQUIT ends
the ranks at once. Either way no rank or loader worker outlives the front door for long,
and the run directory's lock goes with the process that held it.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from launcher.resilience import exit_codes

from launch import (
    FAST_USER_LOADER,
    checkpointed,
    explain,
    finish,
    none_left,
    start_torchrun,
    summary,
    torchrun,
    wait_for,
)

LONG = [
    *FAST_USER_LOADER,
    "trainer.max_steps=400",
    "trainer.checkpoint_interval=2",
    "trainer.eval_interval=0",
]
# A loader worker checks for its parent's death every 5 s (torch's MP_STATUS_CHECK_INTERVAL).
ORPHANS_GONE_S = 15


STOPS = [signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP]


@pytest.mark.parametrize("sig", STOPS, ids=lambda s: s.name)
def test_a_stop_signal_to_the_front_door_stops_every_rank_with_a_checkpoint(tmp_path, sig):
    output = tmp_path / "out.txt"
    root = tmp_path / "runs"
    proc = start_torchrun([*LONG, f"run.root={root}", "run.id=sig"], output)
    wait_for(checkpointed(root, 2), proc)
    os.kill(proc.pid, sig)
    out = finish(proc, output)
    assert proc.returncode == exit_codes.STOPPED, out
    assert f"received {sig.name}" in out and "Traceback" not in out, out
    run = root / "sig"
    s = summary(run)
    assert s["status"] == "stopped"
    assert (run / "checkpoints" / "latest").read_text().strip() == f"step_{s['steps']:08d}"
    assert none_left(root, 2) == []  # every rank and loader worker ended with the front door
    assert not (run / ".lock").exists()


def test_sigquit_ends_every_rank_and_the_next_launch_resumes(tmp_path):
    output = tmp_path / "out.txt"
    root = tmp_path / "runs"
    args = [*LONG, f"run.root={root}", "run.id=quit"]
    proc = start_torchrun(args, output)
    wait_for(checkpointed(root, 4), proc)
    os.kill(proc.pid, signal.SIGQUIT)
    sent = time.monotonic()
    out = finish(proc, output)
    print(f"front door ended {time.monotonic() - sent:.1f} s after SIGQUIT")
    assert proc.returncode == exit_codes.CRASH, out  # no checkpoint was promised: retry
    assert "stopped by SIGQUIT" in out, out
    assert none_left(root, ORPHANS_GONE_S) == []
    print(f"every process gone {time.monotonic() - sent:.1f} s after SIGQUIT")
    assert (root / "quit" / ".lock").exists()  # left by the killed rank 0: taken over below
    latest = int((root / "quit" / "checkpoints" / "latest").read_text().strip()[5:])
    again = torchrun([*args, f"trainer.max_steps={latest + 2}"], runner="launcher.torchrun")
    assert again.returncode == 0, explain(again)
    assert f"resumed from step {latest}" in again.stderr


def test_a_stop_that_cannot_reach_a_step_boundary_in_time_says_why(tmp_path):
    """Rank 0 is busy (a stall standing in for a first compile) when the stop comes, and
    torchrun's shutdown wait is 3 s: the ranks are killed without a stop checkpoint, and
    the front door says so and how to give such a stop more time."""
    output = tmp_path / "out.txt"
    root = tmp_path / "runs"
    args = [*LONG, f"run.root={root}", "run.id=busy", "fault.kind=stall", "fault.rank=0",
            "fault.step=5", "fault.seconds=60"]  # fmt: skip
    proc = start_torchrun(args, output, "--shutdown-timeout=3")
    wait_for(lambda: (root / "busy" / "logs" / "fault.rank0").exists(), proc)
    os.kill(proc.pid, signal.SIGTERM)
    out = finish(proc, output)
    assert proc.returncode == exit_codes.STOPPED_NO_CHECKPOINT, out
    (line,) = [ln for ln in out.splitlines() if "no stop checkpoint" in ln]
    assert "--shutdown-timeout" in line and "after SIGTERM" in line, line
    assert "resumes from the last complete checkpoint" in line
    assert none_left(root, ORPHANS_GONE_S) == []
    assert (root / "busy" / "checkpoints" / "step_00000004").is_dir()  # the one to resume
