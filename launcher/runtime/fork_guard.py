"""Forking DataLoader workers from a process whose gloo threads call into Python.

CPython before 3.11.10 (and 3.10.15) can deadlock a forked child for good
(python/cpython#112275): the child's start-up takes the interpreter's thread-list lock,
and if another thread held that lock at the moment of the fork, no one in the child ever
releases it. Threads that Python did not start take that lock without the GIL when they
enter Python: gloo's worker threads do, to run a future's Python callback (the timed DDP
comm hook) and to drop the last reference to a finished collective's tensors. The second
happens right after every collective, and a rank that forks its loader workers just after
the start-up collectives met it: the knob matrix saw rank 1's first worker hang in
`os.fork()` (the watchdog ended the run after `watchdog.first_step_s`).

`guard_forks` registers a before-fork hook that takes and releases that lock
(`sys._current_frames()` holds it while it lists the threads): a fork then waits until a
thread halfway through entering Python is through, and cannot copy the lock held. What is
left is a thread taking the lock in the microseconds between the hook and the fork itself.
On a fixed interpreter nothing is registered.
"""

from __future__ import annotations

import functools
import os
import sys

# The first release of each line whose forked child resets the lock before taking it.
FIXED = {(3, 10): 15, (3, 11): 10}  # the project runs on 3.10 and later


def needs_guard(version: tuple[int, int, int] = sys.version_info[:3]) -> bool:
    """Whether a fork on this interpreter can inherit the thread-list lock held."""
    return version[2] < FIXED.get(tuple(version[:2]), 0)


@functools.cache
def guard_forks() -> bool:
    """Register the before-fork hook once per process where the interpreter needs it;
    True when it is registered."""
    if needs_guard():
        os.register_at_fork(before=sys._current_frames)
        return True
    return False
