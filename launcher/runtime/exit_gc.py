"""Leaving a process without the interpreter's last garbage collection."""

from __future__ import annotations

import atexit
import gc


def skip_collection_at_exit() -> None:
    """Leave the objects still alive when the interpreter exits to the OS, rather than to a
    last garbage collection through every object torch (and Hydra, and the run) created:
    that took 1-1.5 s per rank, and 1-2 s per `launcher.torchrun` agent after its ranks had
    ended, on a loaded 2-core machine, on the path a scheduler waits on (a preemption's
    grace time, a requeue). Exit handlers still run (logging's flush, W&B's finish); what is
    skipped is only the finalizers of objects in reference cycles, which Python does not
    promise to run at exit anyway. Registered once, however often a front door's main runs
    in one process (the tests)."""
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
