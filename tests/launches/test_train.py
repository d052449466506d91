"""End-to-end launches of the trainer: the run directory, its metrics, and correctness.

Every launch is a real `torchrun` (or `python -m launcher.train`) on CPU with gloo.
"""

from __future__ import annotations

import json

import pytest
import yaml

from launch import FAST, explain, losses, metrics, summary, torchrun
from reference import cut_at, launch_log
from reference_runs import DDP_RUN, DDP_RUN_ID, DDP_RUN_STEPS

CONTRACT_METRICS = {
    "step",
    "loss",
    "lr",
    "tokens",
    "tokens_per_s",
    "mfu",
    "step_time_s/p50",
    "step_time_s/p90",
    "step_time_s/max",
    "step_time_s/slowest_rank",
    "data_wait_s",
    "mem/peak_gb",
}


def only_run(root):
    runs = [p for p in root.iterdir() if p.is_dir() and not p.is_symlink()]  # not runs/latest
    assert len(runs) == 1, runs
    return runs[0]


@pytest.fixture(scope="module")
def ws2_run(ddp_run, shared_root):
    """The session's DDP run (tests/reference_runs.py: 24 steps on 2 ranks, checkpoints at 12
    and 24): the reference for the world-size and resume comparisons; and its output."""
    return ddp_run, launch_log(shared_root, DDP_RUN_ID)


def test_run_directory_layout_and_metrics(ws2_run):
    run_dir, output = ws2_run
    for name in (
        "config.yaml",
        "env.json",
        "metrics.jsonl",
        "summary.json",
        "logs/rank0.log",
        "logs/rank1.log",
    ):
        assert (run_dir / name).is_file(), name
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_00000024"
    assert run_dir.stat().st_mode & 0o777 == 0o700  # run.access=private: the default
    records = [r for r in metrics(run_dir) if "loss" in r]
    assert [r["step"] for r in records] == list(range(1, 25))
    for r in records:
        assert r.keys() >= CONTRACT_METRICS
        assert r["mfu"] is None and r["mem/peak_gb"] is None  # a CPU has no known peak
        assert r["step_time_s/p50"] <= r["step_time_s/p90"] <= r["step_time_s/max"]
        assert r["step_time_s/slowest_rank"] in (0, 1)
        assert r["tokens"] == r["step"] * 8 * 64
        # log_interval=1: one step per interval, so tokens/s is tokens per step over the
        # slowest rank's step time, which is the max over ranks of that one step.
        assert r["tokens_per_s"] == pytest.approx(8 * 64 / r["step_time_s/max"], rel=1e-9)
    evals = [r for r in metrics(run_dir) if "eval/loss" in r]
    assert [r["step"] for r in evals] == [6, 12, 18, 24]
    s = summary(run_dir)
    assert s["status"] == "completed" and s["steps"] == 24 and s["world_size"] == 2
    assert s["loss"] == records[-1]["loss"]
    assert s["eval/ppl"] == pytest.approx(2.718281828 ** s["eval/loss"], rel=1e-6)
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert cfg["trainer"]["max_steps"] == 24 and cfg["model"]["name"] == "gpt2-tiny"
    env = json.loads((run_dir / "env.json").read_text())
    assert env["world_size"] == 2 and env["backend"] == "gloo"
    assert env["versions"]["torch"] and env["shm"]["need_bytes"] == 0
    # Progress on rank 0 only, as plain lines (stderr is not a terminal here), and a summary.
    assert "step 24/24 | loss" in output
    # The closing block: where the run is, its wall time, and the commands that will work on
    # it: a checkpoint and a tokenizer, no traces (nothing for launcher.analyze)
    closing = output[output.index(f"run {run_dir}: completed, 24 steps in ") :]
    assert "wall time" in closing and f"next: python -m launcher.generate {run_dir}" in closing
    assert "launcher.analyze" not in closing
    assert "[rank 1] INFO" not in output
    assert "rank 1/2" in (run_dir / "logs" / "rank1.log").read_text()


def test_world_size_1_and_2_give_the_same_losses(ws2_run, single_process):
    """Without torchrun (one process, accumulation 4) and on 2 ranks (accumulation 2 each):
    the same losses and eval losses, within fp32 reordering."""
    run_dir, _ = ws2_run
    s = summary(single_process)
    assert s["world_size"] == 1 and s["steps"] == DDP_RUN_STEPS
    one, two = losses(single_process), losses(run_dir)
    assert one.keys() == two.keys()
    for step in one:
        assert one[step] == pytest.approx(two[step], rel=1e-5), step
    # The eval set is the same sequences too, whatever the world size.
    evals = [
        {r["step"]: r["eval/loss"] for r in metrics(d) if "eval/loss" in r}
        for d in (single_process, run_dir)
    ]
    assert evals[0].keys() == evals[1].keys() == {6, 12, 18, 24}
    for step in evals[0]:
        assert evals[0][step] == pytest.approx(evals[1][step], rel=1e-5), step


def test_resume_continues_exactly(ws2_run, tmp_path):
    """The reference's step-12 checkpoint alone (as a run stopped right after it left it),
    resumed to 24: steps 13-24 bit-identical to the uninterrupted run."""
    run_dir, _ = ws2_run
    cut_at(run_dir, 12, tmp_path / "resumed")
    second = torchrun([*DDP_RUN, f"run.root={tmp_path}", "run.id=resumed"])
    assert second.returncode == 0, explain(second)
    assert "resumed from step 12" in second.stderr
    resumed, reference = losses(tmp_path / "resumed"), losses(run_dir)
    assert sorted(resumed) == list(range(13, 25))
    assert summary(tmp_path / "resumed")["resumed_from_step"] == 12
    assert resumed == {s: v for s, v in reference.items() if s > 12}  # fp32 on CPU: exact


def test_progress_bar_on_a_terminal(tmp_path):
    """With stderr on a terminal, rank 0 draws a progress bar instead of plain lines."""
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import sys
    import termios

    from launch import base_env

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))  # 40x160
    cmd = [
        sys.executable,
        "-m",
        "launcher.train",
        *FAST,
        f"run.root={tmp_path}",
        "trainer.max_steps=4",
    ]
    proc = subprocess.Popen(cmd, env=base_env(), stdin=follower, stdout=follower, stderr=follower)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=120) == 0
    screen = b"".join(chunks).decode(errors="replace")
    assert "4/4 [" in screen and "loss" in screen  # tqdm's "n/total [elapsed<eta, ...]"
    assert "INFO launcher: step 4/4 |" not in screen
