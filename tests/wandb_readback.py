"""Reading real offline W&B runs back, as a user would: `wandb leet inspect` on the run's
folder, with every file wandb writes outside the run directory moved into the test's own
temporary folder (docs/logging.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from launch import base_env


def private_wandb_env(tmp: Path) -> dict[str, str]:
    """Where wandb writes outside the run directory, moved under `tmp` (docs/logging.md)."""
    return {
        "XDG_CACHE_HOME": str(tmp / "cache"),  # wandb-core's core-debug-*.log
        "WANDB_CACHE_DIR": str(tmp / "cache" / "wandb"),  # the system monitor's log
        "WANDB_CONFIG_DIR": str(tmp / "wandb-config"),
        "XDG_DATA_HOME": str(tmp / "data"),  # offline artifacts are staged there
    }


def wandb_cli(*args: str, tmp: Path) -> str:
    """`wandb ...` from this environment; its own debug log goes to `tmp`, not $TMPDIR."""
    exe = Path(sys.executable).with_name("wandb")
    done = subprocess.run(
        [str(exe), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=base_env(TMPDIR=str(tmp), WANDB_DIR=str(tmp)),
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def records(run_path: Path, tmp: Path) -> list[dict]:
    out = wandb_cli("leet", "inspect", "--json", str(run_path), tmp=tmp)
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def inspect_summary(run_path: Path, tmp: Path) -> dict:
    return json.loads(wandb_cli("leet", "inspect", "--summary", "--json", str(run_path), tmp=tmp))


def history(run_path: Path, tmp: Path) -> list[dict]:
    return [r["history"] for r in records(run_path, tmp) if r["type"] == "history"]
