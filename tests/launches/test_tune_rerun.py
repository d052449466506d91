"""A tune stopped by SIGTERM, then rerun with the same run.id, as a requeue would (real
launches: 2 CPU ranks, the default DataLoader, through `python -m launcher.torchrun`).

The rerun starts its rounds again: the stopped trial's folder (its stop checkpoint, its
metrics) is moved aside with one warning, not refused, and the report is written.
"""

from __future__ import annotations

import json
import os
import signal

from launch import finish, start, summary, torchrun_cmd, wait_for

SMALL = [
    "trainer.seq_len=64",
    "data.max_bytes=400000",
    "data.bpe_vocab_size=512",
    "tune.repeats=2",
    "tune.max_rounds=1",
    "tune.confirm_steps=6",
    "trainer.global_batch_size=16",
    "trainer.micro_batch_size=1",
    # Few candidates (micro-batch sizes), for time: the others, static_graph among them, are
    # timed by test_tune.py and test_tune_crash.py.
    "tune.skip=[data.num_workers,strategy.bucket_cap_mb,strategy.static_graph,strategy.comm_hook]",
]


def test_a_stopped_tune_reruns_in_clean_trial_folders(tmp_path):
    args = [*SMALL, f"run.root={tmp_path}", "run.id=again", "tune.trial_steps=30"]
    cmd = torchrun_cmd(args, module="launcher.tune", runner="launcher.torchrun")
    trials = tmp_path / "again" / "tune" / "trials"
    output = tmp_path / "first.txt"
    proc = start(cmd, output)
    wait_for(lambda: (trials / "r1-profile" / "metrics.jsonl").exists(), proc)
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=240) == 143, finish(proc, output)
    assert summary(trials / "r1-profile")["status"] == "stopped"

    rerun = torchrun_cmd([*args, "tune.trial_steps=6"], module="launcher.tune",
                         runner="launcher.torchrun")  # fmt: skip
    output = tmp_path / "second.txt"
    proc = start(rerun, output)
    out = finish(proc, output)
    assert proc.returncode == 0, out
    assert "Traceback" not in out and "error:" not in out, out
    moved = [ln for ln in out.splitlines() if "resume=archive: moved" in ln and "r1-profile" in ln]
    assert len(moved) == 1, out
    (archived,) = (trials / "r1-profile" / "archive").iterdir()
    assert summary(archived)["status"] == "stopped"  # the stopped attempt, kept whole
    assert (archived / "checkpoints").is_dir()
    assert summary(trials / "r1-profile")["status"] == "completed"
    rep = json.loads((tmp_path / "again" / "tune" / "report.json").read_text())
    assert not rep["stopped"] and len(rep["rounds"]) == 1
