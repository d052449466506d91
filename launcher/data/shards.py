"""Tokenize a text source into raw token shards plus a meta.json describing them.

Shards are flat arrays of token ids (nanoGPT's train.bin layout) so training reads them
as memmaps with no parsing; each holds at most data.shard_tokens tokens so no single file
grows past what a filesystem or a copy handles comfortably. Documents are encoded in
batches (the encoders parallelize across a batch) and each is followed by the end-of-text
token when the tokenizer has one.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from launcher.data.tokenizer import Tokenizer
from launcher.data.windows import SPLITS

log = logging.getLogger(__name__)

META = "meta.json"
BATCH_CHARS = 4_000_000
BATCH_DOCS = 1024


def token_dtype(vocab_size: int) -> str:
    """The narrowest dtype that holds every id: uint16 up to 65,536 ids, else uint32."""
    return "uint16" if vocab_size <= 2**16 else "uint32"


def shard_name(split: str, index: int) -> str:
    return f"{split}_{index:03d}.bin"


class ShardWriter:
    """Appends tokens to <split>_000.bin, <split>_001.bin, ..., at most shard_tokens each."""

    def __init__(self, folder: Path, split: str, dtype: str, shard_tokens: int):
        self.folder, self.split, self.dtype = folder, split, dtype
        self.shard_tokens = shard_tokens
        self.counts: list[int] = []

    def write(self, tokens: np.ndarray) -> None:
        while len(tokens):
            if not self.counts or self.counts[-1] == self.shard_tokens:
                self.counts.append(0)
            chunk = tokens[: self.shard_tokens - self.counts[-1]]
            path = self.folder / shard_name(self.split, len(self.counts) - 1)
            with open(path, "ab") as f:
                f.write(chunk.astype(self.dtype).tobytes())
            self.counts[-1] += len(chunk)
            tokens = tokens[len(chunk) :]


def write_token_shards(
    folder: Path,
    documents: Iterable[tuple[str, str]],
    tokenizer: Tokenizer,
    *,
    shard_tokens: int,
    source_description: str,
) -> None:
    """Tokenize (split, text) documents into `folder`'s shards, then write meta.json."""
    started = time.perf_counter()
    dtype = token_dtype(tokenizer.vocab_size)
    writers = {split: ShardWriter(folder, split, dtype, shard_tokens) for split in SPLITS}
    ndocs = dict.fromkeys(SPLITS, 0)
    suffix = [] if tokenizer.eot_id is None else [tokenizer.eot_id]
    for split, texts in _batches(documents):
        ids = tokenizer.encode_batch(texts)
        writers[split].write(np.fromiter((t for doc in ids for t in doc + suffix), np.int64))
        ndocs[split] += len(texts)
    meta = {
        "dtype": dtype,
        "vocab_size": tokenizer.vocab_size,
        "eot_id": tokenizer.eot_id,
        "tokenizer": tokenizer.description,
        "source": source_description,
        "documents": ndocs,
        "shards": {split: writers[split].counts for split in SPLITS},
    }
    (folder / META).write_text(json.dumps(meta, indent=1))
    log.info(
        "tokenized %d documents into %d train / %d val tokens in %.1f s",
        sum(ndocs.values()),
        sum(meta["shards"]["train"]),
        sum(meta["shards"]["val"]),
        time.perf_counter() - started,
    )


def read_meta(folder: Path) -> dict:
    return json.loads((folder / META).read_text())


def _batches(documents: Iterable[tuple[str, str]]) -> Iterator[tuple[str, list[str]]]:
    """Group documents per split into batches of about BATCH_CHARS, keeping their order."""
    pending: dict[str, list[str]] = {split: [] for split in SPLITS}
    chars = dict.fromkeys(SPLITS, 0)
    for split, text in documents:
        pending[split].append(text)
        chars[split] += len(text)
        if chars[split] >= BATCH_CHARS or len(pending[split]) >= BATCH_DOCS:
            yield split, pending[split]
            pending[split], chars[split] = [], 0
    for split in SPLITS:
        if pending[split]:
            yield split, pending[split]
