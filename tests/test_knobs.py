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
        ["trainer.precision=bf16"],
        ["trainer.precision=fp16"],
        ["trainer.grad_checkpointing=true"],
        ["data.num_workers=2", "data.persistent_workers=true", "data.prefetch_factor=4"],
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


def test_grad_checkpointing_does_not_change_the_losses(tmp_path):
    plain = python_train([*SHORT, f"run.root={tmp_path}", "run.id=plain"])
    ckpt = python_train(
        [*SHORT, f"run.root={tmp_path}", "run.id=ckpt", "trainer.grad_checkpointing=true"]
    )
    assert plain.returncode == 0 and ckpt.returncode == 0, explain(ckpt)
    a, b = losses(tmp_path / "plain"), losses(tmp_path / "ckpt")
    assert a.keys() == b.keys()
    for step in a:
        assert a[step] == pytest.approx(b[step], rel=1e-5)


def test_compile_matches_eager(tmp_path):
    eager = python_train([*SHORT, f"run.root={tmp_path}", "run.id=eager"])
    compiled = python_train(
        [*SHORT, f"run.root={tmp_path}", "run.id=compiled", "trainer.compile=default"], timeout=600
    )
    assert eager.returncode == 0 and compiled.returncode == 0, explain(compiled)
    a, b = losses(tmp_path / "eager"), losses(tmp_path / "compiled")
    for step in a:
        assert a[step] == pytest.approx(b[step], rel=1e-4)


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
