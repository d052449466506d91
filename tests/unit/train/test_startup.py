"""Start-up without its avoidable costs, and with the same results: a single run is composed
once into the config composing it for a single run gives; a sweep still composes every
point; what a single run refuses is refused in the same line. (The launch figures are
benchmarks/startup.py's.)"""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from launcher.config import ConfigError, compose, sweep

from launch import FAST

SINGLE_RUNS = {
    "defaults": [],
    "fast": FAST,
    "deepspeed": ["strategy=zero2", "trainer.max_steps=3"],
    "list key": ["data=text_files", "data.paths=[a.txt,b.txt]"],
    "experiment": ["+exp=profile"],
    "logger": ["logger=wandb", "logger.mode=offline", "+logger.tags=[a]"],
}


@pytest.mark.parametrize("overrides", SINGLE_RUNS.values(), ids=SINGLE_RUNS.keys())
def test_a_single_run_is_composed_once_into_the_same_config(overrides):
    plan, configs = sweep.compose_points(overrides, multirun=False)
    assert not plan.multirun and plan.points == [overrides]
    (once,) = configs
    again = compose(overrides)
    assert OmegaConf.to_container(once) == OmegaConf.to_container(again)
    assert OmegaConf.is_struct(once) and "hydra" not in once


def test_a_sweep_still_composes_every_point():
    plan, configs = sweep.compose_points(["strategy.bucket_cap_mb=1,2"], multirun=True)
    assert plan.multirun and plan.swept_keys == ["strategy.bucket_cap_mb"]
    assert [c.strategy.bucket_cap_mb for c in configs] == [1, 2]


def test_what_a_single_run_refuses_is_still_refused(tmp_path):
    """Composing for a sweep accepts a swept value and a config group left unchosen; the
    single run refuses both, in the line composing it gives."""
    (tmp_path / "exp").mkdir()
    (tmp_path / "foo").mkdir()
    (tmp_path / "exp" / "choose.yaml").write_text("# @package _global_\ndefaults:\n  - /foo: ???\n")
    (tmp_path / "foo" / "x.yaml").write_text("a: 1\n")
    refusals = {
        "bad override: Ambiguous value for argument 'strategy.bucket_cap_mb=1,2'": [
            "strategy.bucket_cap_mb=1,2"
        ],
        "bad override: You must specify 'foo'": [
            f"hydra.searchpath=[file://{tmp_path}]",
            "+exp=choose",
        ],
    }
    for line, overrides in refusals.items():
        with pytest.raises(ConfigError) as composing_it:
            compose(overrides)
        with pytest.raises(ConfigError) as refused:
            sweep.compose_points(overrides, multirun=False)
        assert str(refused.value) == str(composing_it.value)
        assert str(refused.value).startswith(line)
