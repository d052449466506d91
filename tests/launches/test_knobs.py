"""The trainer's precision knobs through a resume, and model.init_from with the export, each in
a real short run. That compile and activation checkpointing leave the losses as they were is
the knob matrix's (tests/launches/test_knob_matrix.py: every engine, 2 ranks, accumulation)."""

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
