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

from launcher.runtime.process_tree import agent_of

_IMPORTED = time.time()  # where /proc cannot say: as near the process's start as we get
# a first thread this long after the process's start: an exec'd program (torchrun's agent's
# first comes 0.4-2 s after its exec on a quiet machine, with the c10d store; longer under load)
EXEC_GAP_S = 30.0


def process_started(pid: int | str = "self") -> float | None:
    """A process's start as seconds since the epoch (Linux's /proc), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # since boot, in clock ticks
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


def program_started(pid: int) -> float | None:
    """When the program a process runs began: its start, unless a shell exec'd it after
    other work. /proc keeps the start of the process, and `bash -c 'pip install ... &&
    torchrun ...'` or a script's `exec torchrun` runs torchrun in the shell's process; but
    threads do not survive an exec, and torchrun's agent starts its first within seconds.
    So when the first thread besides the main one began more than EXEC_GAP_S after the
    process, the program began with it. For torchrun's agent only: a rank's own process
    may start its first thread late (none at all while it imports torch with one OpenMP
    thread), so there the gap says nothing."""
    started = process_started(pid)
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return started
    threads = [process_started(f"{pid}/task/{tid}") for tid in tids if tid != str(pid)]
    return later_program_start(started, [t for t in threads if t is not None])


def later_program_start(process: float | None, threads: list[float]) -> float | None:
    """The program's start from its process's and its other threads' starts (see
    program_started): the first thread's when it came more than EXEC_GAP_S later."""
    first = min(threads, default=None)
    if process is None or (first is not None and first - process > EXEC_GAP_S):
        return first
    return process


def launch_started() -> float:
    """The launch's start (epoch seconds): torchrun's agent's under torchrun (it sets
    TORCHELASTIC_RUN_ID for its workers and is their parent, or their fork server's on a
    warm start; torchrun's, not a shell's that exec'd it: program_started), else this
    process's."""
    own = process_started() or _IMPORTED
    agent = agent_of(os.getpid())
    if "TORCHELASTIC_RUN_ID" not in os.environ or agent <= 1:
        return own
    parent = program_started(agent)
    return parent if parent is not None and parent <= own else own


def wall_seconds(since: float) -> float:
    """Seconds from `since` (epoch seconds) to now."""
    return time.time() - since
