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

import time
from dataclasses import dataclass, field

import torch

from launcher.intervals import union_length


@dataclass
class StepComm:
    """One step's gradient communication, as one rank saw it."""

    allreduce_s: float
    exposed_s: float
    bytes: int
    # Where the timer tells collectives apart (CollectiveTimer: FSDP2, DeepSpeed): per kind
    # ("all_gather", "reduce_scatter", ...), (in-flight s, exposed s, counted bytes).
    per_kind: dict[str, tuple[float, float, float]] = field(default_factory=dict)


def step_figures(buckets: list[tuple[float, float, int]]) -> StepComm:
    """(ready, done, bytes) per bucket -> the step's communication figures."""
    if not buckets:
        return StepComm(0.0, 0.0, 0)
    spans = [(ready, done) for ready, done, _ in buckets]
    exposed = max(done for _, done in spans) - max(ready for ready, _ in spans)
    return StepComm(union_length(spans), max(exposed, 0.0), sum(b for *_, b in buckets))


class CommTimer:
    """Collects each bucket's (ready, done, bytes) per step, for the comm hooks to fill.

    A hook calls `bucket_ready()` when DDP hands it a bucket and calls the function it
    returns, with the bytes it sent, once the bucket is reduced. Call `end_step()` after
    every optimizer step and `drain()` at a log step. CUDA events are pooled: a step
    records two per bucket, and creating them anew every step would cost more than
    recording them.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._current: list = []
        self._steps: list[list] = []
        self._pool: list = []

    def _now(self):
        if not self.cuda:
            return time.perf_counter()
        event = self._pool.pop() if self._pool else torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def bucket_ready(self):
        entry = [self._now(), None, 0]
        self._current.append(entry)

        def done(nbytes: int) -> None:
            entry[1] = self._now()
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
        if not self.cuda or not buckets:
            return [tuple(b) for b in buckets]
        origin = buckets[0][0]
        for _, done, _ in buckets:
            done.synchronize()
        resolved = [
            (origin.elapsed_time(r) / 1e3, origin.elapsed_time(d) / 1e3, n) for r, d, n in buckets
        ]
        self._pool.extend(e for r, d, _ in buckets for e in (r, d))
        return resolved


def bus_bandwidth(algbw: float, world: int) -> float:
    """nccl-tests' all-reduce bus bandwidth: what each link of a ring carries."""
    return algbw * 2 * (world - 1) / world
