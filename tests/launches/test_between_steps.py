"""The phases between steps under the hang and stop protocols (real launches: 2 CPU ranks,
the default DataLoader, through `python -m launcher.torchrun`).

An eval far longer than the watchdog's limit is not a hang (each eval batch is progress);
a stop signal during a long eval is acted on between its batches: the stop checkpoint of
the step before it, exit 143, well inside torchrun's shutdown window.
"""

from __future__ import annotations

import os
import signal
import time

from launcher.resilience import exit_codes

from launch import FAST_USER_LOADER, explain, finish, metrics, start_torchrun, summary, torchrun

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


def test_an_eval_longer_than_the_hang_limit_is_not_a_hang(tmp_path):
    args = [*LONG_EVAL, "trainer.max_steps=4", f"run.root={tmp_path}", "run.id=eval"]
    proc = torchrun(args, runner="launcher.torchrun")
    assert proc.returncode == 0, explain(proc)
    assert "hang:" not in proc.stderr
    evals = [r for r in metrics(tmp_path / "eval") if "eval/loss" in r]
    assert [r["step"] for r in evals] == [2, 4]
    assert all(r["eval/time_s"] > MIN_S for r in evals), evals  # each would have been a hang
    assert summary(tmp_path / "eval")["status"] == "completed"


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
