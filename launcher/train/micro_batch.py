"""The micro-batch that fits the device: trainer.micro_batch_size=auto's search at start,
and trainer.on_oom=retry's next size after a step ran out of memory (docs/faults.md), with
the forward and backward passes both run (`MicroSteps`) and the out-of-memory ending.

Both keep the global batch (accumulation makes up the rest: launcher.train.batch) and both
decide together: every rank's verdict is gathered, so that all ranks run one micro-batch
and enter the same collectives.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Iterator

import torch

from launcher.config.batch import BatchPlan
from launcher.model.build import LossFunction
from launcher.observe import memory_snapshot
from launcher.observe.metrics import Interval
from launcher.observe.profiling import trace_dir
from launcher.resilience.faults import FaultInjector
from launcher.runtime.process import Runtime
from launcher.strategy.base import Strategy

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


class OutOfMemory(RuntimeError):
    """The device ran out of memory; the message names the snapshot written for it."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


def out_of_memory(exc: torch.OutOfMemoryError, step: int, rt: Runtime) -> OutOfMemory:
    """Write a memory snapshot of the full device, then the one line that says where."""
    path = memory_snapshot.dump(trace_dir(rt) / f"oom_memory_snapshot.step{step}.pickle")
    where = (
        f"memory snapshot: {path} (open at https://pytorch.org/memory_viz)"
        if path
        else ("no memory snapshot could be written")
    )
    first = str(exc).splitlines()[0] if str(exc) else "out of memory"
    return OutOfMemory(
        f"CUDA out of memory on rank {rt.rank} in step {step} ({first}); {where}; "
        "lower the memory per step: trainer.grad_checkpointing=true, or a smaller "
        "trainer.micro_batch_size (trainer.global_batch_size stays: accumulation makes "
        "up the rest)",
        step,
    )


class MicroSteps:
    """The forward and backward passes of a step's micro-batches, and of the trials that
    find the micro-batch that fits, with the rehearsed faults' forward and loss hooks."""

    def __init__(
        self,
        rt: Runtime,
        strategy: Strategy,
        loss: LossFunction,  # the model's (launcher.model.build.loss_function)
        faults: FaultInjector,
        retry: bool,  # trainer.on_oom=retry
    ):
        self.rt, self.strategy, self.faults, self.retry = rt, strategy, faults, retry
        self.loss = loss
        self.oom_ranks: list[int] = []  # the ranks that ran out of memory in the last step

    def forward(self, step: int, micro: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with self.strategy.autocast():
            self.faults.before_forward(step, micro)
            return self.loss(self.strategy.module, x, y)

    def accumulate(
        self, step: int, plan: BatchPlan, batches: Iterator, interval: Interval
    ) -> list[torch.Tensor] | None:
        """Forward and backward of step `step`'s micro-batches (1-based), gradients
        accumulated; the losses, or None when a rank ran out of memory before the gradients
        were synchronised (trainer.on_oom=retry). Every rank votes once, before the last
        micro-step's backward (where DDP synchronises): a rank that ran out earlier votes at
        once, so all ranks meet at that vote. An out-of-memory after it (that synchronising
        backward, half done on some ranks) is not retried: it stops the run as with
        on_oom=stop."""
        rt, accum = self.rt, plan.accum
        losses, voted = [], not self.retry
        try:
            for micro in range(accum):
                waited = time.perf_counter()
                x, y = next(batches)
                interval.add_data_wait(time.perf_counter() - waited)
                x = x.to(rt.device, non_blocking=True)
                y = y.to(rt.device, non_blocking=True)
                last = micro == accum - 1
                with self.strategy.micro_step(last):
                    loss = self.forward(step, plan.micro_batch, x, y) / accum
                    loss = self.faults.poison(step, loss)
                    if last and not voted:
                        self.oom_ranks, voted = ranks_out_of_memory(rt, False), True
                        if self.oom_ranks:
                            return None
                    self.strategy.backward(loss)
                losses.append(loss)
        except torch.OutOfMemoryError:
            if voted:
                raise
            self.oom_ranks = ranks_out_of_memory(rt, True)
            return None
        return losses

    def fitting(self, plan: BatchPlan, step: int, seq_len: int) -> BatchPlan:
        """trainer.micro_batch_size=auto: `search` with trials of the real model, each one
        forward and backward of `micro` sequences with nothing kept: no gradient, no random
        number drawn (dropout's), so the run is the one launched at the size chosen."""
        rt, strategy = self.rt, self.strategy

        def trial(micro: int) -> None:
            x = torch.zeros((micro, seq_len), dtype=torch.long, device=rt.device)
            on_gpu = [rt.device] if rt.device.type == "cuda" else []
            try:
                with torch.random.fork_rng(devices=on_gpu), strategy.micro_step(False):
                    strategy.backward(self.forward(step, micro, x, x))
            finally:
                strategy.zero_grad()

        return search(plan, rt, trial)

    def smaller(self, plan: BatchPlan, step: int) -> BatchPlan:
        """Step `step` ran out of memory on `oom_ranks` (trainer.on_oom=retry): its gradients
        thrown away, what it left freed, and the plan it is redone with (`halved`)."""
        self.strategy.zero_grad()
        free_device_memory(self.rt.device)
        return halved(plan, step, self.oom_ranks, self.rt)
