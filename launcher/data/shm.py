"""Shared-memory sizing for data-loader workers.

DataLoader workers hand finished batches to the training process through shared memory
(`/dev/shm` on Linux). Containers often get only 64 MiB there, and running out shows up as
a worker killed by a bus error deep inside a step. Checking the need against the free space
up front turns that into one line that says what to change.
"""

from __future__ import annotations

import math

from launcher.config.batch import BatchPlan
from launcher.runtime.disk import shm_available_bytes

INT64_BYTES = 8


def shm_need_bytes(
    *, num_workers: int, prefetch_factor: int, micro_batch: int, seq_len: int
) -> int:
    """Shared memory the train loader may hold at once, with a 2x margin.

    need = num_workers * prefetch_factor * batch_bytes * 2, where
    batch_bytes = 2 tensors (x, y) * micro_batch * seq_len * 8 bytes (int64).

    Each worker keeps up to `prefetch_factor` batches in flight, and every tensor that crosses
    a process boundary lives in /dev/shm until the trainer drops it; the margin covers the
    batch being consumed and allocator rounding. Zero workers load in-process and need none.
    """
    if num_workers == 0:
        return 0
    batch_bytes = 2 * micro_batch * seq_len * INT64_BYTES
    return num_workers * prefetch_factor * batch_bytes * 2


def loader_shm_need(cfg) -> int:
    """Bytes of /dev/shm one rank's DataLoader workers hold at once, with this config's
    data.* and trainer.* settings."""
    return shm_need_bytes(
        num_workers=cfg.data.num_workers,
        prefetch_factor=cfg.data.prefetch_factor,
        # auto: at most the per-rank batch, bounded here (no world size) by the global one
        micro_batch=BatchPlan.of(cfg.trainer, 1).micro_batch,
        seq_len=cfg.trainer.seq_len,
    )


def check_shm(*, need: int, path: str = "/dev/shm") -> str | None:
    """None if `need` bytes fit in the free shared memory, else the one-line error to show.

    A missing `path` (a platform without /dev/shm) passes: there is nothing to measure.
    """
    available = shm_available_bytes(path)
    if need == 0 or available is None:
        return None
    size, free = available
    if need <= free:
        return None
    suggest_gib = max(1, math.ceil(2 * need / 2**30))
    return (
        f"data loader workers need about {human_bytes(need)} of shared memory but {path} has "
        f"{human_bytes(free)} free (of {human_bytes(size)}); give the container more "
        f"(docker run --shm-size={suggest_gib}g, or --ipc=host; in Kubernetes mount an emptyDir "
        f"with medium: Memory and sizeLimit: {suggest_gib}Gi at {path}), or lower "
        f"data.num_workers / data.prefetch_factor"
    )


def human_bytes(n: int) -> str:
    """Bytes in binary units with one decimal, e.g. 64.0 MiB."""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    exp = 0
    while exp < len(units) - 1 and n >= 1024 ** (exp + 1):
        exp += 1
    return f"{n} B" if exp == 0 else f"{n / 1024**exp:.1f} {units[exp]}"
