"""Step timing without per-step host syncs, and the cross-rank aggregation of an interval.

On a GPU each step is bracketed by CUDA events that are only read at a log interval; on a
CPU the wall clock is already the truth. Every rank keeps its own interval figures and, at
a log step, one all-gather brings them together; all ranks then hold the same aggregate,
so decisions taken from it (stop on a non-finite loss) are the same everywhere.
"""

from __future__ import annotations

import contextlib
import math
import resource
import statistics
from dataclasses import dataclass, field

import torch

from launcher.observe.clock import EventClock
from launcher.observe.comm_stats import StepComm
from launcher.runtime.allreduce import bus_bandwidth


class StepTimer:
    """Collects per-step durations; `drain()` returns them in seconds (syncing only then)."""

    def __init__(self, device: torch.device):
        self.clock = EventClock(device)
        self._pending: list = []  # (start, end) stamps of each step
        self._t0 = None

    def start(self) -> None:
        self._t0 = self.clock.now()

    def stop(self) -> None:
        self._pending.append((self._t0, self.clock.now()))

    def drain(self) -> list[float]:
        stamps = [s for pair in self._pending for s in pair]
        times = self.clock.seconds(stamps)
        self.clock.release(stamps)
        self._pending.clear()
        return [times[2 * i + 1] - times[2 * i] for i in range(len(times) // 2)]


@dataclass
class Interval:
    """One rank's running figures since the last log step."""

    steps: int = 0
    data_waits: list[float] = field(default_factory=list)  # seconds, one per step
    loss_sum: torch.Tensor | None = None
    grad_norm: torch.Tensor | None = None
    dropped: int = 0  # steps whose non-finite update was skipped: not in loss_sum
    _waited: float = 0.0

    def add_data_wait(self, seconds: float) -> None:
        self._waited += seconds

    def add_loss(self, loss: torch.Tensor) -> None:
        """Accumulate on the device; nothing here waits for the device."""
        loss = loss.detach().float()
        self.loss_sum = loss if self.loss_sum is None else self.loss_sum + loss

    @property
    def nonfinite(self) -> torch.Tensor | None:
        """Whether a loss added is not finite: a NaN or an infinity in any term leaves the
        sum non-finite, so the sum says it when read (one op an interval, not one a
        micro-step)."""
        return None if self.loss_sum is None else ~torch.isfinite(self.loss_sum)

    def end_step(self) -> None:
        self.steps += 1
        self.data_waits.append(self._waited)
        self._waited = 0.0


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, as numpy's default."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def host_peak_rss_gb() -> float:
    """This process's peak resident memory since `reset_host_peak` (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def reset_host_peak() -> bool:
    """Restart the peak-RSS count from the current resident size, so that
    mem/host_peak_gb is one run's peak, not the process's (a sweep runs its points in one
    process). Linux resets it on writing 5 to /proc/self/clear_refs; freed heap is handed
    back first. False where that is not possible: the figure is then the process's peak."""
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def device_peak_gb(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 1e9


# Per kind of collective, where the strategy tells them apart (FSDP2, DeepSpeed): the
# metric stem of each, with `_s`, `_exposed_s`, `_bytes` series and a derived `_busbw_gbps`.
KIND_STEMS = {"all_gather": "comm/allgather", "reduce_scatter": "comm/reducescatter"}
KIND_SUFFIXES = ("_s", "_exposed_s", "_bytes", "_busbw_gbps")
_KIND_SERIES = KIND_SUFFIXES[:3]  # gathered per step; the bandwidth is derived


def local_figures(
    interval: Interval,
    step_times: list[float],
    comm: list[StepComm] | None,
    device: torch.device,
) -> dict:
    """This rank's interval by name, as every rank contributes it to the gather: the
    scalars (`loss` per step, `nonfinite`, `grad_norm`, `mem_gb`: None without a device
    figure, `host_gb`) and one value per step for each series (NaN where not measured)."""
    n = len(step_times)
    kept = max(n - interval.dropped, 1)  # steps whose update was dropped carry no loss
    loss = interval.loss_sum.item() / kept if interval.loss_sum is not None else math.nan
    if comm is None or len(comm) != n:
        comm = [StepComm(math.nan, math.nan, math.nan)] * n
    figures = {
        "loss": loss,
        "nonfinite": float(interval.nonfinite.item()) if interval.nonfinite is not None else 0.0,
        "grad_norm": interval.grad_norm.item() if interval.grad_norm is not None else math.nan,
        "mem_gb": device_peak_gb(device),
        "host_gb": host_peak_rss_gb(),
        "step_time_s": list(step_times),
        "data_wait_s": list(interval.data_waits),
        "comm/allreduce_s": [c.allreduce_s for c in comm],
        "comm/exposed_s": [c.exposed_s for c in comm],
        "comm/bytes": [float(c.bytes) for c in comm],
    }
    for kind, stem in KIND_STEMS.items():
        for i, suffix in enumerate(_KIND_SERIES):
            figures[stem + suffix] = [c.per_kind.get(kind, (math.nan,) * 3)[i] for c in comm]
    return figures


@dataclass
class Aggregate:
    """The job-wide figures of one interval, the same on every rank.

    `figures` holds the metric names of metrics.jsonl: p50/p90/max over every (rank, step)
    sample for step time, data wait and communication, means as the bare names of data wait
    and communication, and the derived bandwidth and overhead fraction.
    """

    loss: float
    nonfinite_ranks: list[int]
    slowest_interval_s: float
    step_time_p50: float
    figures: dict
    # each rank's mean step time, exposed communication and data wait over the interval
    # (NaN where not measured): the rank x interval picture of report.png, not a W&B series
    per_rank: dict = field(default_factory=dict)


def _spread(name: str, values: list[float], mean_as_bare: bool) -> dict:
    if not values:
        return {}
    out = {
        f"{name}/p50": percentile(values, 50),
        f"{name}/p90": percentile(values, 90),
        f"{name}/max": max(values),
    }
    if mean_as_bare:
        out[name] = sum(values) / len(values)
    return out


def aggregate(per_rank: list[dict], world_size: int) -> Aggregate:
    """Merge every rank's figures (`local_figures`, in rank order): spreads over all
    samples, the slowest rank, comm rates."""
    series = {name: [r[name] for r in per_rank] for name, v in per_rank[0].items()
              if isinstance(v, list)}  # fmt: skip

    def samples(name: str) -> list[float]:  # a series no rank measured: none
        return [v for row in series.get(name, ()) for v in row if math.isfinite(v)]

    totals = [sum(row) for row in series["step_time_s"]]
    slowest = max(range(len(totals)), key=totals.__getitem__)
    compute = [
        total - _finite_sum(wait) - _finite_sum(exposed)
        for total, wait, exposed in zip(
            totals, series["data_wait_s"], series["comm/exposed_s"], strict=True
        )
    ]
    mems = [r["mem_gb"] for r in per_rank if r["mem_gb"] is not None]
    figures = {
        **_spread("step_time_s", samples("step_time_s"), mean_as_bare=False),
        "step_time_s/slowest_rank": slowest,
        **_compute_spread(compute),
        **_spread("data_wait_s", samples("data_wait_s"), mean_as_bare=True),
        "grad_norm": per_rank[0]["grad_norm"],
        "mem/peak_gb": max(mems) if mems else None,
        "mem/host_peak_gb": max(r["host_gb"] for r in per_rank),
    }
    timed_step_s = sum(  # the step time of the (rank, step) samples with comm figures
        t
        for times, exposed in zip(series["step_time_s"], series["comm/exposed_s"], strict=True)
        for t, e in zip(times, exposed, strict=True)
        if math.isfinite(e)
    )
    figures.update(_comm_figures(samples, world_size, timed_step_s))
    return Aggregate(
        loss=sum(r["loss"] for r in per_rank) / len(per_rank),
        nonfinite_ranks=[
            i for i, r in enumerate(per_rank) if r["nonfinite"] or not math.isfinite(r["loss"])
        ],
        slowest_interval_s=totals[slowest],
        step_time_p50=figures.get("step_time_s/p50", math.nan),
        figures=figures,
        per_rank={name: [_mean(row) for row in series[name]] for name in PER_RANK},
    )


PER_RANK = ("step_time_s", "comm/exposed_s", "data_wait_s")


def _mean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


def _finite_sum(values: list[float]) -> float:
    return sum(v for v in values if math.isfinite(v))


def _compute_spread(compute: list[float]) -> dict:
    """Which rank computes slowest, and by how much over the median of the others.

    Compute is step time minus data wait minus exposed communication: what is left when
    waiting on other ranks and on the input pipeline is taken out. A rank that is slow
    here (a throttled GPU, a noisy neighbour, a bad host) makes every other rank wait in
    its collectives, which hides it in their step times.
    """
    slowest = max(range(len(compute)), key=compute.__getitem__)
    others = compute[:slowest] + compute[slowest + 1 :]
    typical = statistics.median(others) if others else compute[slowest]
    excess = compute[slowest] / typical - 1.0 if typical > 0 else 0.0
    return {"compute_s/slowest_rank": slowest, "compute_s/excess_frac": excess}


def _comm_figures(samples, world_size: int, timed_step_s: float) -> dict:
    """Communication figures, or nothing when no rank measured any. The overhead is the
    exposed time over the step time of the same samples (`timed_step_s`): a rank that
    measured nothing counts in neither."""
    allreduce, exposed, nbytes = (
        samples("comm/allreduce_s"),
        samples("comm/exposed_s"),
        samples("comm/bytes"),
    )
    if not allreduce:
        return {}
    busy = sum(allreduce)
    return {
        **_spread("comm/allreduce_s", allreduce, mean_as_bare=True),
        **_spread("comm/exposed_s", exposed, mean_as_bare=True),
        "comm/bytes": sum(nbytes) / len(nbytes),
        "comm/busbw_gbps": _busbw(sum(nbytes), busy, world_size),
        "comm/overhead_frac": sum(exposed) / timed_step_s if timed_step_s > 0 else None,
        **_kind_figures(samples, world_size),
    }


def _kind_figures(samples, world_size: int) -> dict:
    """Per kind of collective: mean in-flight and exposed seconds and bytes per step, and
    the bus bandwidth (bytes are all-reduce-equivalent, so DDP's formula holds)."""
    out = {}
    for stem in KIND_STEMS.values():
        busy, exposed, nbytes = (samples(stem + suffix) for suffix in _KIND_SERIES)
        if not busy:
            continue
        out[f"{stem}_s"] = sum(busy) / len(busy)
        out[f"{stem}_exposed_s"] = sum(exposed) / len(exposed)
        out[f"{stem}_bytes"] = sum(nbytes) / len(nbytes)
        out[f"{stem}_busbw_gbps"] = _busbw(sum(nbytes), sum(busy), world_size)
    return out


def _busbw(nbytes: float, busy_s: float, world_size: int) -> float | None:
    """Bus bandwidth in GB/s of `nbytes` moved in `busy_s`; None for one rank, which
    sends nothing over a bus, or when nothing was timed."""
    if busy_s <= 0 or world_size <= 1:
        return None
    return bus_bandwidth(nbytes / busy_s / 1e9, world_size)
