"""Metrics across ranks on fabricated inputs: percentiles, intervals, the figures gathered by
name, their aggregation (slowest rank, spreads, comm, memory) and bus bandwidth."""

from __future__ import annotations

import math

import pytest
import torch

from launcher.observe.comm_stats import StepComm, step_figures
from launcher.observe.metrics import Interval, aggregate, local_figures, percentile
from launcher.runtime.allreduce import bus_bandwidth

from in_process import CPU, approx


def rank_vector(
    step_times: list[float],
    waits: list[float],
    comm: list[StepComm] | None,
    losses: list[float],
    grad_norm: float = 1.0,
) -> dict:
    """One rank's gathered figures, built the way the loop builds them (through Interval)."""
    interval = Interval()
    for wait, loss in zip(waits, losses, strict=True):
        interval.add_data_wait(wait)
        interval.add_loss(torch.tensor(loss))
        interval.end_step()
    interval.grad_norm = torch.tensor(grad_norm)
    return local_figures(interval, step_times, comm, CPU)


def test_percentile_is_numpy_linear():
    """Linear interpolation between order statistics (numpy's default), NaN when empty."""
    values = [3.0, 1.0, 4.0, 2.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 90) == pytest.approx(3.7, abs=1e-12)
    assert percentile(values, 100) == 4.0
    assert percentile([7.0], 90) == 7.0
    assert math.isnan(percentile([], 50))


def test_interval_accumulates_losses_and_per_step_waits():
    """Data waits are summed within a step and recorded one per step; a non-finite loss
    in any micro-step marks the interval, and the loss sum keeps every micro-step."""
    interval = Interval()
    interval.add_data_wait(0.25)
    interval.add_data_wait(0.5)
    interval.add_loss(torch.tensor(1.0))
    interval.add_loss(torch.tensor(2.0))
    interval.end_step()
    interval.add_loss(torch.tensor(float("inf")))
    interval.end_step()
    assert interval.steps == 2
    assert interval.data_waits == [0.75, 0.0]
    assert bool(interval.nonfinite)
    assert interval.loss_sum.item() == math.inf


def test_local_figures_by_name_and_missing_comm_is_nan():
    """The scalars, then one value per step for each series, by name; the loss is the
    interval's loss sum per step; a rank without comm figures (or with a different count
    of them) contributes NaN for every comm sample; no device memory on a CPU is None."""
    comm = [StepComm(0.5, 0.25, 100), StepComm(0.75, 0.125, 200)]
    fig = rank_vector([1.0, 2.0], [0.25, 0.5], comm, [3.0, 5.0], grad_norm=2.5)
    assert (fig["loss"], fig["nonfinite"], fig["grad_norm"]) == (4.0, 0.0, 2.5)  # (3 + 5) / 2
    assert fig["mem_gb"] is None  # no device memory figure on a CPU
    assert fig["step_time_s"] == [1.0, 2.0] and fig["data_wait_s"] == [0.25, 0.5]
    assert fig["comm/allreduce_s"] == [0.5, 0.75] and fig["comm/exposed_s"] == [0.25, 0.125]
    assert fig["comm/bytes"] == [100.0, 200.0]
    # per kind of collective (all-gather, reduce-scatter): DDP's figures have none
    kinds = [k for k in fig if k.startswith(("comm/allgather", "comm/reducescatter"))]
    assert len(kinds) == 6 and all(math.isnan(v) for k in kinds for v in fig[k])
    for missing in (None, comm[:1]):
        fig = rank_vector([1.0, 2.0], [0.0, 0.0], missing, [1.0, 1.0])
        assert fig["step_time_s"] == [1.0, 2.0] and fig["data_wait_s"] == [0.0, 0.0]
        series = [v for k, v in fig.items() if k.startswith("comm/")]
        assert all(math.isnan(x) for v in series for x in v)


