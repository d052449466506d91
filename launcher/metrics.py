"""Step timing without per-step host syncs, and the cross-rank aggregation of an interval.

On a GPU each step is bracketed by CUDA events that are only read at a log interval; on a
CPU the wall clock is already the truth. Every rank keeps its own interval figures and, at
a log step, one all-gather brings them together; all ranks then hold the same aggregate,
so decisions taken from it (stop on a non-finite loss) are the same everywhere.
"""

from __future__ import annotations

import math
import resource
import time
from dataclasses import dataclass, field

import torch


class StepTimer:
    """Collects per-step durations; `drain()` returns them in seconds (syncing only then)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._pending: list = []
        self._t0 = 0.0

    def start(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._t0 = event
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pending.append((self._t0, end))
        else:
            self._pending.append(time.perf_counter() - self._t0)

    def drain(self) -> list[float]:
        if self.cuda and self._pending:
            self._pending[-1][1].synchronize()
            times = [s.elapsed_time(e) / 1000.0 for s, e in self._pending]
        else:
            times = list(self._pending)
        self._pending.clear()
        return times


@dataclass
class Interval:
    """One rank's running figures since the last log step."""

    steps: int = 0
    data_wait_s: float = 0.0
    loss_sum: torch.Tensor | None = None
    nonfinite: torch.Tensor | None = None
    grad_norm: torch.Tensor | None = None
    step_times: list[float] = field(default_factory=list)

    def add_loss(self, loss: torch.Tensor) -> None:
        """Accumulate on the device; nothing here waits for the device."""
        loss = loss.detach().float()
        bad = ~torch.isfinite(loss)
        self.loss_sum = loss if self.loss_sum is None else self.loss_sum + loss
        self.nonfinite = bad if self.nonfinite is None else self.nonfinite | bad


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, as numpy's default."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def host_peak_rss_gb() -> float:
    """This process's peak resident memory (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def device_peak_gb(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 1e9


# Position of each scalar in the gathered vector; step times follow them.
_FIELDS = ("loss", "nonfinite", "data_wait_s", "grad_norm", "mem_gb", "host_gb")


def local_vector(interval: Interval, step_times: list[float], device: torch.device) -> list[float]:
    """Flatten this rank's interval into the vector every rank contributes to the gather."""
    n = max(interval.steps, 1)
    loss = interval.loss_sum.item() / n if interval.loss_sum is not None else math.nan
    bad = float(interval.nonfinite.item()) if interval.nonfinite is not None else 0.0
    norm = interval.grad_norm.item() if interval.grad_norm is not None else math.nan
    mem = device_peak_gb(device)
    return [
        loss,
        bad,
        interval.data_wait_s / n,
        norm,
        -1.0 if mem is None else mem,
        host_peak_rss_gb(),
        *step_times,
    ]


@dataclass
class Aggregate:
    """The job-wide figures of one interval, the same on every rank."""

    loss: float
    nonfinite_ranks: list[int]
    step_time_p50: float
    step_time_p90: float
    step_time_max: float
    slowest_rank: int
    slowest_interval_s: float
    data_wait_s: float
    data_wait_max_s: float
    grad_norm: float
    mem_peak_gb: float | None
    host_peak_gb: float


def aggregate(gathered: list[list[float]]) -> Aggregate:
    """p50/p90/max over every (rank, step) sample, the slowest rank, means over ranks."""
    k = len(_FIELDS)
    per_rank = [dict(zip(_FIELDS, row[:k], strict=True)) for row in gathered]
    times = [row[k:] for row in gathered]
    all_times = [t for row in times for t in row]
    totals = [sum(row) for row in times]
    slowest = max(range(len(totals)), key=totals.__getitem__)
    mems = [r["mem_gb"] for r in per_rank if r["mem_gb"] >= 0]
    return Aggregate(
        loss=sum(r["loss"] for r in per_rank) / len(per_rank),
        nonfinite_ranks=[
            i for i, r in enumerate(per_rank) if r["nonfinite"] or not math.isfinite(r["loss"])
        ],
        step_time_p50=percentile(all_times, 50),
        step_time_p90=percentile(all_times, 90),
        step_time_max=max(all_times) if all_times else math.nan,
        slowest_rank=slowest,
        slowest_interval_s=totals[slowest],
        data_wait_s=sum(r["data_wait_s"] for r in per_rank) / len(per_rank),
        data_wait_max_s=max(r["data_wait_s"] for r in per_rank),
        grad_norm=per_rank[0]["grad_norm"],
        mem_peak_gb=max(mems) if mems else None,
        host_peak_gb=max(r["host_gb"] for r in per_rank),
    )
