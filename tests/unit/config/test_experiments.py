"""Every experiment under conf/exp/ composes, and every point of a sweep experiment is a
valid run at world size 2, as `launcher.train` would check it before the process group.

The launches of the suite run some experiments whole (`+exp=strategy_sweep`,
`+exp=bucket_sweep`, `+exp=comm_hook_sweep`, `+exp=profile`, `+exp=throughput`); the others
are proven through those: `+exp=zero_sweep`'s points are the strategy sweep's first four.
"""

from __future__ import annotations

import pytest

from launcher.config import compose, validate
from launcher.config.sweep import plan
from launcher.config.validate import normalize

from paths import REPO

EXPERIMENTS = sorted(p.stem for p in (REPO / "conf" / "exp").glob("*.yaml"))


def points(name: str) -> list[list[str]]:
    cfg = compose([f"+exp={name}"], sweep=True)
    return plan([f"+exp={name}"], False, cfg.hydra).points


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_point_of_every_experiment_is_valid(name):
    for overrides in points(name):
        cfg = compose(overrides)
        normalize(cfg, world_size=2)
        validate(cfg, world_size=2)


def test_zero_sweep_is_four_points_of_the_strategy_sweep():
    """The shared strategy sweep (tests/reference_runs.py) covers what zero_sweep runs; the
    strategy sweep globs the strategy group: every engine installed, each preset once."""
    zero = [p[:-1] for p in points("zero_sweep")]  # each point: the swept value, then +exp
    every = [p[:-1] for p in points("strategy_sweep")]
    assert zero == [[f"strategy={s}"] for s in ("ddp", "zero1", "zero2", "zero3")]
    presets = ("ddp", "fsdp2", "fsdp2_noreshard", "zero1", "zero2", "zero3")
    assert every == [[f"strategy={s}"] for s in presets]


# +exp=python_sample's training FLOPs as measured in docs/quickstart.md (a run of minutes is
# not a test: its figures come from a real run, this keeps the recipe the one measured).
PYTHON_SAMPLE_TFLOPS = 17.5


def test_python_sample_is_the_measured_recipe_and_leaves_a_model_to_sample():
    """The five-minute recipe (docs/quickstart.md): the compute that was measured, at most;
    the text tokenizer (a small BPE) that `generate` decodes with; an eval and a checkpoint
    at its last step; a context the model holds."""
    from omegaconf import OmegaConf

    from launcher.config.model_shape import shape_flops_per_token

    cfg = compose(["+exp=python_sample"])
    normalize(cfg, world_size=2)
    validate(cfg, world_size=2)
    t, d = cfg.trainer, cfg.data
    assert d.source == "stdlib" and d.tokenizer == "bpe" and d.bpe_vocab_size <= 2048
    OmegaConf.update(cfg, "model.vocab_size", d.bpe_vocab_size)
    tokens = t.max_steps * t.global_batch_size * t.seq_len
    tflops = shape_flops_per_token(cfg.model, t.seq_len) * tokens / 1e12
    assert tflops <= PYTHON_SAMPLE_TFLOPS, f"{tflops:.1f} TFLOP: measure it again, then raise"
    assert tflops > 0.9 * PYTHON_SAMPLE_TFLOPS  # and not shrunk below what was measured either
    assert t.eval_interval and t.checkpoint_interval and t.max_steps % t.checkpoint_interval == 0
    assert t.seq_len <= cfg.model.n_positions and t.max_steps % t.eval_interval == 0
