"""Per-step gradient-communication figures, timed around whichever DDP comm hook is active.

Every bucket DDP hands to the hook gets two timestamps: *ready*, when the hook is called
(all of the bucket's gradients have been computed), and *done*, when the hook's future has
delivered the reduced bucket. On a GPU these are CUDA events recorded in stream order, so
nothing waits for the device until the figures are read at a log step; on a CPU they are
wall-clock readings (gloo completes the future on its own thread).

From one step's buckets:

- ``allreduce_s`` is the length of the union of the ``[ready, done]`` intervals: the time
  during which some gradient was being communicated (queued collectives count, since the
  backend runs them one after another);
- ``exposed_s`` is ``max(done) - max(ready)``: the last bucket becomes ready when backward
  has computed its last gradient, so whatever communication is still running after that
  moment is the part the step waits for, not hidden behind compute;
- ``bytes`` is what the hook puts on the wire (half the bucket for fp16/bf16 compression).

The same definitions hold on gloo and NCCL because they only use the order of events in
the stream (GPU) or in time (CPU), never a host-side wait.
"""

from __future__ import annotations

import torch

from launcher.observe.clock import EventClock
from launcher.observe.comm_stats import StepComm, step_figures


class CommTimer:
    """Collects each bucket's (ready, done, bytes) per step, for the comm hooks to fill.

    A hook calls `bucket_ready()` when DDP hands it a bucket and calls the function it
    returns, with the bytes it sent, once the bucket is reduced. Call `end_step()` after
    every optimizer step and `drain()` at a log step.
    """

    def __init__(self, device: torch.device):
        self.clock = EventClock(device)
        self._current: list = []
        self._steps: list[list] = []

    def bucket_ready(self):
        entry = [self.clock.now(), None, 0]
        self._current.append(entry)

        def done(nbytes: int) -> None:
            entry[1] = self.clock.now()
            entry[2] = nbytes

        return done

    def end_step(self) -> None:
        self._steps.append(self._current)
        self._current = []

    def drain(self) -> list[StepComm]:
        """Figures of every step since the last drain (on GPU: waits for the last event)."""
        steps, self._steps = self._steps, []
        return [step_figures(self._resolve(buckets)) for buckets in steps]

    def _resolve(self, buckets: list) -> list[tuple[float, float, int]]:
        stamps = [e for ready, done, _ in buckets for e in (ready, done)]
        times = self.clock.seconds(stamps)
        self.clock.release(stamps)
        return [(times[2 * i], times[2 * i + 1], n) for i, (*_, n) in enumerate(buckets)]
