"""launcher.data.vocab: the vocabulary a run will train with, found before any data is
prepared, for every kind of data.tokenizer and source; what cannot be known is GPT-2's,
said to be assumed."""

from __future__ import annotations

import json

from launcher.config import compose
from launcher.data.bpe import bpe_tokenizer
from launcher.data.cache import cache_root
from launcher.data.sources import text_files_source
from launcher.data.vocab import planned_vocab


def data(*overrides: str):
    return compose(list(overrides)).data


def test_a_source_of_token_ids_has_data_vocab_size_or_gpt2s_assumed():
    given = planned_vocab(data("data=synthetic", "data.vocab_size=300"))
    assert (given.size, given.known) == (300, True)
    assumed = planned_vocab(data("data=synthetic", "data.vocab_size=null"))
    assert (assumed.size, assumed.known) == (50257, False)
    assert "without data.vocab_size" in assumed.why


def test_a_bpe_is_its_trained_size_or_the_size_it_will_be_trained_to(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("def f(x):\n    return x + 1\n" * 200)
    keys = [f"data.paths=[{text}]", "data.source=text_files", "data.tokenizer=bpe",
            "data.bpe_vocab_size=300", f"data.cache_dir={tmp_path / 'cache'}"]  # fmt: skip
    before = planned_vocab(data(*keys))
    assert (before.size, before.known) == (300, True) and "not trained yet" in before.why
    d = data(*keys)
    source = text_files_source(patterns=list(d.paths), max_bytes=d.max_bytes,
                               val_fraction=d.val_fraction)  # fmt: skip
    trained = bpe_tokenizer(source, vocab_size=300, cache_root=cache_root(d.cache_dir),
                            may_train=True)  # fmt: skip
    after = planned_vocab(d)
    assert after.size == trained.vocab_size and "trained:" in after.why


def test_gpt2s_bpe_found_offline_is_50257(tmp_path, monkeypatch):
    """data.tokenizer=auto takes GPT-2's BPE when its files are at hand (a `gpt2` folder
    in the working directory, as transformers reads it)."""
    (tmp_path / "gpt2").mkdir()
    monkeypatch.chdir(tmp_path)
    found = planned_vocab(data())
    assert (found.size, found.known) == (50257, True)


def test_a_tokenizer_of_files_is_counted_and_a_hubs_is_assumed(tmp_path):
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "vocab.json").write_text(json.dumps({"a": 0, "b": 1, "ab": 2}))
    (folder / "merges.txt").write_text("#version: 0.2\na b\n")
    assert planned_vocab(data(f"data.tokenizer={folder}")).size == 4  # and <|endoftext|>
    ranks = tmp_path / "my.tiktoken"
    ranks.write_text("YQ== 0\nYg== 1\n")
    assert planned_vocab(data(f"data.tokenizer={ranks}")).size == 3
    hub = planned_vocab(data("data.tokenizer=someone/tok"))
    assert (hub.size, hub.known) == (50257, False) and "read from the hub" in hub.why
