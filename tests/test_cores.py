"""Unit tests of the pure cores that the launch tests reach only through torchrun.

Each section pins the invariants its arithmetic fixes, on fabricated inputs, in one
process: metric aggregation, the LR schedule, the checkpoint writer (two ranks as two
threads sharing a barrier), the stop vote (a real signal, a real one-rank gloo group),
PowerSGD on a fabricated bucket, and the batch arithmetic with the data order built on it.
"""

from __future__ import annotations

import datetime
import itertools
import json
import math
import os
import signal
import threading
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from launcher.checkpoint import protocol as checkpoint
from launcher.checkpoint.protocol import (
    LATEST,
    META,
    SUPERSEDED,
    CheckpointWriter,
    find_resumable,
    is_complete,
    read_meta,
    scan,
    step_name,
)
from launcher.config import TrainerConfig, compose, typed
from launcher.data.loader import StepBatchSampler
from launcher.observe.comm_stats import StepComm, bus_bandwidth, step_figures
from launcher.observe.metrics import Interval, aggregate, local_figures, percentile
from launcher.resilience import preemption
from launcher.resilience.preemption import StopVote, install_stop_handlers, stop_requested
from launcher.strategy.ddp.comm_hooks import make_hook
from launcher.strategy.ddp.powersgd import PowerSGDState, load_state, powersgd_hook, save_state
from launcher.train.batch import BatchPlan
from launcher.train.job import is_secret_key, redacted
from launcher.train.loop import lr_at

CPU = torch.device("cpu")


@pytest.fixture
def gloo_world():
    """A real one-rank gloo process group for the test, destroyed afterwards."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        # Every piece of work the test issued done first: a gloo group destroyed while one
        # of its threads still completes a future once aborted the worker (a thread joined
        # from itself: "Resource deadlock avoided").
        dist.barrier()
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------
# 1. Metric aggregation
# ---------------------------------------------------------------------------------------


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


def approx(x: float):
    """Equal up to float rounding: the figures are sums of a few binary fractions."""
    return pytest.approx(x, rel=1e-12, abs=1e-12)


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


# ---------------------------------------------------------------------------------------
# 2. LR schedule
# ---------------------------------------------------------------------------------------


def trainer(**overrides):
    """The trainer section as the loop gets it: the real schema, validated by OmegaConf."""
    return OmegaConf.structured(TrainerConfig(**overrides))


def test_lr_warmup_is_linear_up_to_lr():
    """Step s < warmup trains at lr * (s + 1) / warmup: the first step at lr / warmup, the
    last warm-up step at lr, and the first decay step at lr too (cosine at 0)."""
    t = trainer(lr=1e-3, warmup_steps=4, max_steps=20, min_lr_ratio=0.1)
    assert [lr_at(s, t) for s in range(4)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert lr_at(4, t) == pytest.approx(1e-3)


def test_lr_cosine_reaches_min_exactly_at_decay_end_then_stays():
    """Cosine from lr to lr * min_lr_ratio: halfway at the midpoint, exactly the minimum
    at lr_decay_steps (default max_steps) and flat after it."""
    t = trainer(lr=1e-3, warmup_steps=4, max_steps=20, min_lr_ratio=0.1)
    assert lr_at(12, t) == pytest.approx(1e-4 + 0.5 * (1e-3 - 1e-4))
    assert lr_at(20, t) == 1e-3 * 0.1
    assert [lr_at(s, t) for s in (21, 50, 1000)] == [1e-3 * 0.1] * 3
    early = trainer(lr=1e-3, warmup_steps=4, max_steps=20, min_lr_ratio=0.1, lr_decay_steps=10)
    assert lr_at(7, early) == pytest.approx(1e-4 + 0.5 * (1e-3 - 1e-4))
    assert [lr_at(s, early) for s in range(10, 21)] == [1e-3 * 0.1] * 11
    assert lr_at(9, early) > 1e-4


def test_lr_is_monotone_after_warmup_and_bounded():
    """After warm-up the rate never rises, and it always lies in [lr * min_lr_ratio, lr]."""
    for warmup, ratio in ((0, 0.0), (3, 0.1), (10, 0.5)):
        t = trainer(lr=6e-4, warmup_steps=warmup, max_steps=50, min_lr_ratio=ratio)
        rates = [lr_at(s, t) for s in range(warmup, 60)]
        assert rates[0] == pytest.approx(6e-4)
        assert all(a >= b for a, b in itertools.pairwise(rates))
        assert all(6e-4 * ratio <= r <= 6e-4 * (1 + 1e-12) for r in rates)
    assert lr_at(0, trainer(lr=6e-4, warmup_steps=0, max_steps=50)) == pytest.approx(6e-4)


# ---------------------------------------------------------------------------------------
# 3. Checkpoint writer
# ---------------------------------------------------------------------------------------


class RankFailed(RuntimeError):
    """The fabricated failure of one rank's write."""


