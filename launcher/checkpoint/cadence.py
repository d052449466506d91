"""When each tier checkpoints: every `trainer.checkpoint_interval` (and
`trainer.memory_checkpoint_interval`) steps, or, set to `auto`, at the interval that loses
the least time to failures and checkpoints together, from what the run measures.

Young's rule (Young 1974; Daly 2006 refines it for costly writes): a job whose failures come
every M seconds on average and whose checkpoint stops training for C seconds loses the least
with a checkpoint every sqrt(2 C M) seconds: more often, the writes cost more than the work
they save; less often, a failure costs more redone work than the writes. M is
`trainer.mtbf_h` (the job's mean time between failures), or, left null, NODE_MTBF_H divided
by the job's nodes; for the durable tier while the memory tier is on, only the failures the
memory tier cannot recover from count (`trainer.memory_loss_mtbf_h`: a node lost with its
peer copy, every node's memory gone), every failure when it is left null. C is what a save
costs the loop, measured at every save as the time the loop lost to it: the two iterations
it touched (the one that made the copy or wrote, and the next, which the memory tier's
write, its seal and its peer copy share) less two iterations of the loop's median pace
without a save (`LoopClock`), and never less than the time in the save's own call. The
call's time alone missed most of it: on 16 ranks of a 2-core machine a memory save's call
took 120 ms and the loop lost 420 ms to it (a write thread, a seal and a peer copy beside
training). The interval is recomputed once the ranks agree on a save's cost, which rides on
the stop vote of the next step boundary (no gather of its own), and said in one line when
it changes. What was agreed travels in each checkpoint's meta.json (`state`): a restart at
the same world size starts at the interval its run measured (`recall`) instead of saving
FIRST steps in again, which cost every restart two early saves of each tier.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections import deque
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


def memory_loss_mtbf_s(loss_h: float | None, mtbf: tuple[float, str]) -> tuple[float, str]:
    """The mean time between the failures the memory tier cannot recover from, for the
    durable tier's interval while the memory tier is on: `trainer.memory_loss_mtbf_h`, or,
    left null, every failure's (`mtbf`): the safe side, as if the memory tier recovered none."""
    if loss_h is not None:
        return float(loss_h) * 3600, f"trainer.memory_loss_mtbf_h={loss_h:g}"
    return mtbf[0], "trainer.memory_loss_mtbf_h=null: every failure's"


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

    def saved(self, step: int, call_s: float) -> None:
        """A save of `step` (nothing to follow with a fixed interval)."""

    def settle(self, step: int) -> None:
        """Between two steps (nothing to follow with a fixed interval)."""

    def note(self) -> None:
        """Nothing for a vote to carry."""

    def state(self) -> None:
        """Nothing for a restart to recall."""

    def recall(self, state: dict) -> bool:
        """Nothing to recall: the interval is the user's."""
        return False

    def opening_line(self) -> None:
        """Nothing to say at the start: the interval is the user's."""


class LoopClock:
    """When each step ended, for what a save cost the loop: the `WINDOW` iterations it
    touched (from the end of the step it saved), less as many iterations at the median pace
    of the recent ones that no save touched."""

    WINDOW = 2  # the save's own iteration and the next (a memory save's write, seal, copy)
    RECENT = 64  # untouched iterations the pace is the median of

    def __init__(self):
        self.ends: dict[int, float] = {}  # step -> when it ended, for the saves in flight
        self.free: deque[float] = deque(maxlen=self.RECENT)
        self.touched_until = -1  # the last step whose iteration a save touched
        self._last: tuple[int, float] | None = None

    def begin(self) -> None:
        """A resume or a rewind: the steps ahead follow no step this clock saw end."""
        self.ends.clear()
        self._last = None

    def tick(self, step: int, now: float | None = None) -> None:
        """Step `step` ended (the loop's `step_done`)."""
        now = time.perf_counter() if now is None else now
        if self._last is not None and self._last[0] == step - 1 and step > self.touched_until:
            self.free.append(now - self._last[1])
        self._last = (step, now)
        self.ends = {s: t for s, t in self.ends.items() if s >= step - self.WINDOW}
        self.ends[step] = now

    def touch(self, step: int) -> None:
        """A save of `step` begins: the next WINDOW iterations are not the loop's own pace."""
        self.touched_until = max(self.touched_until, step + self.WINDOW)

    def pace(self) -> float | None:
        """The median iteration no save touched (None before one)."""
        return statistics.median(self.free) if self.free else None

    def cost(self, step: int, call_s: float) -> float | None:
        """What the save of `step` cost the loop, once WINDOW steps have ended since (None
        before): their time beyond the median pace, at least the save call's `call_s`."""
        start, end = self.ends.get(step), self.ends.get(step + self.WINDOW)
        if start is None or end is None:
            return None
        pace = self.pace()
        lost = end - start - self.WINDOW * pace if pace is not None else call_s
        return max(call_s, lost)


