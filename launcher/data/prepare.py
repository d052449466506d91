"""`prepare_data`: turn the data config into train and validation windows on every rank.

One process per node (the builder) tokenizes the source into the cache if the entry is
missing; every process then waits at the trainer's barrier and opens the same entry. Text
sources go through a tokenizer and the cache; `memmap` files are pre-tokenized and used in
place; `synthetic` reads nothing at all.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from launcher.data.bpe import bpe_tokenizer
from launcher.data.cache import cache_root, fingerprint, publish_dir
from launcher.data.shards import read_meta, shard_name, write_token_shards
from launcher.data.sources import stdlib_source, text_files_source
from launcher.data.tokenizer import Tokenizer, resolve_tokenizer
from launcher.data.wikitext import wikitext_source
from launcher.data.windows import (
    Segment,
    SyntheticWindows,
    TokenWindows,
    file_segment,
    id_problem,
    split_tail,
)

log = logging.getLogger(__name__)

CACHE_FORMAT = 1
SYNTHETIC_WINDOWS = {"train": 1_000_000, "val": 1_000}


@dataclass
class TokenData:
    """What the trainer gets: both splits as windows, and what it needs to size the model."""

    train: TokenWindows
    val: TokenWindows
    vocab_size: int
    eot_id: int | None
    description: str
    cache_path: str | None
    save_tokenizer: Callable[[Path], None] | None = None  # see launcher.data.tokenizer


def prepare_data(
    data_cfg, *, seq_len: int, seed: int, is_builder: bool, wait: Callable[[], None]
) -> TokenData:
    """Build the token cache if this is the builder and it is missing, wait, then open it."""
    if data_cfg.source == "synthetic":
        wait()
        return _synthetic(data_cfg, seq_len=seq_len, seed=seed)
    if data_cfg.source == "memmap":
        wait()
        return _memmap(data_cfg, seq_len=seq_len)
    return _text(data_cfg, seq_len=seq_len, is_builder=is_builder, wait=wait)


def _synthetic(d, *, seq_len: int, seed: int) -> TokenData:
    vocab = _required_vocab(d)
    train, val = (
        SyntheticWindows(vocab_size=vocab, seq_len=seq_len, seed=seed, split=s, length=n)
        for s, n in SYNTHETIC_WINDOWS.items()
    )
    description = (
        f"synthetic random tokens (vocab {vocab:,}, {len(train):,} train / "
        f"{len(val):,} val windows of {seq_len + 1})"
    )
    return TokenData(train, val, vocab, None, description, None)


def _memmap(d, *, seq_len: int) -> TokenData:
    vocab = _required_vocab(d)
    train_segments = [file_segment(p, d.dtype) for p in _expand(d.paths)]
    val_segments = [file_segment(p, d.dtype) for p in _expand(d.val_paths)]
    for segment in train_segments + val_segments:
        problem = id_problem(segment.path, d.dtype, vocab)
        if problem:
            raise ValueError(problem)
    if not val_segments:
        train_segments, val_segments = split_tail(train_segments, d.val_fraction, seq_len + 1)
    train, val = _windows(train_segments, val_segments, seq_len, "data.paths / data.val_paths")
    description = (
        f"memmap {len(d.paths)} train / {len(d.val_paths)} val files ({d.dtype}, vocab "
        f"{vocab:,}), {_counts(train, val)}"
    )
    return TokenData(train, val, vocab, None, description, None)


def _text(d, *, seq_len: int, is_builder: bool, wait: Callable[[], None]) -> TokenData:
    source = _text_source(d)
    root = cache_root(d.cache_dir)
    if not is_builder:
        wait()
    try:
        tokenizer = resolve_tokenizer(
            d.tokenizer,
            bpe=lambda: bpe_tokenizer(
                source, vocab_size=d.bpe_vocab_size, cache_root=root, may_train=is_builder
            ),
        )
        folder = root / f"tokens-{_cache_key(source, tokenizer, d.shard_tokens)}"
        if is_builder:
            built = publish_dir(
                folder,
                lambda tmp: write_token_shards(
                    tmp,
                    source.documents(),
                    tokenizer,
                    shard_tokens=d.shard_tokens,
                    source_description=source.description,
                ),
            )
    except Exception:  # a full disk (tokenizers says so in a plain Exception): the ranks
        if is_builder:  # waiting for the cache find none and stop too
            wait()
        raise
    if is_builder:
        log.info("%s token cache %s", "built" if built else "reusing", folder)
        wait()
    if not folder.is_dir():
        raise FileNotFoundError(
            f"{folder}: token cache missing after the barrier; the building process (local "
            f"rank 0) must see the same data.cache_dir"
        )
    meta = read_meta(folder)
    train_segments, val_segments = (
        _shard_segments(folder, split, meta) for split in ("train", "val")
    )
    if sum(s.tokens for s in val_segments) < seq_len + 1:
        log.info("held-out documents are shorter than one window; using the last tokens instead")
        train_segments, val_segments = split_tail(train_segments, d.val_fraction, seq_len + 1)
    train, val = _windows(train_segments, val_segments, seq_len, "data.max_bytes / data.paths")
    description = (
        f"{meta['source']}, tokenizer {meta['tokenizer']} (vocab {meta['vocab_size']:,}), "
        f"{_counts(train, val)}, cache {folder}"
    )
    return TokenData(
        train, val, meta["vocab_size"], meta["eot_id"], description, str(folder), tokenizer.save
    )


def _text_source(d):
    if d.source == "stdlib":
        return stdlib_source(max_bytes=d.max_bytes, val_fraction=d.val_fraction)
    if d.source == "text_files":
        return text_files_source(
            patterns=list(d.paths), max_bytes=d.max_bytes, val_fraction=d.val_fraction
        )
    if d.source == "wikitext2":
        return wikitext_source(hf_path=d.hf_path, hf_name=d.hf_name, val_fraction=d.val_fraction)
    raise ValueError(
        f"data.source={d.source}: not one of stdlib, text_files, wikitext2, memmap, synthetic"
    )


def _cache_key(source, tokenizer: Tokenizer, shard_tokens: int) -> str:
    return fingerprint(
        {
            "format": CACHE_FORMAT,
            "source": source.identity,
            "tokenizer": tokenizer.fingerprint,
            "shard_tokens": shard_tokens,
        }
    )


def _shard_segments(folder: Path, split: str, meta: dict) -> list[Segment]:
    return [
        Segment(str(folder / shard_name(split, i)), meta["dtype"], 0, n)
        for i, n in enumerate(meta["shards"][split])
    ]


def _windows(
    train_segments: list[Segment], val_segments: list[Segment], seq_len: int, what: str
) -> tuple[TokenWindows, TokenWindows]:
    """Both splits as windows; a split without a single window is a config error."""
    pair = TokenWindows(train_segments, seq_len), TokenWindows(val_segments, seq_len)
    for name, windows in zip(("training", "validation"), pair, strict=True):
        if len(windows) == 0:
            tokens = sum(s.tokens for s in windows.segments)
            raise ValueError(
                f"the {name} split has {tokens:,} tokens, not one window of trainer.seq_len + 1"
                f" = {seq_len + 1}; give more data ({what}) or a shorter trainer.seq_len"
            )
    return pair


def _counts(train: TokenWindows, val: TokenWindows) -> str:
    def tokens(w: TokenWindows) -> int:
        return sum(s.tokens for s in w.segments)

    return (
        f"{tokens(train):,} train / {tokens(val):,} val tokens "
        f"({len(train):,} / {len(val):,} windows)"
    )


def _required_vocab(d) -> int:
    if d.vocab_size is None:
        raise ValueError(f"data.vocab_size is not set; data.source={d.source} needs it")
    return int(d.vocab_size)


def _expand(paths) -> list[str]:
    return [os.path.expanduser(p) for p in paths]
