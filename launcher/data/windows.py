"""Fixed-length training windows over token shards, as a map-style Dataset.

Every sample is `seq_len + 1` consecutive tokens cut without overlap from one shard, so
an index names the same tokens on every rank, in every worker and after a restart: that is
what lets the sampler define the data order by index arithmetic alone. Shards are opened as
memmaps lazily, once per process, so the dataset pickles into DataLoader workers as a few
paths and numbers rather than as token arrays.
"""

from __future__ import annotations

import bisect
import itertools
import math
import os
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset

SPLITS = ("train", "val")


@dataclass(frozen=True)
class Segment:
    """The tokens [start, stop) of one raw token file of `dtype`."""

    path: str
    dtype: str
    start: int
    stop: int

    @property
    def tokens(self) -> int:
        return self.stop - self.start


def file_segment(path: str, dtype: str) -> Segment:
    """The whole of a raw token file (nanoGPT's train.bin layout) as one segment."""
    size = os.path.getsize(path)
    itemsize = np.dtype(dtype).itemsize
    if size % itemsize:
        raise ValueError(
            f"{path}: {size} bytes is not a whole number of {dtype} tokens; check data.dtype"
        )
    return Segment(path, dtype, 0, size // itemsize)


# Tokens compared at a time when a file's ids are checked: 64 Mi ids, 128 MB of uint16.
ID_CHUNK = 1 << 26


def id_problem(path: str, dtype: str, vocab: int) -> str | None:
    """The first token id of a pre-tokenized file outside [0, vocab), named with its
    position, or None. An id at or above the vocabulary would otherwise fail deep in the
    embedding (`IndexError`, no file named), or, on a GPU, as a device-side assert."""
    ids = np.memmap(path, dtype=dtype, mode="r") if os.path.getsize(path) else np.empty(0)
    for start in range(0, len(ids), ID_CHUNK):
        chunk = ids[start : start + ID_CHUNK]
        bad = (chunk >= vocab) | (chunk < 0)
        if bad.any():
            where = start + int(np.argmax(bad))
            return (
                f"{path}: token id {int(ids[where])} at position {where:,} is outside the "
                f"vocabulary (data.vocab_size={vocab}: ids 0-{vocab - 1}); set "
                f"data.vocab_size to the tokenizer's size, or data.dtype to the dtype the "
                f"file was written with"
            )
    return None


def split_tail(
    segments: list[Segment], fraction: float, min_tokens: int
) -> tuple[list[Segment], list[Segment]]:
    """Cut the last `fraction` of the tokens (at least `min_tokens`) off as validation.

    Used where no held-out documents or files exist, so the two parts never share a token.
    """
    total = sum(s.tokens for s in segments)
    take = max(math.ceil(total * fraction), min_tokens)
    train, val = list(segments), []
    taken, has_window = 0, False
    while train and (taken < take or not has_window):
        last = train.pop()
        n = min(last.tokens, max(take - taken, 0))
        if not has_window:
            # A tail over short shards must still hold one whole window in one segment.
            n = max(n, min(last.tokens, min_tokens))
        has_window = has_window or n >= min_tokens
        cut = last.stop - n
        val.insert(0, Segment(last.path, last.dtype, cut, last.stop))
        if cut > last.start:
            train.append(Segment(last.path, last.dtype, last.start, cut))
        taken += n
    return train, val


class TokenWindows(Dataset):
    """Non-overlapping windows of seq_len + 1 tokens; item i is (x, y) with y = x shifted by one.

    A window never crosses a segment boundary, so each shard's tail shorter than a window is
    left unused.
    """

    def __init__(self, segments: list[Segment], seq_len: int):
        self.segments = list(segments)
        self.seq_len = seq_len
        counts = [s.tokens // (seq_len + 1) for s in self.segments]
        self._ends = list(itertools.accumulate(counts))
        self._maps: dict[str, np.memmap] = {}

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(f"window {index} out of range for {len(self)} windows")
        k = bisect.bisect_right(self._ends, index)
        first = self._ends[k - 1] if k else 0
        seg = self.segments[k]
        start = seg.start + (index - first) * (self.seq_len + 1)
        tokens = self._memmap(seg)[start : start + self.seq_len + 1]
        window = torch.from_numpy(tokens.astype(np.int64))
        return window[:-1], window[1:]

    def _memmap(self, seg: Segment) -> np.memmap:
        if seg.path not in self._maps:
            self._maps[seg.path] = np.memmap(seg.path, dtype=seg.dtype, mode="r")
        return self._maps[seg.path]

    def __getstate__(self) -> dict:
        # Memmaps stay behind: each worker process opens its own on first use.
        return {**self.__dict__, "_maps": {}}


class SyntheticWindows(TokenWindows):
    """Random tokens drawn from (seed, split, index): no files, same window on every read.

    For measuring pure training throughput without I/O or tokenization in the way.
    """

    def __init__(self, *, vocab_size: int, seq_len: int, seed: int, split: str, length: int):
        super().__init__([], seq_len)
        self.vocab_size = vocab_size
        self.seed = seed
        self.split_id = SPLITS.index(split)
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < self.length:
            raise IndexError(f"window {index} out of range for {self.length} windows")
        rng = np.random.default_rng([self.seed % 2**64, self.split_id, index])
        window = torch.from_numpy(rng.integers(0, self.vocab_size, self.seq_len + 1))
        return window[:-1], window[1:]
