"""GPT-2 construction, FLOPs per token and MFU, against figures worked out by hand."""

import math

import pytest
import torch
from omegaconf import OmegaConf

from launcher.config import compose
from launcher.model.build import (
    build_model,
    count_params,
    flops_per_token,
    mfu,
    padded_vocab_size,
    peak_flops,
)


def test_gpt2_124m_flops_match_nanogpt_formula():
    cfg = compose(["model=gpt2", "model.impl=hf"])
    model = build_model(cfg.model, 50257, grad_checkpointing=False)
    # GPT-2 124M with the vocabulary padded to 50304 (a multiple of 64), as nanoGPT does.
    assert model.config.vocab_size == 50304
    assert count_params(model, exclude_position_embeddings=False) == 124_475_904
    n = 124_475_904 - 1024 * 768
    assert flops_per_token(model, 1024) == 6 * n + 12 * 12 * 12 * 64 * 1024 == 855_383_040


def test_model_uses_sdpa_attention():
    cfg = compose(["model.impl=hf"])
    model = build_model(cfg.model, 512, grad_checkpointing=False)
    assert model.config._attn_implementation == "sdpa"


def test_grad_checkpointing_gives_the_same_gradients():
    """transformers' switch (the native module's: tests/unit/model/test_gpt2.py)."""
    cfg = compose(["model.impl=hf"])
    torch.manual_seed(0)
    plain = build_model(cfg.model, 512, grad_checkpointing=False)
    torch.manual_seed(0)
    ckpt = build_model(cfg.model, 512, grad_checkpointing=True)
    x = torch.randint(0, 512, (2, 32))
    for m in (plain, ckpt):
        m.train()
        m(input_ids=x).logits.sum().backward()
    for (name, a), (_, b) in zip(plain.named_parameters(), ckpt.named_parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, msg=name)
    active = getattr(ckpt, "is_activation_checkpointing", None)
    if active is None:
        active = ckpt.is_gradient_checkpointing
    assert active


def test_mfu_is_null_without_a_known_peak():
    assert peak_flops(torch.device("cpu")) is None
    assert mfu(1e6, 8.55e8, None, 8) is None
    # 1.16M tokens/s at 0.855 GFLOP/token on one 989 TFLOP/s GPU is about 100%.
    assert math.isclose(mfu(1_156_000, 855_383_040, 989e12, 1), 0.99984, rel_tol=1e-4)
    assert mfu(2_000_000, 855_383_040, 989e12, 2) == pytest.approx(0.8648, rel=1e-3)


def test_vocab_padding():
    assert padded_vocab_size(50257, 64) == 50304
    assert padded_vocab_size(512, 64) == 512
    assert OmegaConf.select(compose([]), "model.vocab_multiple") == 64
