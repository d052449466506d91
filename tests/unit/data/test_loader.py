"""The step sampler: one global batch split alike at any world size, resumed at a step."""

from __future__ import annotations

import itertools

from launcher.config.batch import BatchPlan
from launcher.data.loader import StepBatchSampler

from in_process import trainer


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


def test_sampler_skips_the_windows_a_rewind_passed():
    """Given windows to skip, the sampler never reads them: each step reads the next window
    not skipped, as an uninterrupted sampler reads it there, and `windows()` names the
    window each step reads (the trainer's data position)."""
    plan = BatchPlan.of(trainer(global_batch_size=12, micro_batch_size=3), 2)
    for rank in (0, 1):
        whole = rank_steps(plan, rank, 9)
        skip = frozenset({3, 4, 7})
        sampler = StepBatchSampler(50, plan, rank=rank, seed=3, start_step=2, skip=skip)
        read = list(itertools.islice(iter(sampler), 4 * plan.accum))
        steps = [read[s * plan.accum : (s + 1) * plan.accum] for s in range(4)]
        assert list(itertools.islice(sampler.windows(), 4)) == [2, 5, 6, 8]
        assert steps == [whole[2], whole[5], whole[6], whole[8]]