def save_on_two_ranks(folder: Path, step: int, *, fail_rank=None, meta=None, keep=5, probe=None):
    """Save `step` with two writers (rank 0 main, rank 1 not) on two threads that share a
    barrier and an all-gather, as two processes would. Each rank writes
    `model_rank<r>.pt`. A failing rank raises in its write; the writers compare notes in
    the gather, so both give up together. Returns each rank's exception or None."""
    barrier = threading.Barrier(2, timeout=20)
    errors: list[BaseException | None] = [None, None]
    meta = {"lineage": "L1"} if meta is None else meta
    shared: list = [None, None]

    def gather_of(r: int):
        def gather(obj) -> list:
            shared[r] = obj
            barrier.wait()
            out = list(shared)
            barrier.wait()  # both have read before either writes the next one
            return out

        return gather

    def rank(r: int) -> None:
        writer = CheckpointWriter(
            folder, is_main=r == 0, barrier=barrier.wait, keep=keep, meta=dict(meta),
            gather=gather_of(r),
        )  # fmt: skip

        def write(tmp: Path) -> None:
            if probe is not None:
                probe(r, tmp)
            if r == fail_rank:
                raise RankFailed(f"rank {r} could not write")
            torch.save({"rank": r, "step": step}, tmp / f"model_rank{r}.pt")

        try:
            writer.save(step, write, {"world_size": 2})
        except checkpoint.CheckpointNotWritten as exc:
            errors[r] = exc  # every rank raises it, after the last collective
        except BaseException as exc:
            errors[r] = exc
            barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    return errors


def test_two_rank_save_is_complete_with_meta_and_pointer(tmp_path):
    """Both ranks' files land in step_<n>/ with a meta.json listing them at their sizes,
    the step, the lineage and the extra meta; `latest` names it; nothing temporary stays."""
    assert save_on_two_ranks(tmp_path, 10) == [None, None]
    final = tmp_path / step_name(10)
    meta = read_meta(final)
    assert meta["step"] == 10 and meta["lineage"] == "L1" and meta["world_size"] == 2
    assert meta["files"] == {
        name: (final / name).stat().st_size for name in ("model_rank0.pt", "model_rank1.pt")
    }
    assert is_complete(final)
    assert (tmp_path / LATEST).read_text() == step_name(10) + "\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [LATEST, step_name(10)]
    assert find_resumable(tmp_path) == final
    found = scan(tmp_path)
    assert found.complete == [final] and not found.leftovers and found.pointer_problem is None
    assert torch.load(final / "model_rank1.pt")["rank"] == 1


def test_checkpoint_appears_only_complete(tmp_path):
    """While the ranks write, the step's folder does not exist under its name and resume
    still finds the previous checkpoint; `latest` still names that one."""
    save_on_two_ranks(tmp_path, 10)
    seen = []

    def probe(rank: int, tmp: Path) -> None:
        seen.append(
            (
                rank,
                tmp.name,
                (tmp_path / step_name(20)).exists(),
                find_resumable(tmp_path),
                (tmp_path / LATEST).read_text(),
            )
        )

    assert save_on_two_ranks(tmp_path, 20, probe=probe) == [None, None]
    for _, tmp_name, final_exists, resumable, latest in seen:
        assert tmp_name == f".tmp-{step_name(20)}"
        assert not final_exists
        assert resumable == tmp_path / step_name(10)
        assert latest == step_name(10) + "\n"
    assert sorted(r for r, *_ in seen) == [0, 1]
    assert find_resumable(tmp_path) == tmp_path / step_name(20)


