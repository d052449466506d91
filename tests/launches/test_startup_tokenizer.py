"""`data.tokenizer=auto` on real launches: without GPT-2's files offline it does not import
transformers; with them in the hub cache it loads them through transformers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import constants

from launcher.data.bpe import train_bpe
from launcher.data.tokenizer import resolve_tokenizer


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
