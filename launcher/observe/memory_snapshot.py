"""CUDA memory snapshots: every block the caching allocator holds and, while allocation
history is being recorded, the stack that allocated it and the recent allocations and
frees. A snapshot file opens at https://pytorch.org/memory_viz.

With `profiler.memory_snapshot=true` (part of `profiler=full`) each profiled rank records
allocation history from the start of training and writes a snapshot when its traces are
written, so the profiled steps are the end of the recorded window. A CUDA out-of-memory
error writes a snapshot before the run stops, whatever the profiler setting: the
allocator state then shows what filled the device (with stacks if history was on).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

log = logging.getLogger(__name__)

HISTORY_ENTRIES = 100_000  # allocation events kept: the last few steps of a large model


def start_history() -> None:
    """Begin recording allocations with their Python and C++ stacks."""
    torch.cuda.memory._record_memory_history(max_entries=HISTORY_ENTRIES)


def stop_history() -> None:
    torch.cuda.memory._record_memory_history(enabled=None)


def dump(path: Path) -> Path | None:
    """Write the snapshot to `path`; None (and a warning) if that fails, since it is only
    ever written on the way to something else (a trace, an error)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.cuda.memory._dump_snapshot(str(path))
    except Exception as exc:  # noqa: BLE001 - a failed snapshot must not hide the real error
        log.warning("could not write a CUDA memory snapshot to %s: %s", path, exc)
        return None
    return path
