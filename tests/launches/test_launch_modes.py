"""Ranks started the ways Slurm and Kubernetes start them, and the doctor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from launcher.runtime.disk import shm_available_bytes
from launcher.runtime.launch_clock import EXEC_GAP_S

from launch import FAST, LAUNCH_TIMEOUT, base_env, free_port, losses, summary


def start_rank(rank: int, port: int, overrides: list[str], log, **env) -> subprocess.Popen:
    environment = base_env(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        **env,
    )
    return subprocess.Popen(
        [sys.executable, "-m", "launcher.train", *overrides],
        env=environment,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def run_by_hand(overrides: list[str], tmp_path, delay: float, **env) -> None:
    """Two processes given only RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, rank 1 late."""
    port = free_port()
    with open(tmp_path / "rank0.out", "a") as out0, open(tmp_path / "rank1.out", "a") as out1:
        first = start_rank(0, port, overrides, out0, **env)
        time.sleep(delay)
        second = start_rank(1, port, overrides, out1, **env)
        for proc in (first, second):
            assert proc.wait(timeout=LAUNCH_TIMEOUT) == 0, (tmp_path / "rank0.out").read_text()[
                -3000:
            ]


def test_ranks_started_by_hand_seconds_apart_share_one_run_dir(tmp_path):
    root = tmp_path / "runs"
    run_by_hand([*FAST, f"run.root={root}", "trainer.max_steps=4"], tmp_path, delay=4.0)
    runs = [p for p in root.iterdir() if not p.is_symlink()]  # runs/latest is a link
    assert len(runs) == 1
    assert sorted(p.name for p in (runs[0] / "logs").iterdir()) == ["rank0.log", "rank1.log"]
    assert summary(runs[0])["world_size"] == 2


def test_requeued_job_finds_its_run_dir_and_resumes(tmp_path):
    """The same scheduler job id (as a Slurm requeue keeps it) means the same run directory."""
    root = tmp_path / "runs"
    common = [*FAST, f"run.root={root}", "trainer.lr_decay_steps=12"]
    run_by_hand([*common, "trainer.max_steps=6"], tmp_path, delay=0.5, SLURM_JOB_ID="4242")
    run_by_hand([*common, "trainer.max_steps=12"], tmp_path, delay=0.5, SLURM_JOB_ID="4242")
    runs = [p for p in root.iterdir() if not p.is_symlink()]  # runs/latest is a link
    assert len(runs) == 1
    assert summary(runs[0])["resumed_from_step"] == 6
    assert sorted(losses(runs[0])) == list(range(1, 13))


def test_doctor_reports_and_gates(tmp_path):
    ok = subprocess.run(
        [sys.executable, "-m", "launcher.doctor"],
        capture_output=True,
        text=True,
        timeout=120,
        env=base_env(),
    )
    assert ok.returncode == 0, ok.stderr
    assert (
        "/dev/shm    size" in ok.stdout
        and "torch " in ok.stdout
        and ok.stdout.strip().endswith("ok")
    )
    facts = json.loads(
        subprocess.run(
            [sys.executable, "-m", "launcher.doctor", "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            env=base_env(),
        ).stdout
    )
    assert facts["cpu_count"] == os.cpu_count() and facts["shm"]["need_bytes"] > 0
    _, free = shm_available_bytes()
    # Twice what is free: other processes (parallel tests) change /dev/shm meanwhile.
    huge = 2 * (free // (2 * 4 * 128 * 8 * 2 * 2)) + 1
    blocked = subprocess.run(
        [sys.executable, "-m", "launcher.doctor", f"data.prefetch_factor={huge}"],
        capture_output=True,
        text=True,
        timeout=120,
        env=base_env(),
    )
    assert blocked.returncode == 2  # as the trainer: bad input
    assert "PROBLEM" in blocked.stdout and "/dev/shm" in blocked.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "launcher.doctor", "model=nope"],
        capture_output=True,
        text=True,
        timeout=120,
        env=base_env(),
    )
    assert bad.returncode == 2 and bad.stderr.startswith("error: model=nope")


def test_a_torchrun_a_shell_execd_after_other_work_counts_from_torchrun(tmp_path):
    """`bash -c 'pip install ... && torchrun ...'`: bash execs torchrun in its own process,
    whose /proc start is the shell's. The run's wall time is torchrun's, not the shell's
    other work before it, longer than launch_clock.EXEC_GAP_S (program_started)."""
    root = tmp_path / "runs"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    train = " ".join([*torchrun, "-m", "launcher.train", *FAST, f"run.root={root}",
                      "trainer.max_steps=2"])  # fmt: skip
    started = time.time()
    before = EXEC_GAP_S + 5
    proc = subprocess.run(["bash", "-c", f"sleep {before} && exec {train}"], capture_output=True,
                          text=True, timeout=LAUNCH_TIMEOUT, env=base_env())  # fmt: skip
    whole = time.time() - started
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = [p for p in root.iterdir() if not p.is_symlink()]
    wall = summary(run)["wall_time_s"]
    assert 0 < wall <= whole - before + 1, (wall, whole)  # torchrun's own start-up included
