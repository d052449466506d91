"""The vocabulary a run's model will have, known before any data is prepared: what the
plan sizes the embedding (and so the checkpoint, the memory tier and the FLOPs) with.

The job builds its model with the tokenizer's vocabulary (launcher.data.prepare), padded to
`model.vocab_multiple`. Here the same choice is followed without training or downloading
anything: a trained BPE already in the cache is read, one not trained yet has
`data.bpe_vocab_size` ids; GPT-2's BPE, when `data.tokenizer=auto` finds its files offline,
has 50,257; a folder or `.tiktoken` file is counted. What cannot be known here (a hub
tokenizer, a `memmap` or `synthetic` source without `data.vocab_size`) is GPT-2's, said to
be assumed.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from launcher.config.model_shape import GPT2_VOCAB
from launcher.data.bpe import bpe_folder
from launcher.data.cache import cache_root
from launcher.data.sources import stdlib_source, text_files_source
from launcher.data.tokenizer import EOT, cached_gpt2_tiktoken, gpt2_may_be_offline


@dataclass(frozen=True)
class Vocabulary:
    size: int  # ids the tokenizer has (the model pads it to model.vocab_multiple)
    why: str  # where the figure comes from, as the plan states it
    known: bool  # False: assumed (GPT-2's), the data's own cannot be read before the run


def planned_vocab(data) -> Vocabulary:
    """The vocabulary the run of `data` (its config section) will train with."""
    if data.source in ("memmap", "synthetic"):
        if data.vocab_size is not None:
            return Vocabulary(int(data.vocab_size), f"data.vocab_size={data.vocab_size}", True)
        return _assumed(f"data.source={data.source} without data.vocab_size")
    spec = str(data.tokenizer)
    if spec == "auto" and (gpt2_may_be_offline() or cached_gpt2_tiktoken()):
        return Vocabulary(GPT2_VOCAB, "data.tokenizer=auto: GPT-2's BPE, found offline", True)
    if spec in ("auto", "bpe"):
        return _bpe(data, spec)
    path = Path(os.path.expanduser(spec))
    if path.is_dir() and (path / "vocab.json").is_file():
        vocab = json.loads((path / "vocab.json").read_text())
        size = len(vocab) + (EOT not in vocab)
        return Vocabulary(size, f"data.tokenizer={spec}: its vocab.json", True)
    if path.is_file() and path.suffix == ".tiktoken":
        ranks = sum(1 for line in path.read_text().splitlines() if line.strip())
        return Vocabulary(ranks + 1, f"data.tokenizer={spec}: its ranks and <|endoftext|>", True)
    return _assumed(f"data.tokenizer={spec} is read from the hub when the run starts")


def _bpe(data, spec: str) -> Vocabulary:
    """A BPE trained on the data: the cached one's size when it is trained already, else
    the size it will be trained to."""
    size = int(data.bpe_vocab_size)
    why = f"data.tokenizer={spec}: a BPE trained on the data, data.bpe_vocab_size={size}"
    try:
        if data.source == "stdlib":
            source = stdlib_source(max_bytes=data.max_bytes, val_fraction=data.val_fraction)
        elif data.source == "text_files":
            source = text_files_source(patterns=list(data.paths), max_bytes=data.max_bytes,
                                       val_fraction=data.val_fraction)  # fmt: skip
        else:  # the hub's data: not fetched to plan
            return Vocabulary(size, why, True)
    except (OSError, ValueError):  # files the run will refuse: its own line says so then
        return Vocabulary(size, why, True)
    cached = bpe_folder(source, size, cache_root(data.cache_dir)) / "tokenizer.json"
    if cached.is_file():
        from tokenizers import Tokenizer as Backend

        trained = Backend.from_file(str(cached)).get_vocab_size(with_added_tokens=True)
        return Vocabulary(trained, f"{why} (trained: {cached})", True)
    return Vocabulary(size, f"{why} (not trained yet)", True)


def _assumed(why: str) -> Vocabulary:
    return Vocabulary(GPT2_VOCAB, f"GPT-2's {GPT2_VOCAB:,}, assumed: {why}", False)