@pytest.mark.parametrize("fail_rank", [0, 1])
def test_failed_write_on_one_rank_leaves_previous_checkpoint(tmp_path, fail_rank):
    """A rank whose write raises leaves no checkpoint resume would pick: both ranks give
    up together with the same line naming the rank, the previous one stays complete,
    `latest` names it, and the half-written folder is removed."""
    save_on_two_ranks(tmp_path, 10)
    errors = save_on_two_ranks(tmp_path, 20, fail_rank=fail_rank)
    assert all(isinstance(e, checkpoint.CheckpointNotWritten) for e in errors), errors
    assert str(errors[0]) == str(errors[1])
    assert f"rank {fail_rank}: RankFailed: rank {fail_rank} could not write" in str(errors[0])
    assert not (tmp_path / step_name(20)).exists()
    assert find_resumable(tmp_path) == tmp_path / step_name(10)
    assert is_complete(tmp_path / step_name(10))
    assert (tmp_path / LATEST).read_text() == step_name(10) + "\n"
    found = scan(tmp_path)
    assert found.leftovers == []
    assert found.incomplete == [] and found.pointer_problem is None


def test_pruning_keeps_newest_of_this_lineage_only(tmp_path):
    """With keep=2 only this lineage's two newest complete checkpoints remain; another
    lineage's checkpoints are never deleted, older or newer."""
    save_on_two_ranks(tmp_path, 5, meta={"lineage": "other"})
    save_on_two_ranks(tmp_path, 25, meta={"lineage": "other"})
    for step in (10, 20, 30, 40):
        assert save_on_two_ranks(tmp_path, step, keep=2) == [None, None]
    assert [p.name for p in scan(tmp_path).complete] == [step_name(s) for s in (40, 30, 25, 5)]
    assert read_meta(tmp_path / step_name(25))["lineage"] == "other"


def test_pruning_never_deletes_ahead_of_the_run(tmp_path):
    """A rewound run writing step 20 with keep=1 keeps its own step 30 (newer than what it
    just wrote) and deletes only its step 10."""
    for step in (10, 30):
        save_on_two_ranks(tmp_path, step, keep=5)
    save_on_two_ranks(tmp_path, 20, keep=1)
    assert [p.name for p in scan(tmp_path).complete] == [step_name(30), step_name(20)]


def test_adopted_lineage_is_pruned_and_meta_carried(tmp_path):
    """A resumed run takes over the lineage of the checkpoint it resumed from: its new
    checkpoints carry it, and that lineage's older checkpoints are pruned."""
    save_on_two_ranks(tmp_path, 10, meta={"lineage": "first"})
    calls = []
    writer = CheckpointWriter(
        tmp_path, is_main=True, barrier=lambda: calls.append(1), keep=1, meta={}
    )
    writer.adopt(tmp_path / step_name(10))
    writer.save(20, lambda tmp: (tmp / "m.pt").write_bytes(b"x"), {})
    assert read_meta(tmp_path / step_name(20))["lineage"] == "first"
    assert [p.name for p in scan(tmp_path).complete] == [step_name(20)]


def test_complete_checkpoint_at_same_step_is_superseded_not_replaced(tmp_path):
    """Writing a step that already has a complete checkpoint moves the old one under
    superseded/ (contents intact) and puts the new one in its place; an incomplete
    folder at that step is simply replaced."""
    save_on_two_ranks(tmp_path, 10, meta={"lineage": "old"})
    save_on_two_ranks(tmp_path, 10, meta={"lineage": "new"})
    assert read_meta(tmp_path / step_name(10))["lineage"] == "new"
    (aside,) = (tmp_path / SUPERSEDED).iterdir()
    assert aside.name.startswith(step_name(10) + "-")
    assert is_complete(aside) and read_meta(aside)["lineage"] == "old"

    broken = tmp_path / step_name(30)
    broken.mkdir()
    (broken / "model_rank0.pt").write_bytes(b"partial")
    save_on_two_ranks(tmp_path, 30)
    assert is_complete(broken)
    assert len(list((tmp_path / SUPERSEDED).iterdir())) == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


