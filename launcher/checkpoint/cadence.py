"""When each tier checkpoints: every `trainer.checkpoint_interval` (and
`trainer.memory_checkpoint_interval`) steps, or, set to `auto`, at the interval that loses
the least time to failures and checkpoints together, from what the run measures.

Young's rule (Young 1974; Daly 2006 refines it for costly writes): a job whose failures
come every M seconds on average and whose checkpoint stops training for C seconds loses the
least with a checkpoint every sqrt(2 C M) seconds: more often, the writes cost more than the
work they save; less often, a failure costs more redone work than the writes. M is
`trainer.mtbf_h` (the job's mean time between failures), or, left null, NODE_MTBF_H divided
by the job's nodes. C is what a save costs the loop, measured at every save (the slowest
rank's; for the memory tier, the copy between two steps, as its write runs beside training),
and the step time is measured between saves: the interval is recomputed at each save, every
rank agreeing (one gather), and said in one line when it changes.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launcher.runtime.process import Runtime


log = logging.getLogger("launcher")

AUTO = "auto"
# Steps to the first save under auto: what a save costs is not known before one, so the
# first comes early (and proves the path writable early), the next at the measured interval.
FIRST = 2
# A node's mean time between failures, from Meta's Llama 3 training (Dubey et al. 2024, "The
# Llama 3 Herd of Models", section 3.3.4): 419 unexpected interruptions in 54 days on 16,384
# H100s in 8-GPU nodes, about 6,300 node-hours between failures. A job of n nodes fails n
# times as often.
NODE_MTBF_H = 54 * 24 * 16384 / 8 / 419


def mtbf_s(mtbf_h: float | None, nodes: int) -> tuple[float, str]:
    """The job's mean time between failures in seconds, and where the figure comes from."""
    if mtbf_h is not None:
        return float(mtbf_h) * 3600, f"trainer.mtbf_h={mtbf_h:g}"
    hours = NODE_MTBF_H / max(1, nodes)
    return hours * 3600, (
        f"trainer.mtbf_h=null: {NODE_MTBF_H:,.0f} node-hours between failures (Llama 3's) / "
        f"{nodes} node(s) = {hours:,.0f} h"
    )


def young_s(write_s: float, mtbf: float) -> float:
    """Seconds between checkpoints that lose the least: sqrt(2 x write cost x MTBF)."""
    return math.sqrt(2 * max(write_s, 0.0) * mtbf)


def steps_between(write_s: float, mtbf: float, step_s: float) -> int:
    """Young's interval in whole steps of `step_s` (at least 1)."""
    return max(1, round(young_s(write_s, mtbf) / step_s)) if step_s > 0 else FIRST


class Fixed:
    """A tier's interval as the user set it (0: never)."""

    def __init__(self, every: int):
        self.every = int(every)

    def due(self, step: int) -> bool:
        return bool(self.every) and step % self.every == 0

    def begin(self, step: int) -> None:
        """The run continues from `step` (nothing to follow with a fixed interval)."""

    def measured(self, step: int, write_s: float) -> None:
        """A save's cost (nothing to follow with a fixed interval)."""


class Young:
    """A tier's interval under `auto`: the first save FIRST steps in, then Young's interval
    from the costs measured so far, agreed by every rank at each save."""

    def __init__(self, key: str, rt: Runtime, mtbf: tuple[float, str]):
        self.key, self.rt = key, rt
        self.mtbf, self.mtbf_why = mtbf
        self.every = FIRST
        self.writes: list[float] = []
        self.begin(0)

    def begin(self, step: int) -> None:
        """The run continues from `step`: the next save FIRST steps on, or the interval
        measured so far."""
        self.next = step + self.every
        self._since = (step, time.perf_counter())  # the step and time of the last save

    def due(self, step: int) -> bool:
        return step >= self.next

    def measured(self, step: int, write_s: float) -> None:
        """After the save of `step`, which cost the loop `write_s` seconds on this rank: the
        slowest rank's cost and the median step time since the last save decide the next
        interval (a collective: every rank saves at the same steps)."""
        last_step, last_time = self._since
        now = time.perf_counter()
        steps = max(1, step - last_step)
        step_s = max(0.0, now - last_time - write_s) / steps
        everyone = self.rt.all_gather_objects((write_s, step_s))
        cost = max(w for w, _ in everyone)
        self.writes = [*self.writes[-9:], cost]  # the recent saves' costs
        write = statistics.median(self.writes)
        pace = statistics.median(s for _, s in everyone)
        every = steps_between(write, self.mtbf, pace)
        if every != self.every and self.rt.is_main:
            log.info(
                "%s=auto: every %d steps (sqrt(2 x %s a save x %s between failures) = %s at "
                "%.3g s a step; %s)", self.key, every, seconds_text(write), seconds_text(self.mtbf),
                seconds_text(young_s(write, self.mtbf)), pace, self.mtbf_why,
            )  # fmt: skip
        self.every = every
        self.next = step + every
        self._since = (step, time.perf_counter())

    def first_line(self) -> str:
        return (
            f"{self.key}=auto: the first save {FIRST} steps in, then every "
            f"sqrt(2 x its measured cost x {seconds_text(self.mtbf)} between failures) "
            f"({self.mtbf_why})"
        )


def seconds_text(seconds: float) -> str:
    """A duration as a log line says it: ms, s or h."""
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    if seconds < 100:
        return f"{seconds:.3g} s"
    if seconds < 3600:
        return f"{seconds:,.0f} s"
    hours = seconds / 3600
    return f"{hours:,.0f} h" if hours >= 100 else f"{hours:.3g} h"
