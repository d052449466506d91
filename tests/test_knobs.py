"""The trainer's precision, compile, checkpointing and init knobs, each in a real short run."""

from __future__ import annotations

import math

import pytest
import torch

from launcher.config import compose
from launcher.model import build_model

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


def test_init_from_a_local_folder(tmp_path):
    """model.init_from loads pretrained weights (here: a folder this test saves)."""
    cfg = compose([])
    torch.manual_seed(3)
    model = build_model(cfg.model, 512)
    model.save_pretrained(tmp_path / "pretrained")
    proc = python_train(
        [
            *SHORT,
            f"run.root={tmp_path}",
            "run.id=init",
            f"model.init_from={tmp_path / 'pretrained'}",
            "trainer.max_steps=1",
            "trainer.checkpoint_interval=1",
        ]
    )
    assert proc.returncode == 0, explain(proc)
    # One optimizer step away from the saved weights, not from a fresh initialisation.
    trained = torch.load(tmp_path / "init" / "checkpoints" / "step_00000001" / "model.pt")
    saved = model.state_dict()
    delta = max((trained[k] - saved[k]).abs().max().item() for k in saved if k in trained)
    assert 0 < delta < 1e-2
