"""The micro-batch search and retry's pure parts: the sizes tried (halved, each dividing the
per-rank batch), the accumulation that keeps the global batch, the first size every rank
fits, and the capacity fault that raises the device's out-of-memory error."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from launcher.config.batch import BatchPlan
from launcher.config.schema import FaultConfig
from launcher.resilience.faults import FaultInjector
from launcher.runtime.process import Runtime
from launcher.train import micro_batch

from in_process import CPU, trainer


@pytest.mark.parametrize(
    ("micro", "per_rank", "smaller"),
    [(8, 8, [4, 2, 1]), (12, 12, [6, 3, 1]), (10, 10, [5, 2, 1]), (6, 12, [3, 1]), (1, 4, [])],
)
def test_smaller_micro_batches_halve_and_divide(micro, per_rank, smaller):
    plan = BatchPlan(global_batch=2 * per_rank, micro_batch=micro, world_size=2, seq_len=8)
    assert plan.smaller_micro_batches() == smaller


def test_auto_starts_at_the_per_rank_batch_and_a_resize_keeps_the_global_batch():
    plan = BatchPlan.of(trainer(global_batch_size=16, micro_batch_size="auto"), 2)
    assert (plan.micro_batch, plan.accum, plan.per_rank) == (8, 1, 8)
    half = plan.with_micro_batch(2)
    assert (half.global_batch, half.per_rank, half.accum) == (16, 8, 4)
    assert half.tokens_per_step == plan.tokens_per_step


def rank0() -> Runtime:
    return Runtime(0, 0, 1, CPU, None)


def test_search_takes_the_first_size_that_fits():
    tried = []

    def trial(micro: int) -> None:
        tried.append(micro)
        if micro > 3:
            raise torch.OutOfMemoryError("too big")

    plan = BatchPlan(global_batch=24, micro_batch=12, world_size=2, seq_len=8)
    chosen = micro_batch.search(plan, rank0(), trial)
    assert tried == [12, 6, 3]
    assert (chosen.micro_batch, chosen.accum, chosen.global_batch) == (3, 4, 24)


def test_search_and_halving_end_with_the_out_of_memory_error_below_1():
    def trial(_micro: int) -> None:
        raise torch.OutOfMemoryError("nothing fits")

    plan = BatchPlan(global_batch=8, micro_batch=4, world_size=2, seq_len=8)
    with pytest.raises(
        torch.OutOfMemoryError, match=r"not even a micro-batch of 1 fits \(tried 4, 2, 1\)"
    ):
        micro_batch.search(plan, rank0(), trial)
    one = plan.with_micro_batch(1)
    assert micro_batch.halved(plan, 3, [0], rank0()).micro_batch == 2
    with pytest.raises(torch.OutOfMemoryError, match="has no smaller one"):
        micro_batch.halved(one, 3, [0], rank0())


def test_the_capacity_fault_raises_above_its_size_from_its_step(tmp_path):
    cfg = OmegaConf.structured(FaultConfig(kind="oom", rank=0, step=5, micro_batch=2))
    (tmp_path / "logs").mkdir()
    fault = FaultInjector(cfg, rank=0, run_dir=tmp_path)
    fault.before_forward(4, 8)  # before its step: nothing
    fault.before_forward(5, 2)  # fits
    with pytest.raises(
        torch.OutOfMemoryError, match="a micro-batch of 4 is above fault.micro_batch=2"
    ):
        fault.before_forward(5, 4)
    fault.before_step(5)  # the capacity is no one-off event at fault.step
    other = FaultInjector(cfg, rank=1, run_dir=tmp_path)
    other.before_forward(9, 64)  # another rank's device holds it
