"""launcher.config.model_shape: GPT-2's size from its config, exactly what the model built
from that config holds, tensor by tensor (DDP's buckets are cut from these)."""

from __future__ import annotations

import pytest

from launcher.config import compose
from launcher.config.model_shape import param_count, param_sizes
from launcher.model.build import build_model


@pytest.mark.parametrize(
    ("model", "bias"), [("gpt2-tiny", "true"), ("gpt2", "true"), ("gpt2-tiny", "false")]
)
def test_the_shape_is_the_built_models_tensor_by_tensor(model, bias):
    """Without biases (model.bias=false) the linears and LayerNorms have none."""
    cfg = compose([f"model={model}", "model.vocab_size=512", f"model.bias={bias}"])
    built = build_model(cfg.model, 512)
    unique = {id(p): p.numel() for p in built.parameters()}  # the tied LM head once
    assert param_sizes(cfg.model) == list(unique.values())
    assert param_count(cfg.model) == sum(unique.values())


def test_a_parameter_count_is_said_to_two_decimals_under_ten_million():
    from launcher.config.model_shape import millions

    # gpt2-tiny with the default 8192-token vocabulary: 0.62M (the plan said "1M")
    assert [millions(n) for n in (620_000, 6_000_000, 124_439_808, 1_557_611_200)] == [
        "0.62M", "6.00M", "124M", "1,558M"
    ]  # fmt: skip
