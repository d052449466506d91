"""Damage done to run directories (garbage files, a lock held by another launch), and what
a test reads back: the bytes of a folder, what a failed write left behind, how much of a
picture is drawn."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from pathlib import Path

import yaml

from launcher.runtime import lock


def pixels(path: Path):
    """A picture's RGB values, rows x columns x 3, as ints."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as image:
        return np.asarray(image.convert("RGB")).astype(int)


def not_blank(path: Path) -> float:
    """The share of a picture's pixels that are not (near) white."""
    return float((pixels(path).sum(axis=2) < 3 * 250).mean())


def garbage(path: Path) -> None:
    path.write_bytes(b"\xff\xfe\x00garbage" * 3)


def write_lock(run: Path, **fields) -> Path:
    holder = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": None,
        "launch_key": "other-launch",
        "nonce": "n0",
        "since": time.time(),
        **fields,
    }
    path = run / lock.LOCK
    path.write_text(json.dumps(holder))
    return path


def digest(folder: Path) -> dict[str, str]:
    """{relative path: sha1} of every file under `folder` ({} when there is none)."""
    return {
        str(p.relative_to(folder)): hashlib.sha1(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def leftovers(run: Path) -> list[str]:
    """What a failed write may leave: temporary files and folders, the lock."""
    return sorted(
        str(p.relative_to(run))
        for p in run.rglob(".*")
        if p.name.startswith((".tmp-", ".lock")) or p.name.endswith(".tmp")
    )


FINISHED_STEPS = range(2, 21, 2)


def finished_run_dir(folder, *, loss0: float, lr: float, ranks: int = 4, slow_rank: int = 2):
    """A run directory as a finished 20-step run leaves it: config, summary, metrics, ranks
    (a slow rank, eval every 10 steps, 75 s of wall time)."""
    folder.mkdir(parents=True)
    config = {"trainer": {"lr": lr, "max_steps": 20}, "strategy": {"name": "ddp"},
              "run": {"id": folder.name}}  # fmt: skip
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    records = []
    for step in FINISHED_STEPS:
        record = {"step": step, "loss": loss0 - step * 0.05, "tokens_per_s": 1000.0 + step,
                  "step_time_s/p50": 0.02, "step_time_s/max": 0.03 + 0.001 * step,
                  "step_time_s/slowest_rank": slow_rank, "comm/overhead_frac": 0.3,
                  "data_wait_s": 0.001, "mem/peak_gb": None, "mem/host_peak_gb": 0.5}  # fmt: skip
        if step % 10 == 0:
            record["eval/loss"] = record["loss"] + 0.1
        records.append(record)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    per_rank = [
        {"step": step, "step_time_s": [0.02 + 0.01 * (r == slow_rank) for r in range(ranks)],
         "comm/exposed_s": [0.005 * r for r in range(ranks)], "data_wait_s": [0.001] * ranks}
        for step in FINISHED_STEPS
    ]  # fmt: skip
    (folder / "ranks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in per_rank))
    summary = {"status": "completed", "run_id": folder.name, "world_size": ranks, "steps": 20,
               "loss": records[-1]["loss"], "eval/loss": records[-1]["eval/loss"],
               "tokens_per_s": 1010.0, "mfu": None, "wall_time_s": 75.0,
               "exit_code": 0}  # fmt: skip
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder
