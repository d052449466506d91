"""Where one rank's step went, from its trace: compute, communication (by collective, and the
part no computation hid), data wait, host-to-device copies, synchronisations and idle.

Times are seconds. `step_s` is the step's region on the CPU. On a CPU trace the other
figures are on the training thread's clock (gloo works on its own threads); on a GPU
trace compute, communication, copies and idle are GPU time, within the window from the
step's first to its last GPU activity.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from launcher.analyze.trace import Step, TraceError, load, rank_trace_files
from launcher.observe.intervals import merged, overlap_length, union_length

US = 1e-6


@dataclass
class StepBreakdown:
    rank: int
    step: int
    gpu: bool
    step_s: float
    compute_s: float
    comm_s: float  # gradient communication (all-reduces)
    exposed_comm_s: float  # communication while no computation ran
    overlap_ratio: float | None  # HTA's: computing while communicating / communicating
    data_wait_s: float
    h2d_s: float
    h2d_pageable: int
    syncs: dict[str, int]  # call name -> count
    sync_s: float
    idle_s: float
    device_allocs: dict[str, int]  # cudaMalloc/cudaFree calls in the step
    collectives: dict[str, tuple[int, float]]  # name -> (count, seconds)
    comm_starts: list[float] = field(default_factory=list)  # gradient all-reduces, in order
    comm_ends: list[float] = field(default_factory=list)
    ops: dict[str, list[float]] = field(default_factory=dict)
    flops: dict[str, float] = field(default_factory=dict)  # kernel class -> FLOPs


def breakdown(step: Step, rank: int, gpu: bool) -> StepBreakdown:
    comm = union_length(step.comm)
    hidden = overlap_length(step.comm, step.compute)
    sync_spans = [span for spans in step.syncs.values() for span in spans]
    busy = step.compute + step.comm + step.h2d
    if gpu:
        window = merged(busy)
        span = (window[-1][1] - window[0][0]) if window else 0.0
        idle = span - union_length(busy)
    else:
        idle = (step.end - step.start) - union_length(busy + step.data_wait)
    compute = union_length(step.compute)
    if not gpu:  # operators run while the loop waits for a batch (collating it in this
        compute -= overlap_length(step.compute, step.data_wait)  # process) are data wait
    ordered = sorted(step.comm)
    return StepBreakdown(
        rank=rank,
        step=step.number,
        gpu=gpu,
        step_s=(step.end - step.start) * US,
        compute_s=compute * US,
        comm_s=comm * US,
        exposed_comm_s=(comm - hidden) * US,
        overlap_ratio=hidden / comm if comm else None,
        data_wait_s=union_length(step.data_wait) * US,
        h2d_s=union_length(step.h2d) * US,
        h2d_pageable=step.h2d_pageable,
        syncs={name: len(spans) for name, spans in step.syncs.items()},
        sync_s=union_length(sync_spans) * US,
        idle_s=max(idle, 0.0) * US,
        device_allocs=dict(step.device_allocs),
        collectives={
            name: (len(spans), union_length(spans) * US)
            for name, spans in sorted(step.collectives.items())
        },
        comm_starts=[lo for lo, _ in ordered],
        comm_ends=[hi for _, hi in ordered],
        ops=step.ops,
        flops=step.flops,
    )


def run_breakdown(run_dir: Path) -> list[StepBreakdown]:
    """Every profiled (rank, step) of a run directory's traces."""
    rows = []
    for rank, files in rank_trace_files(run_dir).items():
        for path in files:
            trace = load(path)
            try:
                gpu = trace.has_gpu
                rows += [breakdown(step, rank, gpu) for step in trace.steps()]
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise TraceError(path, f"malformed event: {type(exc).__name__}: {exc}") from exc
    return rows