THREE_RANKS = [
    # rank 0: total step time 3.0, waits 0.3, exposed 0.5 -> compute 2.2
    dict(
        step_times=[1.0, 2.0],
        waits=[0.1, 0.2],
        comm=[StepComm(0.5, 0.2, 100), StepComm(0.5, 0.3, 100)],
        losses=[2.0, 4.0],
        grad_norm=0.5,
    ),
    # rank 1: the slowest, total 4.5, no waits, exposed 0.2 -> compute 4.3
    dict(
        step_times=[1.5, 3.0],
        waits=[0.0, 0.0],
        comm=[StepComm(0.4, 0.1, 100), StepComm(0.6, 0.1, 100)],
        losses=[1.0, 1.0],
        grad_norm=9.0,
    ),
    # rank 2: total 2.3, waits 1.0, exposed 0.1 -> compute 1.2
    dict(
        step_times=[1.2, 1.1],
        waits=[0.5, 0.5],
        comm=[StepComm(0.3, 0.05, 100), StepComm(0.2, 0.05, 100)],
        losses=[3.0, 3.0],
        grad_norm=7.0,
    ),
]


def test_aggregate_spreads_slowest_rank_and_comm_figures():
    """Every figure of a three-rank interval, computed by hand from the samples:
    p50/p90/max over all six (rank, step) samples, the slowest rank by summed step time
    (what tokens/s divides by), compute = step - wait - exposed and its excess over the
    median of the other ranks, comm means, busbw from total bytes over total busy time,
    and overhead = summed exposed time over summed step time."""
    agg = aggregate([rank_vector(**r) for r in THREE_RANKS], world_size=3)
    f = agg.figures

    assert agg.loss == approx((3.0 + 1.0 + 3.0) / 3)
    assert agg.nonfinite_ranks == []
    # step time samples, sorted: 1.0 1.1 1.2 1.5 2.0 3.0
    assert f["step_time_s/p50"] == approx(1.35) and agg.step_time_p50 == f["step_time_s/p50"]
    assert f["step_time_s/p90"] == approx(2.5)
    assert f["step_time_s/max"] == 3.0
    assert "step_time_s" not in f  # no bare mean for step time
    assert f["step_time_s/slowest_rank"] == 1
    assert agg.slowest_interval_s == approx(4.5)
    assert f["compute_s/slowest_rank"] == 1
    assert f["compute_s/excess_frac"] == approx(4.3 / ((2.2 + 1.2) / 2) - 1)
    # data wait samples, sorted: 0 0 0.1 0.2 0.5 0.5
    assert f["data_wait_s"] == approx(1.3 / 6)
    assert f["data_wait_s/p50"] == approx(0.15)
    assert f["data_wait_s/p90"] == approx(0.5)
    assert f["data_wait_s/max"] == 0.5
    assert f["grad_norm"] == 0.5  # rank 0's (the clipped norm is the same everywhere)
    assert f["mem/peak_gb"] is None  # no rank has device memory on a CPU
    assert f["mem/host_peak_gb"] > 0
    # allreduce samples, sorted: 0.2 0.3 0.4 0.5 0.5 0.6
    assert f["comm/allreduce_s"] == approx(2.5 / 6)
    assert f["comm/allreduce_s/p50"] == approx(0.45)
    assert f["comm/allreduce_s/max"] == 0.6
    assert f["comm/exposed_s"] == approx(0.8 / 6)
    assert f["comm/exposed_s/max"] == 0.3
    assert f["comm/bytes"] == 100.0  # mean bytes per (rank, step)
    assert f["comm/busbw_gbps"] == approx(600 / 2.5 / 1e9 * 2 * 2 / 3)
    assert f["comm/overhead_frac"] == approx(0.8 / 9.8)


def test_aggregate_without_comm_figures_and_with_one_rank_missing_them():
    """No comm figure at all when no rank measured any; a rank without figures (NaN)
    is left out of the comm samples, not counted as zero, and its compute is its step
    time minus its waits."""
    plain = [{**r, "comm": None} for r in THREE_RANKS]
    f = aggregate([rank_vector(**r) for r in plain], world_size=3).figures
    assert not [name for name in f if name.startswith("comm/")]
    assert f["compute_s/slowest_rank"] == 1
    assert f["compute_s/excess_frac"] == pytest.approx(4.5 / ((2.7 + 1.3) / 2) - 1)

    mixed = [*THREE_RANKS[:2], {**THREE_RANKS[2], "comm": None}]
    f = aggregate([rank_vector(**r) for r in mixed], world_size=3).figures
    # allreduce samples of ranks 0 and 1 only: 0.4 0.5 0.5 0.6
    assert f["comm/allreduce_s"] == pytest.approx(0.5)
    assert f["comm/allreduce_s/p50"] == pytest.approx(0.5)
    assert f["comm/exposed_s"] == pytest.approx(0.7 / 4)
    assert f["comm/busbw_gbps"] == pytest.approx(bus_bandwidth(400 / 2.0 / 1e9, 3))
    # exposed time over the step time of the same (rank, step) samples: ranks 0 and 1
    assert f["comm/overhead_frac"] == pytest.approx(0.7 / 7.5)


