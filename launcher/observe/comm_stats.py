"""The communication figures of one step, and the bus-bandwidth convention, shared by the
trainer's timers (launcher.strategy), the metrics they feed (launcher.observe.metrics), the
bandwidth benchmark (launcher.commbench) and the burn-in gate (launcher.resilience.burnin),
which also share the all-reduce timing itself."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

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


def bus_bandwidth(algbw: float, world: int) -> float:
    """nccl-tests' all-reduce bus bandwidth: what each link of a ring carries."""
    return algbw * 2 * (world - 1) / world


def time_allreduce(tensor: torch.Tensor, warmup: int, iters: int, group=None) -> float:
    """Mean seconds per all-reduce of `tensor` on this rank, over `group` (None: every
    rank), after `warmup` untimed ones and a barrier so that every rank starts together."""
    sync = torch.cuda.synchronize if tensor.is_cuda else (lambda: None)
    for _ in range(warmup):
        dist.all_reduce(tensor, group=group)
    sync()
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor, group=group)
    sync()
    return (time.perf_counter() - start) / iters
