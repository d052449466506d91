"""The eval: the mean loss over the same held-out batches at any world size, and a stop
request between two batches cuts it short (nothing logged)."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

from launcher.config.batch import BatchPlan
from launcher.config.schema import ModelConfig
from launcher.model.build import loss_function
from launcher.runtime.process import Runtime
from launcher.train.evaluate import Evaluator

from in_process import CPU


class MeanOfInputs(torch.nn.Module):
    """A 'model' whose loss is the mean of its input ids: the eval's arithmetic shows."""

    def forward(self, x, targets):
        return x.float().mean()


class Strategy:
    module = MeanOfInputs()

    def autocast(self):
        return contextlib.nullcontext()


WINDOWS = [(torch.full((4,), float(i)), torch.zeros(4)) for i in range(8)]
BATCH = BatchPlan(global_batch=2, micro_batch=2, world_size=1, seq_len=4)


def evaluator(stop_after: int | None = None) -> Evaluator:
    polls = iter(range(100))
    stop = (lambda: next(polls) + 1 >= stop_after) if stop_after else (lambda: False)
    rt = Runtime(0, 0, 1, CPU, None)
    return Evaluator(rt, Strategy(), WINDOWS, 2, loss_function(ModelConfig()), stop)


def test_the_eval_loss_is_the_mean_over_its_batches():
    figures = evaluator()(10, BATCH)
    # 2 eval batches of 1 micro-step: windows 0-1 (mean 0.5) and 2-3 (mean 2.5)
    assert figures["eval/loss"] == pytest.approx(1.5)
    assert figures["eval/ppl"] == pytest.approx(math.exp(1.5))
    assert figures["step"] == 10 and figures["eval/time_s"] >= 0
    assert Strategy.module.training


def test_a_stop_between_batches_cuts_the_eval_short():
    assert evaluator(stop_after=1)(10, BATCH) is None
    assert Strategy.module.training  # back to training mode for the stop's checkpoint
