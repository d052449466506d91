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
from collections.abc import Callable
from pathlib import Path

# What torchrun forwards to its workers, Slurm sends to every process of a step and a
# terminal sends on Ctrl-C: each rank turns them into a checkpoint at the next step boundary
# (launcher.resilience.preemption), and its data-loader workers leave them to it.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
# ... and SIGQUIT, which torchrun forwards too: all that a warm start's fork server ignores
# (launcher.warm_preload) and each rank forked from it takes back (launcher.warm_start)
GROUP_SIGNALS = (*STOP_SIGNALS, signal.SIGQUIT)


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


# The training command a warm start's fork server, and so each rank forked from it, holds
# in its environment: their command line is multiprocessing's (`ps e`, /proc/<pid>/environ
# tell which launch a rank belongs to), and the server composes the ranks' config from it.
WARM_COMMAND_ENV = "LAUNCHER_WARM_COMMAND"
# The processes multiprocessing starts beside a warm start's ranks (launcher.warm_start): the
# fork server they are forked from, where multiprocessing starts it as an interpreter of its
# own (a Python whose server launcher.warm_start cannot fork: elsewhere it is a fork of the
# agent, with the agent's command line), and the tracker of its semaphores.
FORK_SERVER = b"multiprocessing.forkserver"
RESOURCE_TRACKER = b"multiprocessing.resource_tracker"


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def parent_of(pid: int) -> int:
    """`pid`'s parent (0 if gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _forks_ranks(server: int, agent: int) -> bool:
    """Whether `server`, a child of `agent`, is a warm start's fork server: multiprocessing's
    own, or a fork of the agent (the agent's command line; a child that has not yet started
    the program it runs looks the same for a moment, and has no children)."""
    line = _cmdline(server)
    return FORK_SERVER in line or (bool(line) and line == _cmdline(agent))


def agent_of(rank: int) -> int:
    """The process that launched rank process `rank`: its parent (torchrun's agent), or
    where that is a warm start's fork server, the server's parent."""
    parent = parent_of(rank)
    grandparent = parent_of(parent)
    return grandparent if grandparent and _forks_ranks(parent, grandparent) else parent


def workers(agent: int) -> list[int]:
    """The rank processes torchrun's agent `agent` runs: its children, or where a warm
    start's fork server stands between them, the server's children; never multiprocessing's
    resource tracker (none while the agent waits in a rendezvous); none once the agent is
    ending (its command line gone: its fork server would look like a rank)."""
    found = []
    if not _cmdline(agent):
        return found
    for pid in children(agent):
        if _forks_ranks(pid, agent):
            found += children(pid)
        elif (line := _cmdline(pid)) and RESOURCE_TRACKER not in line:
            found.append(pid)
    return found


def stopped_workers(pids: list[int], rank_of: Callable[[int], str | None]) -> dict[int, str]:
    """{pid: rank} of the processes of `pids` that are stopped (SIGSTOP, state T): they
    cannot take torchrun's SIGTERM, so torchrun would wait its whole shutdown timeout (30 s).
    The rank is RANK in the process's /proc environment, or where that is not the rank's own
    (a warm start's fork), what `rank_of(pid)` says; "?" if neither knows."""
    found = {}
    for pid in pids:
        stat = Path(f"/proc/{pid}/stat")
        try:
            # pid (comm) state ppid ...; comm may hold spaces, so split after its ")".
            state = stat.read_text().rsplit(")", 1)[1].split()[0]
            if state != "T":
                continue
            environ = (stat.parent / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not ours to read
        rank = next((v[5:].decode() for v in environ if v.startswith(b"RANK=")), None)
        found[pid] = rank or rank_of(pid) or "?"
    return found
