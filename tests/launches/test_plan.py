"""The plan held against what runs wrote (launcher.plan, docs/plan.md): the checkpoint bytes
it predicts for each engine against the strategy sweep's checkpoints (2 ranks), and every
run's summary.json holding the forecast beside what it measured. The step-time checks at
other shapes are benchmarks/plan_check.py's (ratios, on a noisy machine)."""

from __future__ import annotations

import re

import pytest
from omegaconf import OmegaConf

from launcher.checkpoint.protocol import read_meta
from launcher.plan.forecast import checkpoint_bytes

from reference_runs import STRATEGY_POINTS

STATE_FILES = re.compile(r"(?!rng_rank)\S+\.(pt|distcp)$")  # not the RNG files
# What torch.save's and DCP's formats add around each tensor they write (a zip entry and its
# record, measured at about 700 bytes): 116 entries of the tiny model's FSDP2 state are 3%
# of its 2.8 MB, 0.03% of gpt2's.
FRAMING_BYTES = 1024


@pytest.mark.parametrize("point", STRATEGY_POINTS)
def test_the_checkpoint_bytes_are_predicted_within_2_percent(strategy_sweep, point):
    """Within 2% of the prediction, and each state tensor's framing."""
    run = strategy_sweep / f"strategy={point}"
    meta = read_meta(run / "checkpoints" / "step_00000020")
    cfg = OmegaConf.load(run / "config.yaml")
    cfg.model.vocab_size = meta["model"]["vocab_size"]  # the tokenizer's, as built
    written = sum(n for name, n in meta["files"].items() if STATE_FILES.match(name))
    predicted = checkpoint_bytes(cfg, meta["world_size"])["total"]
    entries = 4 * (12 * cfg.model.n_layer + 5)  # weights, two moments, step: every tensor
    assert abs(written - predicted) <= 0.02 * predicted + FRAMING_BYTES * entries, meta["files"]


def test_every_run_keeps_its_forecast_beside_what_it_measured(strategy_sweep):
    """On the CPU there is no peak to forecast from: the forecast says so (a resumed run,
    or one on a GPU, holds the figures: tests/unit/plan)."""
    import json

    summary = json.loads((strategy_sweep / "strategy=ddp" / "summary.json").read_text())
    assert summary["forecast"]["step_time_s"] is None
    assert "no known peak FLOP/s on the CPU" in summary["forecast"]["basis"]
    assert summary["step_time_s/p50"] > 0  # the measured figure beside it
