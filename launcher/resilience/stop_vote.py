"""The ranks' vote on a stop: every rank stops at the same step boundary.

Ranks receive a stop signal at slightly different moments, possibly in different steps, so
they vote: at each step boundary every rank starts a non-blocking all-gather of its flag on
the CPU control group, and reads the previous boundary's result (stop if any rank asked).
The vote costs one tiny collective per step whose latency hides behind a whole step of
compute, and all ranks see the same answer at the same step. It is an all-gather, not an
all-reduce, so that in a profiler trace every all-reduce is gradient communication.

What else the ranks must learn alike between two steps rides along (`Rider`): a few numbers
of each rank's in the same gather, every rank's back a boundary later. The checkpoint
manager's do (what each rank's memory-tier thread has sealed, the measured cost of a save):
each would otherwise be a blocking gather of its own between two steps (on 16 ranks of a
2-core machine, 80 ms for the memory tier's agreement on each save).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import torch
import torch.distributed as dist

from launcher.resilience.preemption import stop_requested

NOTHING = math.nan  # a rider's number when it has nothing to say at this boundary


class Rider(Protocol):
    """Numbers that travel with the vote: `width` of them from each rank at every boundary
    (`payload`, NaN where there is nothing to say), every rank's in rank order a boundary
    later (`arrived`), on every rank at the same boundary."""

    width: int

    def payload(self) -> list[float]: ...

    def arrived(self, rows: list[list[float]]) -> None: ...


class StopVote:
    def __init__(self, group=None, riders: Sequence[Rider] = ()):
        self.group = group
        self.riders = list(riders)
        self._pending: tuple[object, list[torch.Tensor]] | None = None

    def poll(self) -> bool:
        """Call once per step boundary on every rank; True when all agree to stop now."""
        decided = self._collect()
        row = [1.0 if stop_requested() else 0.0]
        for rider in self.riders:
            row += rider.payload()
        mine = torch.tensor(row, dtype=torch.float64)
        if not (dist.is_available() and dist.is_initialized()):
            self._pending = (None, [mine])  # the riders' numbers come back a boundary later
            return stop_requested()
        rows = [torch.empty_like(mine) for _ in range(dist.get_world_size(self.group))]
        work = dist.all_gather(rows, mine, group=self.group, async_op=True)
        self._pending = (work, rows)
        return decided

    def _collect(self) -> bool:
        if self._pending is None:
            return False
        work, tensors = self._pending
        self._pending = None
        if work is not None:
            work.wait()
        rows = [t.tolist() for t in tensors]
        start = 1
        for rider in self.riders:
            rider.arrived([row[start : start + rider.width] for row in rows])
            start += rider.width
        return any(row[0] for row in rows)

    def drain(self) -> None:
        """Finish the vote in flight so no collective is pending at teardown."""
        self._collect()
