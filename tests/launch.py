"""Start real trainer processes the way users do, with hard timeouts against hangs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

# Small and fast on 2 CPU cores, while still exercising accumulation (2 micro-steps per
# rank at world size 2), evaluation and checkpoints.
FAST = [
    "trainer.max_steps=12",
    "trainer.global_batch_size=8",
    "trainer.micro_batch_size=2",
    "trainer.seq_len=64",
    "trainer.warmup_steps=3",
    "trainer.log_interval=1",
    "trainer.eval_interval=6",
    "trainer.eval_batches=2",
    "trainer.checkpoint_interval=6",
    "data.max_bytes=400000",
    "data.bpe_vocab_size=512",
    "data.num_workers=0",
    "data.persistent_workers=false",
]

# FAST with the DataLoader as users run it (the defaults: 2 workers per rank, persistent,
# pinned where there is a GPU). Fault, stop and resume tests use this: a defect that only
# shows with workers on (SIGTERM reaching them) hid behind FAST's num_workers=0 once.
FAST_USER_LOADER = [o for o in FAST if not o.startswith(("data.num_workers", "data.persistent"))]

LAUNCH_TIMEOUT = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env(**extra: str) -> dict:
    env = dict(os.environ)
    env.pop("RANK", None)
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


def torchrun_cmd(
    args: list[str],
    *,
    nproc: int = 2,
    extra_args=(),
    module: str = "launcher.train",
    runner: str = "torch.distributed.run",
) -> list[str]:
    """`torchrun --standalone --nproc_per_node=N [extra] -m MODULE args...`; with
    runner="launcher.torchrun", the front door that exits with the job's code."""
    return [
        sys.executable,
        "-m",
        runner,
        "--standalone",
        f"--nproc_per_node={nproc}",
        *extra_args,
        "-m",
        module,
        *args,
    ]


def torchrun(
    overrides: list[str],
    *,
    nproc: int = 2,
    extra_args: list[str] = (),
    env=None,
    timeout: int = LAUNCH_TIMEOUT,
    cwd: Path | None = None,
    runner: str = "torch.distributed.run",
) -> subprocess.CompletedProcess:
    cmd = torchrun_cmd(overrides, nproc=nproc, extra_args=extra_args, runner=runner)
    return subprocess.run(
        cmd, env=env or base_env(), capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


def python_train(
    overrides: list[str], *, env=None, timeout: int = LAUNCH_TIMEOUT
) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "launcher.train", *overrides]
    return subprocess.run(
        cmd, env=env or base_env(), capture_output=True, text=True, timeout=timeout
    )


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in metrics(run_dir) if "loss" in r}


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def explain(proc: subprocess.CompletedProcess) -> str:
    out, err = proc.stdout[-4000:], proc.stderr[-6000:]
    return f"exit {proc.returncode}\n--- stdout\n{out}\n--- stderr\n{err}"
