"""One case's launch: `python -m launcher.torchrun` (the front door whose exit code is the
job's) of launcher.train with the case's overrides, its console kept in a file, watched
and signalled from here the way a scheduler would.

Each launch runs in its own session, so that a signal meant for one rank reaches only it,
and a launch this process leaves behind (a timeout, Ctrl-C) is killed with every process it
started (launcher.runtime.process_tree).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from launcher.checkpoint.protocol import parse_step
from launcher.resilience.exit_codes import OUTCOME_DIR_ENV
from launcher.runtime.process_tree import kill_tree

POLL_S = 0.02
# What torchrun (or a scheduler) set for this process, when the rehearsal itself runs under
# torchrun: each case's launch is a job of its own and must not join this one.
INHERITED = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
             "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR",
             "MASTER_PORT", OUTCOME_DIR_ENV)  # fmt: skip
_live: set[subprocess.Popen] = set()


class CaseFailed(Exception):
    """A case's expectation did not hold; the message is the row's observation."""


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in INHERITED}
    return {k: v for k, v in env.items() if not k.startswith(("TORCHELASTIC_", "PET_"))}


class Launch:
    """A started launch of `nproc` ranks writing its run to `run_dir`."""

    def __init__(self, run_dir: Path, overrides: list[str], nproc: int, console: Path,
                 timeout_s: float, torchrun_args: tuple[str, ...] = ()):  # fmt: skip
        self.run_dir = run_dir
        self.console = console
        self.deadline = time.monotonic() + timeout_s
        self.timeout_s = timeout_s
        run = [f"run.root={run_dir.parent}", f"run.id={run_dir.name}"]
        self.cmd = [sys.executable, "-m", "launcher.torchrun", "--standalone",
                    f"--nproc_per_node={nproc}", *torchrun_args, "-m", "launcher.train",
                    *overrides, *run]  # fmt: skip
        console.parent.mkdir(parents=True, exist_ok=True)
        with open(console, "w") as out:
            self.proc = subprocess.Popen(
                self.cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env(),
                start_new_session=True,
            )  # fmt: skip
        _live.add(self.proc)

    def wait_until(self, what: str, predicate: Callable[[], bool], limit_s: float | None = None):
        """Until `predicate()` holds; CaseFailed if the launch ends first or time runs out."""
        deadline = (
            self.deadline if limit_s is None else min(self.deadline, time.monotonic() + limit_s)
        )
        while not predicate():
            if self.proc.poll() is not None:
                raise CaseFailed(f"the launch ended (exit {self.proc.returncode}) before {what}")
            if time.monotonic() > deadline:
                self.kill()
                raise CaseFailed(f"no {what} within {limit_s or self.timeout_s:g} s; killed it")
            time.sleep(POLL_S)

    def finish(self, limit_s: float | None = None) -> int:
        """The launch's exit code; CaseFailed (after killing it) past its time."""
        left = self.deadline - time.monotonic()
        try:
            code = self.proc.wait(timeout=max(0.0, left if limit_s is None else min(left, limit_s)))
        except subprocess.TimeoutExpired:
            self.kill()
            raise CaseFailed(
                f"still running after {limit_s or self.timeout_s:g} s; killed it"
            ) from None
        _live.discard(self.proc)
        return code

    def signal(self, sig: signal.Signals) -> None:
        """To the launching process only, as Slurm or the kubelet signals torchrun."""
        os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        """The launch and all it started: torchrun, its ranks (each in a session of its own)
        and their loader workers."""
        kill_tree(self.proc.pid)
        self.proc.wait()
        _live.discard(self.proc)

    def output(self) -> str:
        return self.console.read_text(errors="replace")


def kill_leftovers() -> None:
    """Every launch still running (the rehearsal is ending early)."""
    for proc in list(_live):
        kill_tree(proc.pid)
        _live.discard(proc)


# -- reading a case's run directory ---------------------------------------------------------
def records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip().endswith("}")]


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records(run_dir) if "loss" in r}


def last_step(run_dir: Path) -> int:
    return max(losses(run_dir), default=0)


def latest_checkpoint(run_dir: Path) -> int:
    """The step `checkpoints/latest` names, 0 when there is none yet."""
    with contextlib.suppress(OSError):
        return parse_step((run_dir / "checkpoints" / "latest").read_text().strip()) or 0
    return 0


def summary(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


def worker_pid(run_dir: Path, rank: int) -> int | None:
    """The pid rank `rank` logged last (each attempt of an elastic restart logs its own)."""
    with contextlib.suppress(OSError):
        found = re.findall(r"pid (\d+)\)", (run_dir / "logs" / f"rank{rank}.log").read_text())
        return int(found[-1]) if found else None
    return None
