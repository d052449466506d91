"""Communication per step from traces: time communicating, and the part of it that no
computation overlapped (exposed), per rank and step. The trace-side counterpart of the
trainer's live `comm/allreduce_s` and `comm/exposed_s`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from launcher.analyze.trace import load, rank_trace_files
from launcher.intervals import overlap_length, union_length

US = 1e-6


@dataclass
class StepCommFromTrace:
    rank: int
    step: int
    collectives: int
    comm_s: float
    exposed_s: float
    overlap_ratio: float | None  # HTA's: time computing while communicating / communicating


def comm_by_step(run_dir: Path) -> list[StepCommFromTrace]:
    """Every profiled (rank, step) of a run directory's traces."""
    rows = []
    for rank, files in rank_trace_files(run_dir).items():
        for path in files:
            for step in load(path).steps():
                comm = union_length(step.comm)
                hidden = overlap_length(step.comm, step.compute)
                rows.append(
                    StepCommFromTrace(
                        rank=rank,
                        step=step.number,
                        collectives=len(step.comm),
                        comm_s=comm * US,
                        exposed_s=(comm - hidden) * US,
                        overlap_ratio=hidden / comm if comm else None,
                    )
                )
    return rows
