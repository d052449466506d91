"""The native GPT-2 (model.impl=native): the same function as transformers' on the same
weights, both ways; one compiled graph with the loss inside; the same losses compiled and
eager; gradient checkpointing, FLOPs, config and checkpoint-identity rules."""

import pytest
import torch
from omegaconf import OmegaConf
from transformers import GPT2LMHeadModel

from launcher.checkpoint import resume
from launcher.config import ConfigError, compose, validate
from launcher.export import main as export_main
from launcher.model.build import build_model, count_params, flops_per_token, lm_loss, model_loss
from launcher.model.gpt2 import GPT2, hf_config, to_hf_state_dict

VOCAB = 256


def native(*overrides: str) -> GPT2:
    return build_model(compose(["model.impl=native", *overrides]).model, VOCAB)


def tokens(seed: int = 0, batch: int = 3, length: int = 32) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_transformers_weights_give_the_same_logits(tmp_path):
    """hf -> native: model.init_from a local transformers folder."""
    torch.manual_seed(1)
    hf = build_model(compose(["model.impl=hf"]).model, VOCAB).eval()
    hf.save_pretrained(tmp_path)
    model = native(f"model.init_from={tmp_path}").eval()
    x = tokens()
    with torch.no_grad():
        torch.testing.assert_close(model(x), hf(input_ids=x).logits, atol=1e-5, rtol=0)


def test_exported_weights_give_the_same_logits(tmp_path):
    """native -> transformers, through the conversion the export command uses; without
    biases too (exported as zero biases)."""
    x = tokens()
    for bias in (True, False):
        torch.manual_seed(2)
        model = native(f"model.bias={bias}").eval()
        hf = GPT2LMHeadModel(hf_config(model.config))
        hf.load_state_dict(to_hf_state_dict(model.state_dict()), strict=False)
        hf.save_pretrained(tmp_path / str(bias))
        back = GPT2LMHeadModel.from_pretrained(tmp_path / str(bias)).eval()
        with torch.no_grad():
            torch.testing.assert_close(back(input_ids=x).logits, model(x), atol=1e-5, rtol=0)


def test_export_refuses_bad_input_with_one_line(tmp_path, capsys):
    assert export_main([str(tmp_path / "nowhere"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "nowhere holds no complete checkpoint" in err


def test_the_loss_inside_forward_is_the_trainers_loss():
    model = native()
    x, y = tokens(0), tokens(1)
    expected = lm_loss(model(x), y)
    assert model_loss(model, "native", x, y).item() == pytest.approx(expected.item(), abs=1e-6)


def test_one_graph_and_compiled_losses_match_eager():
    """fullgraph=True fails on any graph break; the compiled loss (forward, LM head, fp32
    cross entropy in one graph) matches eager in fp32 and under bf16 autocast."""
    torch.manual_seed(3)
    model = native("model.n_layer=1")  # every block is the same code: one shows any break
    compiled = torch.compile(model, fullgraph=True)
    x, y = tokens(0), tokens(1)
    for dtype, tol in ((None, 1e-5), (torch.bfloat16, 2e-2)):
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            eager = model(x, targets=y)
            fast = compiled(x, targets=y)
        assert fast.dtype == torch.float32
        assert fast.item() == pytest.approx(eager.item(), rel=tol)
    fast.backward()  # backward compiles too
    assert model.transformer.h[0].attn.c_attn.weight.grad is not None


def test_grad_checkpointing_and_dropout():
    x, y = tokens(0), tokens(1)
    grads = []
    for ckpt in (False, True):
        torch.manual_seed(4)
        model = build_model(
            compose(["model.impl=native"]).model, VOCAB, grad_checkpointing=ckpt
        ).train()
        model(x, targets=y).backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, msg=name)
    model = native("model.dropout=0.5").train()
    assert model(x, targets=y).item() != model(x, targets=y).item()  # dropout is on
    model.eval()
    assert model(x, targets=y).item() == model(x, targets=y).item()


def test_flops_per_token_match_transformers_figures():
    """The figures test_build.py works out by hand for GPT2LMHeadModel at 124M."""
    model = build_model(compose(["model=gpt2", "model.impl=native"]).model, 50257)
    assert model.lm_head.weight is model.transformer.wte.weight  # tied: counted once
    assert count_params(model, exclude_position_embeddings=False) == 124_475_904
    assert flops_per_token(model, 1024) == 855_383_040


def test_impl_and_bias_are_validated():
    for bad, key in (
        (["model.impl=jax"], "model.impl"),
        (["model.impl=hf", "model.bias=false"], "model.impl=native"),
        (["model.impl=native", "model.bias=false", "model.init_from=gpt2"], "model.bias=true"),
    ):
        with pytest.raises(ConfigError, match=key):
            validate(compose(bad), 1)


def test_a_checkpoint_of_the_other_impl_is_refused_with_the_fix():
    cfg = compose(["model.impl=native"])
    now = resume.identity(cfg, native(), 1)
    assert now["model"]["impl"] == "native"
    saved = OmegaConf.to_container(OmegaConf.create(now))
    saved["model"]["impl"] = "hf"
    (found,) = resume.differences(saved, now)
    assert found.fix == "model.impl=hf" and "model.impl is hf there, native now" in found.what
    del saved["model"]["impl"]  # written before model.impl existed: by transformers' model
    assert [d.fix for d in resume.differences(saved, now)] == ["model.impl=hf"]
    saved["model"]["impl"] = "native"
    assert resume.differences(saved, now) == []
