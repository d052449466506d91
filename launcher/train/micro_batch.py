"""The micro-batch that fits the device: trainer.micro_batch_size=auto's search at start,
and trainer.on_oom=retry's next size after a step ran out of memory (docs/faults.md).

Both keep the global batch (accumulation makes up the rest: launcher.config.batch) and both
decide together: every rank's verdict is gathered, so that all ranks run one micro-batch
and enter the same collectives.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable

import torch

from launcher.config.batch import BatchPlan
from launcher.runtime.process import Runtime

log = logging.getLogger("launcher")


def free_device_memory(device: torch.device) -> None:
    """What an out-of-memory step left behind (its activations, once unreferenced) back to
    the device, so that the smaller micro-batch starts from the memory a fresh step has."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def ranks_out_of_memory(rt: Runtime, failed: bool) -> list[int]:
    """The ranks that ran out of memory, agreed by all: one tiny all-gather."""
    return [r for r, (flag,) in enumerate(rt.all_gather_floats([float(failed)])) if flag]


def search(plan: BatchPlan, rt: Runtime, trial: Callable[[int], None]) -> BatchPlan:
    """`plan` at the largest micro-batch, from its own (the per-rank batch) down, that fits
    on every rank: each size is tried by `trial(micro)` (a forward and backward of the real
    model, which throws its gradients away), and the first that no rank ran out of memory
    with is taken. Raises torch.OutOfMemoryError when not even 1 fits."""
    tried = []
    for micro in [plan.micro_batch, *plan.smaller_micro_batches()]:
        try:
            trial(micro)
            failed = False
        except torch.OutOfMemoryError:
            failed = True
        free_device_memory(rt.device)
        tried.append(micro)
        if not ranks_out_of_memory(rt, failed):
            chosen = plan.with_micro_batch(micro)
            log.info(
                "trainer.micro_batch_size=auto: %d sequences per micro-batch fit (tried %s), "
                "%d micro-steps per rank, global batch %d kept",
                micro, ", ".join(map(str, tried)), chosen.accum, chosen.global_batch,
            )  # fmt: skip
            return chosen
    raise torch.OutOfMemoryError(
        f"trainer.micro_batch_size=auto: not even a micro-batch of 1 fits (tried "
        f"{', '.join(map(str, tried))})"
    )


def halved(plan: BatchPlan, step: int, ranks: list[int], rt: Runtime) -> BatchPlan:
    """`plan` at the next smaller micro-batch after step `step` ran out of memory on `ranks`
    (trainer.on_oom=retry), said in one line; torch.OutOfMemoryError when none is left."""
    smaller = plan.smaller_micro_batches()
    if not smaller:
        raise torch.OutOfMemoryError(
            f"a micro-batch of {plan.micro_batch} does not fit on rank(s) {ranks} and "
            "trainer.on_oom=retry has no smaller one"
        )
    new = plan.with_micro_batch(smaller[0])
    (log.warning if rt.is_main else log.info)(
        "out of memory in step %d on rank(s) %s: micro-batch %d -> %d, %d -> %d micro-steps "
        "per rank (global batch %d kept); the step is redone from its start "
        "(trainer.on_oom=retry)",
        step, ranks, plan.micro_batch, new.micro_batch, plan.accum, new.accum,
        plan.global_batch,
    )  # fmt: skip
    return new
