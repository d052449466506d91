"""The phases between steps under the stop protocol (a real launch: 2 CPU ranks, the default
DataLoader, through `python -m launcher.torchrun`).

A stop signal during a long eval is acted on between its batches: the stop checkpoint of
the step before it, exit 143, well inside torchrun's shutdown window. (That such an eval is
no hang, each eval batch being progress: tests/launches/test_phases.py.)
"""

from __future__ import annotations

import os
import signal
import time

from launcher.resilience import exit_codes

from launch import FAST_USER_LOADER, finish, metrics, start_torchrun, summary

MIN_S = 1.5
# About 1,000 forward passes per rank per eval: several seconds on two CPU cores, longer
# than the watchdog's limit after a step (MIN_S: the tiny model steps in ~50 ms).
LONG_EVAL = [
    *FAST_USER_LOADER,
    "trainer.eval_interval=2",
    "trainer.eval_batches=500",
    f"watchdog.min_s={MIN_S}",
    "watchdog.step_multiple=10",
]


def test_a_stop_during_a_long_eval_checkpoints_the_step_before_it(tmp_path):
    output = tmp_path / "out.txt"
    run = tmp_path / "stop"
    args = [*LONG_EVAL, "trainer.max_steps=400", f"run.root={tmp_path}", "run.id=stop"]
    proc = start_torchrun(args, output)
    deadline = time.monotonic() + 180
    while not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_text():
        assert proc.poll() is None and time.monotonic() < deadline, output.read_text()
        time.sleep(0.05)
    time.sleep(1.0)  # step 1 is logged; step 2 takes ~50 ms, then its eval takes seconds
    os.kill(proc.pid, signal.SIGTERM)
    sent = time.monotonic()
    out = finish(proc, output)
    took = time.monotonic() - sent
    assert proc.returncode == exit_codes.STOPPED, out
    assert "stop requested during the eval after step 2: eval cut short" in out, out
    s = summary(run)
    assert s["status"] == "stopped" and s["steps"] == 2
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_00000002"
    assert [r["step"] for r in metrics(run)] == [1, 2]  # step 2's record, without an eval
    assert "eval/loss" not in metrics(run)[-1]
    assert took < 20, took  # torchrun's SIGKILL would come at 30 s
