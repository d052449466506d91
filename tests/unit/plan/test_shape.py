"""launcher.plan.shape: the run as the plan models it, the model the job would build (its
vocabulary the run's, a model.init_from folder's own shape), BatchPlan's arithmetic, and
the FLOPs one rank computes a step."""

from __future__ import annotations

import json

import pytest

from launcher.config import compose
from launcher.config.model_shape import shape_flops_per_token
from launcher.model.build import build_model
from launcher.plan.shape import checked, shape_of

BPE = ["data.tokenizer=bpe", "data.bpe_vocab_size=512"]


def test_the_shape_is_the_model_the_job_builds_with_the_runs_vocabulary():
    shape = shape_of(checked(compose(BPE), 2), 2)
    built = build_model(compose([]).model, 512)
    assert shape.params == sum(p.numel() for p in built.parameters())
    assert shape.cfg.model.vocab_size == shape.vocab.size == 512
    b = shape.batch
    assert (b.global_batch, b.micro_batch, b.per_rank, b.accum) == (16, 4, 8, 2)


@pytest.mark.parametrize("recompute", [False, True])
def test_a_rank_computes_its_tokens_flops_and_the_forward_again_when_checkpointing(recompute):
    cfg = checked(compose([*BPE, f"trainer.grad_checkpointing={recompute}"]), 4)
    shape = shape_of(cfg, 4)
    per_token = shape_flops_per_token(shape.cfg.model, 128)
    assert shape.flops_per_token == per_token
    assert shape.flops_per_rank_step == 4 * 128 * per_token * (4 / 3 if recompute else 1)


def test_a_pretrained_folder_gives_its_own_shape(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "gpt2", "n_layer": 3, "n_embd": 48, "n_head": 3, "n_positions": 256,
        "vocab_size": 1000}))  # fmt: skip
    shape = shape_of(compose([f"model.init_from={tmp_path}"]), 1)
    m = shape.cfg.model
    assert (m.n_layer, m.n_embd, m.n_positions, m.vocab_size) == (3, 48, 256, 1000)
    assert shape.params == 1000 * 48 + 256 * 48 + 3 * (12 * 48 * 48 + 13 * 48) + 2 * 48
    assert f"model shape from {tmp_path / 'config.json'}" in shape.notes


def test_a_sequence_shorter_than_the_context_is_said():
    assert shape_of(compose(["model=gpt2-xl", *BPE]), 1).notes == [
        "sequence 128 tokens (trainer.seq_len=128); gpt2-xl's context is 1024: "
        "trainer.seq_len=1024 plans (and trains) at it"
    ]
    assert shape_of(compose(["model=gpt2-xl", *BPE, "trainer.seq_len=1024"]), 1).notes == []
