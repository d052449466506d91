"""The held-out loss at eval steps: the same sequences whatever the world size, so eval
losses compare across runs, and cut short between two batches by a stop request."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import torch
from torch.utils.data import Dataset

from launcher.config.batch import BatchPlan
from launcher.data.loader import build_eval_batches
from launcher.model.build import LossFunction
from launcher.runtime.process import Runtime
from launcher.strategy.base import Strategy

log = logging.getLogger("launcher")


class Evaluator:
    def __init__(
        self,
        rt: Runtime,
        strategy: Strategy,
        val: Dataset,
        eval_batches: int,
        loss: LossFunction,  # the model's (launcher.model.build.loss_function)
        stop_requested: Callable[[], bool],
    ):
        self.rt, self.strategy, self.val = rt, strategy, val
        self.eval_batches = eval_batches
        self.loss = loss
        self.stop_requested = stop_requested

    @torch.no_grad()
    def __call__(self, step: int, batch: BatchPlan) -> dict | None:
        """The eval figures after `step`, or None when the ranks agreed to stop during it
        (the stop vote is polled between batches: every rank evaluates the same number)."""
        rt, module = self.rt, self.strategy.module
        started = time.perf_counter()
        module.eval()
        # eval_batches global batches of held-out windows, split over the ranks
        batches = build_eval_batches(
            self.val,
            micro_batch=batch.micro_batch,
            num_batches=self.eval_batches * batch.accum,
            rank=rt.rank,
            world_size=rt.world_size,
        )
        total = torch.zeros((), device=rt.device)
        for done, (x, y) in enumerate(batches, 1):
            x, y = x.to(rt.device), y.to(rt.device)
            with self.strategy.autocast():
                total += self.loss(module, x, y)
            if done < len(batches) and self.stop_requested():
                module.train()
                if rt.is_main:
                    log.warning(
                        "stop requested during the eval after step %d: eval cut short after "
                        "%d of %d batches (not logged); checkpointing step %d",
                        step, done, len(batches), step,
                    )  # fmt: skip
                return None
        module.train()
        per_rank = rt.all_gather_floats([total.item() / len(batches)])
        loss = sum(v for (v,) in per_rank) / len(per_rank)
        return {
            "step": step,
            "eval/loss": loss,
            "eval/ppl": math.exp(min(loss, 50.0)),
            "eval/time_s": time.perf_counter() - started,
        }