class FrozenClock:
    """checkpoint.dt with a clock that does not move: saves within the same second."""

    class datetime(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(2026, 1, 1, 12, 0, 0)


def test_same_step_superseded_twice_in_one_second_keeps_both(tmp_path, monkeypatch):
    """Each complete checkpoint a save supersedes is kept under superseded/, even when the
    same step is superseded twice within one second (the name carries only seconds), and
    the new checkpoint is sealed in place."""
    monkeypatch.setattr(checkpoint, "dt", FrozenClock)
    for lineage in ("first", "second", "third"):
        assert save_on_two_ranks(tmp_path, 10, meta={"lineage": lineage}) == [None, None]
    assert read_meta(tmp_path / step_name(10))["lineage"] == "third"
    aside = sorted(read_meta(p)["lineage"] for p in (tmp_path / SUPERSEDED).iterdir())
    assert aside == ["first", "second"]


def test_barrier_protocol_and_async_save(tmp_path):
    """A synchronous save calls the barrier three times (folder ready, files written,
    sealed; the last two carry each rank's problem, here as a plain barrier). An
    asynchronous save (write returns a Future) calls it twice (folder ready, writes
    started) and counts only once `complete()` has waited for it: until then no
    step_<n> exists; the next save completes it first (two more)."""
    calls = []
    writer = CheckpointWriter(tmp_path, is_main=True, barrier=lambda: calls.append(1), keep=5)
    writer.save(10, lambda tmp: (tmp / "a.pt").write_bytes(b"1"), {})
    assert len(calls) == 3 and is_complete(tmp_path / step_name(10))

    calls.clear()
    future: Future = Future()

    def write_later(tmp: Path) -> Future:
        (tmp / "a.pt").write_bytes(b"2")
        return future

    final = writer.save(20, write_later, {})
    assert final == tmp_path / step_name(20)
    assert len(calls) == 2 and not final.exists()
    assert find_resumable(tmp_path) == tmp_path / step_name(10)
    future.set_result(None)
    writer.save(30, lambda tmp: (tmp / "a.pt").write_bytes(b"3"), {})
    assert len(calls) == 2 + 2 + 3
    assert [p.name for p in scan(tmp_path).complete] == [step_name(s) for s in (30, 20, 10)]
    assert json.loads((final / META).read_text())["step"] == 20
    writer.complete()  # nothing in progress: no barrier
    assert len(calls) == 7


def test_async_save_whose_files_fail_is_not_sealed(tmp_path):
    """An asynchronous write that fails raises from complete() and leaves no checkpoint,
    nor its temporary folder."""
    writer = CheckpointWriter(tmp_path, is_main=True, barrier=lambda: None, keep=5)
    future: Future = Future()
    writer.save(10, lambda tmp: future, {})
    future.set_exception(RankFailed("the device went away"))
    with pytest.raises(checkpoint.CheckpointNotWritten, match="rank 0: RankFailed: the device"):
        writer.complete()
    assert find_resumable(tmp_path) is None
    assert scan(tmp_path).leftovers == []
    assert checkpoint.candidates(tmp_path) == []


# ---------------------------------------------------------------------------------------
# 4. Stop vote
# ---------------------------------------------------------------------------------------


@pytest.fixture
def stop_request():
    """Reset the process's stop request and restore the signal handlers afterwards."""
    saved = {sig: signal.getsignal(sig) for sig in preemption.STOP_SIGNALS}
    preemption._Request.signal_name = None
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        preemption._Request.signal_name = None


def test_sigterm_sets_the_request_and_later_signals_keep_the_first(stop_request):
    """A real SIGTERM to this process, once the handlers are in, is kept as a request
    (the process lives on); a later SIGINT does not rename it."""
    install_stop_handlers()
    assert not stop_requested()
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop_requested()
    assert preemption._Request.signal_name == "SIGTERM"
    os.kill(os.getpid(), signal.SIGINT)
    assert preemption._Request.signal_name == "SIGTERM"


def test_handlers_are_installed_only_from_the_main_thread(stop_request):
    """From another thread install_stop_handlers changes nothing (Python would raise)."""
    before = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=install_stop_handlers)
    thread.start()
    thread.join()
    assert signal.getsignal(signal.SIGTERM) is before


def test_vote_without_process_group_is_the_local_request(stop_request):
    """With no process group, poll answers this process's request at once."""
    assert not dist.is_initialized()
    install_stop_handlers()
    vote = StopVote()
    assert vote.poll() is False
    os.kill(os.getpid(), signal.SIGHUP)
    assert vote.poll() is True


