"""The ranks' vote on a stop: every rank stops at the same step boundary.

Ranks receive a stop signal at slightly different moments, possibly in different steps, so
they vote: at each step boundary every rank starts a non-blocking all-gather of its flag on
the CPU control group, and reads the previous boundary's result (stop if any rank asked).
The vote costs one tiny collective per step whose latency hides behind a whole step of
compute, and all ranks see the same answer at the same step. It is an all-gather, not an
all-reduce, so that in a profiler trace every all-reduce is gradient communication.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from launcher.resilience.preemption import stop_requested


class StopVote:
    def __init__(self, group=None):
        self.group = group
        self._pending: tuple[object, list[torch.Tensor]] | None = None

    def poll(self) -> bool:
        """Call once per step boundary on every rank; True when all agree to stop now."""
        if not (dist.is_available() and dist.is_initialized()):
            return stop_requested()
        decided = self._collect()
        flag = torch.tensor([1 if stop_requested() else 0], dtype=torch.int32)
        flags = [torch.empty_like(flag) for _ in range(dist.get_world_size(self.group))]
        work = dist.all_gather(flags, flag, group=self.group, async_op=True)
        self._pending = (work, flags)
        return decided

    def _collect(self) -> bool:
        if self._pending is None:
            return False
        work, flags = self._pending
        self._pending = None
        work.wait()
        return any(bool(f.item()) for f in flags)

    def drain(self) -> None:
        """Finish the vote in flight so no collective is pending at teardown."""
        self._collect()