class Young:
    """A tier's interval under `auto`: the first save FIRST steps in, then Young's interval
    from the costs measured so far (`LoopClock`). Every rank must save at the same steps,
    so the ranks agree on each save's cost, and they do it without a collective of its own:
    the cost rides on the stop vote of the next step boundary (`note`, `agree`; the
    checkpoint manager is the vote's rider), where a gather of its own cost every rank
    40-100 ms a save on 16 ranks of a 2-core machine. A save's cost so decides the interval
    from the save after it on."""

    def __init__(self, key: str, rt: Runtime, mtbf: tuple[float, str], clock: LoopClock):
        self.key, self.rt, self.clock = key, rt, clock
        self.mtbf, self.mtbf_why = mtbf
        self.every = FIRST
        self.writes: list[float] = []
        self.pace: float | None = None  # the loop's pace the interval was last set at
        self.recalled = False
        self.begin(0)

    def begin(self, step: int) -> None:
        """The run continues from `step`: the next save FIRST steps on, or the interval
        measured so far."""
        self.last = step
        self.next = step + self.every
        self._pending: tuple[int, float] | None = None  # a save whose cost is not known yet
        self._known: tuple[float, float | None] | None = None  # one no vote carried yet

    def due(self, step: int) -> bool:
        return step >= self.next

    def saved(self, step: int, call_s: float) -> None:
        """A save of `step` whose call took `call_s` on this rank: its cost is known WINDOW
        steps on (`settle`)."""
        self._pending = (step, call_s)
        self.last = step
        self.next = step + self.every

    def settle(self, step: int) -> None:
        """Between two steps: once the pending save's cost is known, it waits for the next
        vote (every rank saves, and so settles, at the same steps)."""
        if self._pending is None or step < self._pending[0] + LoopClock.WINDOW:
            return
        saved, call_s = self._pending
        self._pending = None
        cost = self.clock.cost(saved, call_s)
        self._known = (call_s if cost is None else cost, self.clock.pace())

    def note(self) -> tuple[float, float | None] | None:
        """What this rank brings to the next vote, taken (each goes once): the cost of a
        save and the loop's pace (None: nothing new; the same on every rank)."""
        known, self._known = self._known, None
        return known

    def agree(self, notes: list[tuple[float, float | None]]) -> None:
        """Every rank's `note`: the slowest rank's cost and the median pace decide the
        interval from the last save on."""
        self.writes = [*self.writes[-9:], max(c for c, _ in notes)]  # the recent saves'
        paces = [p for _, p in notes if p is not None]
        if not paces:
            return
        self.pace = statistics.median(paces)
        every = steps_between(statistics.median(self.writes), self.mtbf, self.pace)
        if every != self.every and self.rt.is_main:
            log.info("%s", self._interval_line(every))
        self.every = every
        self.next = self.last + every

    def state(self) -> dict | None:
        """What a restart of this run recalls (`recall`), the same on every rank: the recent
        saves' agreed costs and the loop's pace; None before the first agreement."""
        return {"writes": self.writes, "pace": self.pace} if self.writes and self.pace else None

    def recall(self, state: dict) -> bool:
        """A restart (a new process) resuming a checkpoint whose meta carries `state`: the
        interval its run measured, from the first save on. Every rank reads the same state
        (agreed before it was written), so all save at the same steps. False where there is
        nothing to recall, or this process has measured its own already."""
        writes, pace = state.get("writes"), state.get("pace")
        if self.writes or not writes or not pace:
            return False
        self.writes, self.pace = [float(w) for w in writes][-10:], float(pace)
        self.every = steps_between(statistics.median(self.writes), self.mtbf, self.pace)
        self.recalled = True
        return True

    def opening_line(self) -> str:
        """What the run's first lines say of this tier's interval, once the resume decided."""
        if self.recalled:
            return f"{self._interval_line(self.every)}, as this run measured before the restart"
        return (
            f"{self.key}=auto: the first save {FIRST} steps in, then every "
            f"sqrt(2 x its measured cost x {seconds_text(self.mtbf)} between failures) "
            f"({self.mtbf_why})"
        )

    def _interval_line(self, every: int) -> str:
        write = statistics.median(self.writes)
        return (
            f"{self.key}=auto: every {every} steps (sqrt(2 x {seconds_text(write)} a save x "
            f"{seconds_text(self.mtbf)} between failures) = "
            f"{seconds_text(young_s(write, self.mtbf))} at {self.pace:.3g} s a step; "
            f"{self.mtbf_why})"
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