def test_vote_is_decided_one_boundary_later(stop_request, gloo_world):
    """With a process group, poll at boundary k returns boundary k-1's all-gather: a
    request made between boundaries k-1 and k is answered True at k+1, never at k."""
    install_stop_handlers()
    vote = StopVote(gloo_world)
    assert vote.poll() is False  # boundary 1: no earlier vote
    assert vote.poll() is False  # boundary 2: boundary 1 voted no
    os.kill(os.getpid(), signal.SIGTERM)
    assert vote.poll() is False  # boundary 3: boundary 2's vote, taken before the signal
    assert vote.poll() is True  # boundary 4: boundary 3 voted yes
    vote.drain()

    fresh = StopVote(gloo_world)  # a request before the first boundary
    assert fresh.poll() is False
    assert fresh.poll() is True
    fresh.drain()


# ---------------------------------------------------------------------------------------
# 5. PowerSGD on a fabricated bucket
# ---------------------------------------------------------------------------------------


class Bucket:
    """What powersgd_hook uses of DDP's GradBucket: one flat buffer whose views are the
    gradients of `params` (in order), and whether it is the step's last bucket."""

    def __init__(self, params: list[torch.nn.Parameter], grads: list[torch.Tensor], last=True):
        self._params = params
        self._buffer = torch.cat([g.reshape(-1) for g in grads]).to(torch.float64)
        self._grads, offset = [], 0
        for g in grads:
            self._grads.append(self._buffer[offset : offset + g.numel()].view(g.shape))
            offset += g.numel()
        self._last = last

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def gradients(self) -> list[torch.Tensor]:
        return self._grads

    def parameters(self) -> list[torch.nn.Parameter]:
        return self._params

    def is_last(self) -> bool:
        return self._last


# name, shape, compressed at rank 2 with min_compression_rate 2 ((n + m) r 2 < n m)?
SHAPES = [("w", (16, 12), True), ("b", (5,), False), ("small", (3, 3), False)]
SHAPES.append(("conv", (8, 2, 5), True))  # folded to 8 x 10


def make_state(start_step=0, **kwargs):
    params = [torch.nn.Parameter(torch.zeros(shape)) for _, shape, _ in SHAPES]
    state = PowerSGDState(
        [(name, p) for (name, _, _), p in zip(SHAPES, params, strict=True)],
        matrix_rank=2,
        start_step=start_step,
        min_compression_rate=2.0,
        plain_hook=make_hook(None, None),
        epsilon=kwargs.pop("epsilon", 0.0),
        **kwargs,
    )
    return state, params


def random_grads(seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen, dtype=torch.float64) for _, shape, _ in SHAPES]


def run_hook(state, params, grads, last=True) -> list[torch.Tensor]:
    bucket = Bucket(params, grads, last)
    out = powersgd_hook(state, bucket).wait()
    assert out is bucket.buffer()
    return [g.clone() for g in bucket.gradients()]


