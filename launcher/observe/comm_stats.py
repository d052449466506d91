"""The communication figures of one step, shared by the trainer's timers (launcher.strategy)
and the metrics they feed (launcher.observe.metrics); the bus-bandwidth convention they
report in is launcher.runtime.allreduce's."""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.observe.intervals import union_length


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
    """(ready, done, bytes) per DDP bucket -> the step's communication figures (the
    definitions are in launcher.strategy.ddp.comm_timing)."""
    if not buckets:
        return StepComm(0.0, 0.0, 0)
    spans = [(ready, done) for ready, done, _ in buckets]
    exposed = max(done for _, done in spans) - max(ready for ready, _ in spans)
    return StepComm(union_length(spans), max(exposed, 0.0), sum(b for *_, b in buckets))
