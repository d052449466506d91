"""Timestamps for timing work on the device without waiting for it: one clock for the step
timer, the DDP hook timer and the collective timer.

On a GPU a timestamp is a CUDA event recorded in stream order, read only when the figures
are needed (a log step), so timing adds no host-device synchronisation per step; the
events are pooled, because a step records several and creating them anew would cost more
than recording them. On a CPU the wall clock is already the truth.
"""

from __future__ import annotations

import time

import torch


class EventClock:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._pool: list = []

    def now(self):
        """A timestamp: a recorded CUDA event on a GPU, `time.perf_counter()` on a CPU."""
        if not self.cuda:
            return time.perf_counter()
        event = self._pool.pop() if self._pool else torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, stamps: list) -> list[float]:
        """`stamps` as seconds on one axis (on a GPU: from the first of them, after waiting
        for all of them); only differences between them mean anything."""
        if not self.cuda or not stamps:
            return [float(s) for s in stamps]
        origin = stamps[0]
        for event in stamps:
            event.synchronize()
        return [origin.elapsed_time(event) / 1e3 for event in stamps]

    def release(self, stamps) -> None:
        """Give read events back to the pool (each once, whatever the repetitions)."""
        if self.cuda:
            self._pool.extend({id(e): e for e in stamps if e is not None}.values())