def projection(matrix: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """One power-iteration step's rank-r approximation: M projected onto span(M Q)."""
    basis, _ = torch.linalg.qr(matrix @ q)
    return basis @ basis.T @ matrix


def test_powersgd_one_rank_is_rank_r_projection_with_exact_error(gloo_world):
    """At world size 1 each compressed matrix comes back as P Q^T = M projected onto the
    span of M Q0 (Q0 the seeded initial Q), rank r; vectors and small matrices come back
    exactly; the error kept is M - P Q^T; the step counts the last bucket."""
    state, params = make_state()
    grads = random_grads(0)
    out = run_hook(state, params, grads)
    assert state.step == 1
    for (name, shape, compressed), g, o in zip(SHAPES, grads, out, strict=True):
        if not compressed:
            assert torch.equal(o, g)
            assert name not in state.errors and name not in state.qs
            continue
        m = g.reshape(shape[0], -1)
        q0 = state.initial_q(name, m.shape[1], 2, m)
        expected = projection(m, q0)
        assert torch.allclose(o.reshape(m.shape), expected, atol=1e-10)
        assert torch.linalg.matrix_rank(o.reshape(m.shape)) == 2
        assert torch.allclose(state.errors[name], m - expected, atol=1e-10)
        assert state.qs[name].shape == (m.shape[1], 2)


def test_powersgd_error_feedback_and_warm_start(gloo_world):
    """The next step compresses M2 + error1 starting from last step's Q: its output is
    that sum projected onto span((M2 + e1) Q1), and output + new error = M2 + e1."""
    state, params = make_state()
    run_hook(state, params, random_grads(0))
    e1 = {name: state.errors[name].clone() for name in ("w", "conv")}
    q1 = {name: state.qs[name].clone() for name in ("w", "conv")}
    grads = random_grads(1)
    out = run_hook(state, params, grads)
    for (name, shape, compressed), g, o in zip(SHAPES, grads, out, strict=True):
        if not compressed:
            assert torch.equal(o, g)
            continue
        target = g.reshape(shape[0], -1) + e1[name]
        expected = projection(target, q1[name])
        assert torch.allclose(o.reshape(target.shape), expected, atol=1e-10)
        assert torch.allclose(o.reshape(target.shape) + state.errors[name], target, atol=1e-10)
    assert state.step == 2


def test_powersgd_plain_before_start_step_and_counts_only_last_buckets(gloo_world):
    """Below start_step the plain all-reduce runs (the bucket comes back unchanged at
    world size 1, no memory kept); only a step's last bucket advances the step count."""
    state, params = make_state(start_step=2)
    for seed, last, step_after in ((0, False, 0), (1, True, 1), (2, True, 2)):
        grads = random_grads(seed)
        out = run_hook(state, params, grads, last=last)
        assert all(torch.equal(o, g) for o, g in zip(out, grads, strict=True))
        assert state.errors == {} and state.qs == {}
        assert state.step == step_after
    grads = random_grads(3)
    out = run_hook(state, params, grads, last=False)  # step 2 reached: compression starts
    assert state.step == 2
    assert not torch.equal(out[0], grads[0]) and set(state.errors) == {"w", "conv"}


def test_powersgd_zero_gradient_stays_finite(gloo_world):
    """An all-zero matrix (a frozen layer) compresses to zeros, not NaN (the epsilon)."""
    state, params = make_state(epsilon=1e-8)
    grads = [torch.zeros_like(g) for g in random_grads(0)]
    out = run_hook(state, params, grads)
    assert all(torch.equal(o, torch.zeros_like(o)) for o in out)
    assert all(torch.isfinite(e).all() for e in state.errors.values())


def test_powersgd_state_round_trips_through_checkpoint_files(gloo_world, tmp_path):
    """save_state/load_state restore step, Q factors and errors, so the restored state's
    next step is bit-identical to the original's; a rank without its own file gets rank
    0's step and Qs without errors; a folder without any file restarts at its step."""
    state, params = make_state()
    run_hook(state, params, random_grads(0))
    run_hook(state, params, random_grads(1))
    folder = tmp_path / step_name(7)
    folder.mkdir()
    save_state(state, folder, rank=0)

    restored, restored_params = make_state()
    load_state(restored, folder, 0, CPU)
    assert restored.step == state.step == 2
    for name in ("w", "conv"):
        assert torch.equal(restored.qs[name], state.qs[name])
        assert torch.equal(restored.errors[name], state.errors[name])
    ours = run_hook(state, params, random_grads(2))
    theirs = run_hook(restored, restored_params, random_grads(2))
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))

    other, _ = make_state()
    load_state(other, folder, 1, CPU)
    assert other.step == 2 and other.errors == {} and set(other.qs) == {"w", "conv"}

    empty = tmp_path / step_name(42)
    empty.mkdir()
    fresh, _ = make_state()
    fresh.errors = {"w": torch.ones(1)}
    load_state(fresh, empty, 0, CPU)
    assert fresh.step == 42 and fresh.errors == {} and fresh.qs == {}
    save_state(None, empty, 0)
    load_state(None, folder, 0, CPU)
    assert list(empty.iterdir()) == []


# ---------------------------------------------------------------------------------------
# 6. Batch arithmetic
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("global_batch", "micro", "world", "per_rank", "accum", "tokens"),
    [
        (16, 4, 1, 16, 4, 16 * 128),
        (16, 4, 2, 8, 2, 16 * 128),
        (16, 4, 4, 4, 1, 16 * 128),
        (12, 3, 2, 6, 2, 12 * 128),
        (64, 1, 8, 8, 8, 64 * 128),
        (None, 4, 1, 4, 1, 4 * 128),
        (None, 4, 3, 4, 1, 12 * 128),
    ],
)
def test_batch_plan_arithmetic(global_batch, micro, world, per_rank, accum, tokens):
    """per_rank = global / world, accum = per_rank / micro, tokens = global * seq_len; a
    null global batch is one micro-batch per rank."""
    t = trainer(global_batch_size=global_batch, micro_batch_size=micro, seq_len=128)
    plan = BatchPlan.of(t, world)
    assert plan.problem() is None
    assert (plan.per_rank, plan.accum, plan.tokens_per_step) == (per_rank, accum, tokens)
    assert plan.accum * plan.micro_batch * plan.world_size == plan.global_batch


