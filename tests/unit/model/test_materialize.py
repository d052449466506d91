"""The model built on the meta device and materialised on its own device: the values of a
plain build on the CPU, bit for bit, the random stream left where that build leaves it,
ties kept; what the replay cannot repeat refused; pretrained weights loaded in the model's
dtype with the tie kept (launcher.model.materialize, launcher.model.build)."""

import pytest
import torch
from transformers import GPT2Config as HFConfig
from transformers import GPT2LMHeadModel

from launcher.config import compose
from launcher.model.build import build_model, padded_vocab_size
from launcher.model.gpt2 import GPT2, GPT2Config
from launcher.model.materialize import SKIP_SLICE, NotReplayable, materialise, uniform_draws

# A vocabulary over GPT-2's padding, so that the LM head's dropped uniform fill (vocab x
# width) is thrown away in several slices.
VOCAB = 50257


def plain_cpu_build(impl: str, vocab: int) -> torch.nn.Module:
    """The model constructed as it was before materialise: on the CPU, directly."""
    m = compose([f"model.impl={impl}"]).model
    padded = padded_vocab_size(vocab, m.vocab_multiple)
    if impl == "native":
        return GPT2(GPT2Config(padded, m.n_layer, m.n_head, m.n_embd, m.n_positions,
                               m.dropout, m.bias))  # fmt: skip
    c = HFConfig(vocab_size=padded, n_positions=m.n_positions, n_embd=m.n_embd,
                 n_layer=m.n_layer, n_head=m.n_head, resid_pdrop=m.dropout,
                 embd_pdrop=m.dropout, attn_pdrop=m.dropout, use_cache=False,
                 bos_token_id=None, eos_token_id=None)  # fmt: skip
    return GPT2LMHeadModel(c)


@pytest.mark.parametrize("impl", ["native", "hf"])
def test_the_values_are_the_plain_cpu_builds(impl):
    cfg = compose([f"model.impl={impl}"])
    torch.manual_seed(7)
    built = build_model(cfg.model, VOCAB)
    after_built = torch.rand(8)
    torch.manual_seed(7)
    plain = plain_cpu_build(impl, VOCAB)
    after_plain = torch.rand(8)
    assert built.transformer.wte.weight.numel() > 2 * SKIP_SLICE  # the head's fill in slices
    ours, theirs = built.state_dict(), plain.state_dict()
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key
    assert torch.equal(after_built, after_plain)  # the next draw (dropout, data) is the same
    assert built.lm_head.weight is built.transformer.wte.weight
    assert len(list(built.parameters())) == len(list(plain.parameters()))
    assert all(p.device.type == "cpu" and not p.is_meta for p in built.parameters())


class WithBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("mask", torch.ones(4))


class FromArange(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.arange(4.0))


class DrawsBernoulli(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.empty(4))
        torch.nn.init.zeros_(self.w)
        self.w.data.bernoulli_(0.5)


@pytest.mark.parametrize(
    "module, says",
    [
        (WithBuffer, "has buffers"),
        (FromArange, "w was made by a factory the replay does not repeat"),
        (DrawsBernoulli, "bernoulli"),
    ],
)
def test_a_construction_the_replay_cannot_repeat_is_refused(module, says):
    with pytest.raises(NotReplayable, match=says):
        materialise(module, torch.device("cpu"))


def test_pretrained_weights_load_in_the_models_dtype_with_the_tie(tmp_path):
    """model.init_from saved in bf16: the native model's parameters are fp32 (the values
    upcast, as load_state_dict into a built model gave), its LM head tied, no meta left."""
    cfg = compose(["model.impl=hf"])
    torch.manual_seed(3)
    hf = build_model(cfg.model, 512).to(torch.bfloat16)
    hf.save_pretrained(tmp_path)
    native = build_model(compose(["model.impl=native", f"model.init_from={tmp_path}"]).model, 512)
    assert native.lm_head.weight is native.transformer.wte.weight
    assert {p.dtype for p in native.parameters()} == {torch.float32}
    assert not any(p.is_meta for p in native.parameters())
    theirs = hf.state_dict()["transformer.h.0.attn.c_attn.weight"]  # Conv1D: [in, out]
    ours = native.state_dict()["transformer.h.0.attn.c_attn.weight"]
    assert torch.equal(ours, theirs.float().t())


@pytest.mark.parametrize("fill", ["uniform_", "normal_"])
@pytest.mark.parametrize("numel", [16, 17, 1000, 1_000_003])
def test_a_dropped_fill_is_skipped_as_the_draws_it_takes(fill, numel):
    """The generator after `uniform_draws` uniform numbers drawn in slices is where the
    fill itself leaves it (float32 and float64; a count not a multiple of 16 included)."""
    for dtype in (torch.float32, torch.float64):
        meta = torch.empty(numel, dtype=dtype, device="meta")
        func = getattr(torch.ops.aten, fill).default
        torch.manual_seed(11)
        func(torch.empty(numel, dtype=dtype))
        after_fill = torch.rand(4)
        torch.manual_seed(11)
        count = uniform_draws(func, meta)
        while count:
            n = min(count, 999)
            torch.empty(n, dtype=dtype).uniform_()
            count -= n
        assert torch.equal(torch.rand(4), after_fill), (fill, numel, dtype)
    assert uniform_draws(torch.ops.aten.normal_.default, torch.empty(15, device="meta")) is None
