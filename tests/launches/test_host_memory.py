"""The plan's host memory per rank (launcher.plan.host) against what real ranks measured:
each engine's point of the shared strategy sweep (2 ranks, tests/reference_runs.py) records
its loop's peak resident memory (mem/host_peak_gb, max over ranks). No launch of its own;
benchmarks/host_memory.py measures the whole life of a rank (start-up, build, end) and the
larger models."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from launcher.checkpoint.protocol import read_meta
from launcher.plan.host import rank_bytes

from reference_runs import STRATEGY_POINTS


@pytest.mark.parametrize("point", STRATEGY_POINTS)
def test_a_ranks_measured_peak_is_within_15_percent_of_the_plan(strategy_sweep, point):
    """The loop's peak is the rank's less what only start-up and the end-of-run report hold
    (a tiny model's rank: some 40 MB under the whole life's the plan counts); the sweep's
    later points carry the earlier engines' imports. Within 15% either way: a plan that
    forgot a part, or counted one twice, or an engine whose process grew, fails here."""
    run = strategy_sweep / f"strategy={point}"
    cfg = OmegaConf.load(run / "config.yaml")
    meta = read_meta(run / "checkpoints" / "step_00000020")
    cfg.model.vocab_size = meta["model"]["vocab_size"]  # the tokenizer's, as built
    planned = rank_bytes(cfg, 2, meta["world_size"], on_gpu=False)["total"]
    measured = json.loads((run / "summary.json").read_text())["mem/host_peak_gb"] * 1e9
    assert 0.85 <= measured / planned <= 1.15, (measured, planned)
