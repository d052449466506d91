"""When the launch began, and so what a run's wall time is: one definition for the closing
block, summary.json's `wall_time_s`, `launcher.runs`, W&B and TensorBoard.

A run's wall time is from the launch to its last write: from the moment the user's command
started (torchrun's agent, the parent of every rank under torchrun, or this process without
one), start-up, data preparation and the drawing of report.png included, to summary.json.
A later job of the same process (a sweep's next point, a tuner's next trial) counts from
the end of the job before it, so the jobs' wall times add up to the launch's.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

_IMPORTED = time.time()  # where /proc cannot say: as near the process's start as we get


def process_started(pid: int | str = "self") -> float | None:
    """A process's start as seconds since the epoch (Linux's /proc), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # since boot, in clock ticks
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


def launch_started() -> float:
    """The launch's start (epoch seconds): torchrun's agent's under torchrun (it sets
    TORCHELASTIC_RUN_ID for its workers and is their parent), else this process's."""
    own = process_started() or _IMPORTED
    if "TORCHELASTIC_RUN_ID" not in os.environ or os.getppid() <= 1:
        return own
    parent = process_started(os.getppid())
    return parent if parent is not None and parent <= own else own


def wall_seconds(since: float) -> float:
    """Seconds from `since` (epoch seconds) to now."""
    return time.time() - since