@pytest.mark.parametrize(
    ("global_batch", "micro", "world", "multiple"),
    [(16, 4, 3, 12), (10, 4, 1, 4), (16, 3, 2, 6), (8, 4, 4, 16)],
)
def test_batch_plan_problem_names_the_keys_and_the_multiple(global_batch, micro, world, multiple):
    """A global batch that micro x world does not divide is refused with one line naming
    both keys, their values, the world size and the multiple to choose; the data order
    refuses it with the same line."""
    plan = BatchPlan.of(trainer(global_batch_size=global_batch, micro_batch_size=micro), world)
    assert plan.problem() == (
        f"trainer.global_batch_size={global_batch} is not divisible by "
        f"trainer.micro_batch_size={micro} x world size {world} = {multiple}; "
        f"choose a global batch that is a multiple of {multiple}"
    )
    with pytest.raises(ValueError) as refused:
        StepBatchSampler(100, plan, rank=0, seed=0, start_step=0)
    assert str(refused.value) == plan.problem()


def rank_steps(plan: BatchPlan, rank: int, steps: int, *, num_windows=50, start_step=0):
    """The micro-batches rank `rank` reads over `steps` steps, grouped per step."""
    sampler = StepBatchSampler(num_windows, plan, rank=rank, seed=3, start_step=start_step)
    micro = list(itertools.islice(iter(sampler), steps * plan.accum))
    return [micro[s * plan.accum : (s + 1) * plan.accum] for s in range(steps)]


def test_sampler_splits_the_same_global_batch_across_world_sizes():
    """Each rank reads plan.per_rank sequences per step in plan.accum micro-batches of
    plan.micro_batch; their concatenation in rank order is world size 1's batch of that
    step, across an epoch end too (50 windows, 8 per step). Ranks read disjoint windows
    within an epoch; step 6 straddles the epoch end (stream positions 48-55), where a
    window may come once from each epoch's permutation."""
    t = trainer(global_batch_size=8, micro_batch_size=2)
    one = rank_steps(BatchPlan.of(t, 1), 0, 8)
    plan2 = BatchPlan.of(t, 2)
    two = [rank_steps(plan2, r, 8) for r in (0, 1)]
    for step in range(8):
        single = [i for m in one[step] for i in m]
        assert len(one[step]) == 4 and all(len(m) == 2 for m in one[step])
        parts = []
        for r in (0, 1):
            micro = two[r][step]
            assert len(micro) == plan2.accum == 2 and all(len(m) == 2 for m in micro)
            parts.append([i for m in micro for i in m])
        assert len(parts[0]) == len(parts[1]) == plan2.per_rank == 4
        if step != 6:
            assert not set(parts[0]) & set(parts[1])
        assert parts[0] + parts[1] == single
    first_epoch = [i for step in one[:6] for m in step for i in m]  # 48 of 50 windows
    assert len(set(first_epoch)) == 48 and set(first_epoch) <= set(range(50))


def test_sampler_resumes_at_the_step():
    """A sampler started at step k reads exactly what an uninterrupted one reads at k."""
    plan = BatchPlan.of(trainer(global_batch_size=12, micro_batch_size=3), 2)
    for rank in (0, 1):
        whole = rank_steps(plan, rank, 9)
        assert rank_steps(plan, rank, 4, start_step=5) == whole[5:]


# --- secrets in config.yaml -----------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("WANDB_API_KEY", True),
        ("hf_token", True),
        ("db-password", True),
        ("wandb_secret", True),
        ("tokenizer", False),
        ("shard_tokens", False),
        ("keep_checkpoints", False),
        ("monkey", False),
    ],
)
def test_secret_keys_are_whole_words(key, secret):
    """A key is masked when one of its words is a secret word, never for a word that only
    contains one (data.tokenizer, data.shard_tokens are settings a reader needs)."""
    assert is_secret_key(key) is secret


def test_redacted_config_masks_secret_values_only():
    cfg = typed(compose(["+cluster.env.WANDB_API_KEY=abc", "data.tokenizer=gpt2"]))
    out = redacted(cfg)
    assert out["cluster"]["env"]["WANDB_API_KEY"] == "***"
    assert out["data"]["tokenizer"] == "gpt2" and out["data"]["shard_tokens"] == 100_000_000
