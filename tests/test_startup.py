"""Start-up without its avoidable costs, and with the same results.

A single run is composed once before Hydra starts, and that config is the one composing it
for a single run gives; where composing for a sweep would accept what a single run
refuses, the refusal is the same line as before. `data.tokenizer=auto` looks for GPT-2's
files before importing transformers, and still loads them through transformers when they
are there. (The launch figures are benchmarks/startup.py's; the bad-input exit bound is
tests/test_bad_input.py's.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import constants
from omegaconf import OmegaConf

from launcher.config import ConfigError, compose, sweep
from launcher.data.bpe import train_bpe
from launcher.data.tokenizer import resolve_tokenizer

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


def test_auto_without_gpt2_offline_does_not_import_transformers(tmp_path):
    """Nothing in the hub cache and no gpt2 folder here: the trained BPE, and transformers
    (about 2 s to import) never loaded."""
    code = (
        "import sys\n"
        "from launcher.data.tokenizer import resolve_tokenizer\n"
        "tok = resolve_tokenizer('auto', bpe=lambda: 'bpe')\n"
        "print(tok, 'transformers' in sys.modules)\n"
    )
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "TIKTOKEN_CACHE_DIR": ""}
    env.pop("TRANSFORMERS_CACHE", None)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["bpe", "False"]


def test_auto_loads_gpt2_from_the_hub_cache_through_transformers(tmp_path, monkeypatch):
    """A tokenizer in the hub cache's layout for `gpt2` (a small BPE standing in for
    GPT-2's files): `auto` finds it and loads it with transformers, offline."""
    texts = [Path(m.__file__).read_text() for m in (json, os, subprocess)]
    trained = train_bpe(texts, 300)
    snapshot = tmp_path / "hub" / "models--gpt2" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    trained.model.save(str(snapshot))
    (snapshot / "config.json").write_text('{"model_type": "gpt2"}')
    (snapshot / "tokenizer_config.json").write_text('{"tokenizer_class": "GPT2Tokenizer"}')
    (tmp_path / "hub" / "models--gpt2" / "refs").mkdir()
    (tmp_path / "hub" / "models--gpt2" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    tok = resolve_tokenizer("auto", bpe=lambda: pytest.fail("GPT-2 was in the cache"))
    assert tok.description == "gpt2"
    assert tok.vocab_size == trained.get_vocab_size()
