"""`model.attention` in-process: which SDPA kernel the loss runs, the same loss and gradients
whichever it is, and the kernels a device or precision rules out refused in one line."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.profiler import profile

from launcher.config import ConfigError, compose
from launcher.config.schema import ATTENTION_BACKENDS, PRECISIONS
from launcher.model.build import build_model, loss_function
from launcher.preflight import attention_problem

from attention_ops import FLASH_CPU, MATH

VOCAB = 512


def sdpa_ops(impl: str, choice: str) -> tuple[set[str], float, list[torch.Tensor]]:
    """The SDPA operators one forward and backward ran, the loss and the gradients, with
    the loss function the model hands the loop."""
    torch.manual_seed(0)
    model_cfg = compose([f"model.impl={impl}", f"model.attention={choice}"]).model
    model = build_model(model_cfg, VOCAB)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, VOCAB, (2, 2, 32), generator=g)
    with profile() as prof:
        loss = loss_function(model_cfg)(model, x, y)
        loss.backward()
    names = {e.name for e in prof.events() if "scaled_dot_product" in e.name}
    return names, loss.item(), [p.grad for p in model.parameters()]


@pytest.mark.parametrize("impl", ["native", "hf"])
def test_each_kernel_runs_as_asked_with_the_same_loss(impl):
    found = {choice: sdpa_ops(impl, choice) for choice in ("auto", "flash", "math")}
    assert FLASH_CPU in found["flash"][0] and MATH not in found["flash"][0]
    assert MATH in found["math"][0] and FLASH_CPU not in found["math"][0]
    assert found["auto"][0] == found["flash"][0]  # PyTorch's own pick on the CPU
    _, flash_loss, flash_grads = found["flash"]
    _, math_loss, math_grads = found["math"]
    assert math_loss == pytest.approx(flash_loss, abs=1e-6)
    for a, b in zip(flash_grads, math_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_a_kernel_sdpa_cannot_run_is_one_line_naming_the_key():
    with pytest.raises(ConfigError) as raised:
        sdpa_ops("native", "efficient")  # no memory-efficient kernel on the CPU
    assert str(raised.value) == (
        "model.attention=efficient: SDPA cannot run that kernel for these inputs on this "
        "device (its warnings above say why); use model.attention=auto"
    )


def expected_problem(choice: str, on_cpu: bool, precision: str) -> str | None:
    if on_cpu and choice in ("efficient", "cudnn"):
        return "needs a CUDA GPU"
    if not on_cpu and choice in ("flash", "cudnn") and precision == "fp32":
        return "takes bf16 or fp16 inputs only"
    return None


@pytest.mark.parametrize(
    ("choice", "on_cpu", "precision"),
    list(itertools.product(ATTENTION_BACKENDS, (True, False), PRECISIONS)),
)
def test_every_kernel_device_and_precision(choice, on_cpu, precision):
    found = attention_problem(choice, on_cpu, precision)
    expected = expected_problem(choice, on_cpu, precision)
    if expected is None:
        assert found is None
    else:
        assert found.startswith(f"model.attention={choice} {expected}"), found
