"""Small, fast tuning launches (launcher.tune on gpt2-tiny), shared by the tuner's launch tests."""

from __future__ import annotations

import json

from launch import base_env, torchrun_cmd

TUNE_TIMEOUT = 420


SMALL = [
    "trainer.seq_len=64",
    "data.max_bytes=400000",
    "data.bpe_vocab_size=512",
    "tune.trial_steps=7",  # 3 warm-up steps, 4 timed
    "tune.repeats=2",
    "tune.confirm_steps=12",
    "tune.min_gain=0.2",  # a busy shared machine: only big gains count here
]


def tune_launch(args: list[str], *, nproc: int = 2, env=None):
    import subprocess

    cmd = torchrun_cmd(args, nproc=nproc, module="launcher.tune")
    return subprocess.run(
        cmd, env=env or base_env(), capture_output=True, text=True, timeout=TUNE_TIMEOUT
    )


def report(run_dir):
    return json.loads((run_dir / "tune" / "report.json").read_text())
