"""The trainer's precision, compile, checkpointing and init knobs, each in a real short run."""

from __future__ import annotations

import math

import pytest
import torch

from launcher.config import compose
from launcher.model.build import build_model

from launch import FAST, explain, losses, python_train, summary

SHORT = [*FAST, "trainer.max_steps=4", "trainer.eval_interval=4", "trainer.checkpoint_interval=2"]


@pytest.mark.parametrize(
    "knobs",
    [
        # bf16 with DataLoader workers: two independent knobs, one launch pair (test time)
        [
            "trainer.precision=bf16",
            "data.num_workers=2",
            "data.persistent_workers=true",
            "data.prefetch_factor=4",
        ],
        ["trainer.precision=fp16"],
    ],
    ids=lambda k: " ".join(k),
)
def test_knob_trains_and_resumes(tmp_path, knobs):
    """The run finishes with finite losses, and a second launch resumes its checkpoint."""
    args = [*SHORT, *knobs, f"run.root={tmp_path}", "run.id=k", "trainer.lr_decay_steps=6"]
    proc = python_train(args)
    assert proc.returncode == 0, explain(proc)
    assert all(math.isfinite(v) for v in losses(tmp_path / "k").values())
    again = python_train([*args, "trainer.max_steps=6"])
    assert again.returncode == 0, explain(again)
    assert summary(tmp_path / "k")["resumed_from_step"] == 4
    if "trainer.precision=fp16" in knobs:  # the GradScaler's state travels with the optimizer
        state = torch.load(tmp_path / "k" / "checkpoints" / "step_00000006" / "optimizer.pt")
        assert state["scaler"]["scale"] > 0


@pytest.fixture(scope="module")
def eager_losses(tmp_path_factory):
    """The plain run the knobs that must not change the losses are compared with."""
    root = tmp_path_factory.mktemp("eager")
    proc = python_train([*SHORT, f"run.root={root}", "run.id=eager"])
    assert proc.returncode == 0, explain(proc)
    return losses(root / "eager")


def test_grad_checkpointing_does_not_change_the_losses(tmp_path, eager_losses):
    args = [*SHORT, f"run.root={tmp_path}", "run.id=ckpt", "trainer.grad_checkpointing=true"]
    proc = python_train(args)
    assert proc.returncode == 0, explain(proc)
    ckpt = losses(tmp_path / "ckpt")
    assert eager_losses.keys() == ckpt.keys()
    for step in eager_losses:
        assert eager_losses[step] == pytest.approx(ckpt[step], rel=1e-5)


def test_compile_matches_eager(tmp_path, eager_losses):
    args = [*SHORT, f"run.root={tmp_path}", "run.id=compiled", "trainer.compile=default"]
    proc = python_train(args, timeout=600)
    assert proc.returncode == 0, explain(proc)
    compiled = losses(tmp_path / "compiled")
    for step in eager_losses:
        assert eager_losses[step] == pytest.approx(compiled[step], rel=1e-4)


def test_init_from_a_local_folder_and_export(tmp_path):
    """model.init_from loads transformers weights (a folder this test saves) into the
    native GPT-2, and launcher.export writes the trained model back as a folder
    GPT2LMHeadModel reads, with the same logits."""
    from transformers import GPT2LMHeadModel

    from launcher.export import main as export_main
    from launcher.model.gpt2 import from_hf_state_dict

    torch.manual_seed(3)
    hf = build_model(compose(["model.impl=hf"]).model, 512)
    hf.save_pretrained(tmp_path / "pretrained")
    proc = python_train(
        [
            *SHORT,
            f"run.root={tmp_path}",
            "run.id=init",
            "model.impl=native",
            f"model.init_from={tmp_path / 'pretrained'}",
            "trainer.max_steps=1",
            "trainer.checkpoint_interval=1",
        ]
    )
    assert proc.returncode == 0, explain(proc)
    # One optimizer step away from the saved weights, not from a fresh initialisation.
    trained = torch.load(tmp_path / "init" / "checkpoints" / "step_00000001" / "model.pt")
    saved = from_hf_state_dict(hf.state_dict())
    assert trained.keys() == saved.keys()
    delta = max((trained[k] - saved[k]).abs().max().item() for k in saved)
    assert 0 < delta < 1e-2
    assert export_main([str(tmp_path / "init"), str(tmp_path / "exported")]) == 0
    native = build_model(compose(["model.impl=native"]).model, 512).eval()
    native.load_state_dict(trained)
    back = GPT2LMHeadModel.from_pretrained(tmp_path / "exported").eval()
    x = torch.randint(0, 512, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(back(input_ids=x).logits, native(x), atol=1e-5, rtol=0)
