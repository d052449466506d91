"""A process and every process below it, found through /proc.

torchrun starts each worker in a session of its own, and a rank forks its DataLoader
workers, so neither a process group nor a session holds a whole launch: killing
torchrun's group leaves its ranks running, orphaned, for as long as they last (a stalled
rank: an hour). Walking the children is what reaches them all.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

# What torchrun forwards to its workers, Slurm sends to every process of a step and a
# terminal sends on Ctrl-C: each rank turns them into a checkpoint at the next step boundary
# (launcher.resilience.preemption), and its data-loader workers leave them to it.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def children(pid: int) -> list[int]:
    """The live children of `pid` (of each of its threads)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError, ValueError):
            found += [int(c) for c in task.read_text().split()]
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL `pid` and everything below it. Each process is stopped first, from the top
    down, so that none can start another (torchrun restarting a rank, a rank forking a loader
    worker) between being found and being killed, nor be re-parented out of reach."""
    stopped, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        if p in stopped:
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGSTOP)
        stopped.append(p)
        frontier += children(p)
    for p in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


def stopped_workers(parent: int) -> dict[int, str]:
    """{pid: RANK} of `parent`'s children that are stopped (SIGSTOP, state T): they cannot
    take torchrun's SIGTERM, so torchrun would wait its whole shutdown timeout (30 s)."""
    found = {}
    for pid in children(parent):
        stat = Path(f"/proc/{pid}/stat")
        try:
            # pid (comm) state ppid ...; comm may hold spaces, so split after its ")".
            state = stat.read_text().rsplit(")", 1)[1].split()[0]
            if state != "T":
                continue
            environ = (stat.parent / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not ours to read
        rank = next((v[5:].decode() for v in environ if v.startswith(b"RANK=")), "?")
        found[pid] = rank
    return found