def test_aggregate_busbw_is_none_for_one_rank():
    """One rank sends nothing over a bus: no bandwidth, per kind of collective either, but
    the other comm figures stay."""
    f = aggregate([rank_vector(**THREE_RANKS[0])], world_size=1).figures
    assert f["comm/busbw_gbps"] is None
    assert f["comm/overhead_frac"] == pytest.approx(0.5 / 3.0)
    assert f["compute_s/excess_frac"] == 0.0  # no other rank to be slower than
    kinds = {"all_gather": (0.4, 0.1, 800.0), "reduce_scatter": (0.2, 0.1, 400.0)}
    one = {**THREE_RANKS[0], "comm": [StepComm(0.6, 0.2, 1200, kinds)] * 2}
    f = aggregate([rank_vector(**one)], world_size=1).figures
    assert f["comm/allgather_bytes"] == 800.0 and f["comm/allgather_s"] == pytest.approx(0.4)
    assert f["comm/allgather_busbw_gbps"] is None and f["comm/reducescatter_busbw_gbps"] is None
    f = aggregate([rank_vector(**one)] * 2, world_size=2).figures
    assert f["comm/allgather_busbw_gbps"] == pytest.approx(bus_bandwidth(800 / 0.4 / 1e9, 2))


def test_aggregate_nonfinite_ranks_and_device_memory():
    """A rank whose loss went non-finite in any micro-step, or that has no finite mean loss
    (none recorded), is named; the device memory figure is the largest of the ranks that
    have one."""
    good = rank_vector(**THREE_RANKS[0])
    inf_step = rank_vector(**{**THREE_RANKS[1], "losses": [1.0, math.inf]})
    no_loss = Interval(steps=2, data_waits=[0.0, 0.0])
    nan_loss = local_figures(no_loss, [1.0, 1.0], None, CPU)
    assert nan_loss["nonfinite"] == 0.0 and math.isnan(nan_loss["loss"])  # not flagged, no loss
    good["mem_gb"], inf_step["mem_gb"] = 3.5, 7.25
    agg = aggregate([good, inf_step, nan_loss], world_size=3)
    assert agg.nonfinite_ranks == [1, 2]
    assert math.isnan(agg.loss)
    assert agg.figures["mem/peak_gb"] == 7.25


def test_step_figures_union_exposed_and_bytes():
    """allreduce_s is the union of the buckets' [ready, done] spans (overlaps counted once,
    gaps not at all), exposed is max(done) - max(ready), bytes is the sum."""
    buckets = [(0.0, 1.0, 10), (0.5, 1.5, 20), (3.0, 3.5, 5)]
    assert step_figures(buckets) == StepComm(2.0, 0.5, 35)
    # The last-ready bucket finishes first: the step still waits for the earlier one.
    assert step_figures([(0.0, 5.0, 1), (2.0, 3.0, 1)]) == StepComm(5.0, 3.0, 2)
    # All communication finished before the last bucket was ready... except that bucket.
    assert step_figures([(0.0, 1.0, 4), (4.0, 4.0, 4)]) == StepComm(1.0, 0.0, 8)
    assert step_figures([]) == StepComm(0.0, 0.0, 0)


def test_bus_bandwidth_is_nccl_tests_formula():
    """busbw = algbw * 2 (n - 1) / n."""
    assert bus_bandwidth(10.0, 2) == 10.0
    assert bus_bandwidth(12.0, 4) == 18.0
    assert bus_bandwidth(5.0, 1) == 0.0
