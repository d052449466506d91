"""Turn SIGTERM (what torchrun forwards, and what Slurm and Kubernetes send) into a clean
stop: every rank checkpoints at the same step boundary, then exits with exit_codes.STOPPED.

Ranks receive the signal at slightly different moments, possibly in different steps, so
they vote: at each step boundary every rank starts a non-blocking all-gather of its flag on
the CPU control group, and reads the previous boundary's result (stop if any rank asked).
The vote costs one tiny collective per step whose latency hides behind a whole step of
compute, and all ranks see the same answer at the same step. It is an all-gather, not an
all-reduce, so that in a profiler trace every all-reduce is gradient communication.
"""

from __future__ import annotations

import logging
import signal

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


class StopVote:
    def __init__(self, group=None, signals: tuple[int, ...] = (signal.SIGTERM,)):
        self.group = group
        self.requested = False
        self._pending: tuple[object, list[torch.Tensor]] | None = None
        for sig in signals:
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        if not self.requested:
            log.warning(
                "received %s: will checkpoint at the next step boundary and stop",
                signal.Signals(signum).name,
            )
        self.requested = True

    def poll(self) -> bool:
        """Call once per step boundary on every rank; True when all agree to stop now."""
        if not (dist.is_available() and dist.is_initialized()):
            return self.requested
        decided = self._collect()
        flag = torch.tensor([1 if self.requested else 0], dtype=torch.int32)
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
