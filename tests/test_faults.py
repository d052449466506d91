"""Faults: a killed worker, SIGTERM, a non-finite loss, an unreadable checkpoint.

Each case ends in a run whose final loss equals an uninterrupted run's, or stops with
a clear error and leaves the last good checkpoint untouched.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from launch import (
    FAST,
    LAUNCH_TIMEOUT,
    base_env,
    explain,
    losses,
    summary,
    torchrun,
    torchrun_cmd,
)

# Long enough (60 steps) that a test can act between the step-20 checkpoint and the end.
LONG = [
    *FAST,
    "trainer.max_steps=60",
    "trainer.checkpoint_interval=20",
    "trainer.eval_interval=1000",
]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("reference")
    proc = torchrun([*LONG, f"run.root={root}", "run.id=ref"])
    assert proc.returncode == 0, explain(proc)
    return losses(root / "ref")


def start(cmd: list[str], output) -> subprocess.Popen:
    """Output goes to a file: an unread pipe fills up and blocks the launch."""
    out = open(output, "w")  # noqa: SIM115 - the child holds it; closed with the test
    return subprocess.Popen(
        cmd, env=base_env(), stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def start_torchrun(overrides, output, *extra_args) -> subprocess.Popen:
    return start(torchrun_cmd(overrides, extra_args=extra_args), output)


def wait_for(predicate, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"launch ended early (exit {proc.returncode})")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError("timed out waiting")
        time.sleep(0.02)


def finish(proc: subprocess.Popen, output) -> str:
    try:
        proc.wait(timeout=LAUNCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    return output.read_text()


def run_dir_of(root):
    dirs = [p for p in root.iterdir() if p.is_dir()] if root.is_dir() else []
    return dirs[0] if len(dirs) == 1 else None


def checkpointed(root, step: int):
    def check():
        run = run_dir_of(root)
        latest = run and run / "checkpoints" / "latest"
        return bool(latest and latest.exists() and int(latest.read_text().strip()[5:]) >= step)

    return check


def worker_pid(run_dir, rank: int) -> int:
    text = (run_dir / "logs" / f"rank{rank}.log").read_text()
    return int(re.findall(r"pid (\d+)\)", text)[-1])


def test_killed_worker_restarts_and_resumes(reference, tmp_path):
    output = tmp_path / "out.txt"
    root = tmp_path / "runs"
    proc = start_torchrun([*LONG, f"run.root={root}"], output, "--max-restarts=1")
    wait_for(checkpointed(root, 20), proc)
    run_dir = run_dir_of(root)
    os.kill(worker_pid(run_dir, 1), signal.SIGKILL)
    out = finish(proc, output)
    assert proc.returncode == 0, out
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert "resumed from step" in log  # the restarted group found the same run directory
    assert summary(run_dir)["steps"] == 60
    assert losses(run_dir) == reference  # every logged step, including the redone ones
    kept = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
    assert kept == ["step_00000040", "step_00000060"]  # trainer.keep_checkpoints=2


def test_sigterm_checkpoints_then_resume_finishes(reference, tmp_path):
    output = tmp_path / "out.txt"
    args = [*LONG, f"run.root={tmp_path}", "run.id=preempted"]
    proc = start_torchrun(args, output)
    wait_for(checkpointed(tmp_path, 20), proc)
    os.kill(proc.pid, signal.SIGTERM)  # what Slurm and Kubernetes do to the launcher
    out = finish(proc, output)
    run_dir = tmp_path / "preempted"
    s = summary(run_dir)
    assert s["status"] == "stopped", out
    stop_step = s["steps"]
    assert 20 <= stop_step < 60
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"step_{stop_step:08d}"
    for rank in (0, 1):
        assert "ended with code 143" in (run_dir / "logs" / f"rank{rank}.log").read_text()
    again = torchrun(args)
    assert again.returncode == 0, explain(again)
    assert f"resumed from step {stop_step}" in again.stderr
    assert losses(run_dir) == reference


def test_sigterm_single_process_exit_code(tmp_path):
    output = tmp_path / "out.txt"
    cmd = [sys.executable, "-m", "launcher.train", *LONG, f"run.root={tmp_path}", "run.id=solo"]
    proc = start(cmd, output)
    wait_for(lambda: (tmp_path / "solo" / "metrics.jsonl").exists(), proc)
    proc.send_signal(signal.SIGTERM)
    finish(proc, output)
    assert proc.returncode == 143
    assert summary(tmp_path / "solo")["status"] == "stopped"


def test_nonfinite_loss_stops_and_keeps_the_good_checkpoint(tmp_path):
    proc = torchrun(
        [
            *FAST,
            f"run.root={tmp_path}",
            "run.id=nan",
            "trainer.lr=1e6",
            "trainer.grad_clip=0",
            "trainer.warmup_steps=1",
            "trainer.checkpoint_interval=1",
        ]
    )
    assert proc.returncode != 0
    errors = [ln for ln in proc.stderr.splitlines() if "non-finite loss" in ln and "ERROR" in ln]
    assert len(errors) == 1, proc.stderr  # one line, on rank 0
    ckpts = tmp_path / "nan" / "checkpoints"
    latest = (ckpts / "latest").read_text().strip()
    assert latest in errors[0]
    s = summary(tmp_path / "nan")
    assert s["status"] == "failed: non-finite loss"
    assert latest == f"step_{s['steps'] - 1:08d}"  # saved before the bad step, never after
    import torch

    state = torch.load(ckpts / latest / "model.pt", weights_only=True)
    assert all(torch.isfinite(t).all() for t in state.values())


def test_unreadable_latest_falls_back_to_previous(reference, tmp_path):
    """A corrupt (but full-size) latest checkpoint: warn, load the previous, redo the steps."""
    args = [*LONG, f"run.root={tmp_path}", "run.id=c", "trainer.lr_decay_steps=60"]
    first = torchrun([*args, "trainer.max_steps=40"])
    assert first.returncode == 0, explain(first)
    model = tmp_path / "c" / "checkpoints" / "step_00000040" / "model.pt"
    model.write_bytes(b"\0" * model.stat().st_size)
    again = torchrun(args)
    assert again.returncode == 0, explain(again)
    assert "step_00000040 is unreadable" in again.stderr
    assert "resumed from step 20" in again.stderr
    assert losses(tmp_path / "c") == reference
