"""Batch arithmetic: per-rank batch, accumulation and tokens per step, and the one line naming
the keys when a global batch does not divide."""

from __future__ import annotations

import pytest

from launcher.config.batch import BatchPlan
from launcher.data.loader import StepBatchSampler

from in_process import trainer


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
