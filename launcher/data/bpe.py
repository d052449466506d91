"""A byte-level BPE trained on the source's own training documents, cached once per source.

The fallback when GPT-2's files are not at hand offline: byte-level, so every text encodes
without unknown tokens, with `<|endoftext|>` appended as the last id (as in GPT-2) to
separate documents. Training takes seconds on a few MB, so it runs once and the result is
kept in the cache folder keyed by (source identity, vocab size).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from launcher.data.cache import fingerprint, publish_dir
from launcher.data.tokenizer import EOT, Tokenizer, from_tokenizers

log = logging.getLogger(__name__)

MIN_VOCAB = 257  # the 256 byte tokens plus <|endoftext|>


def train_bpe(texts: Iterable[str], vocab_size: int) -> HFTokenizer:
    """Train a byte-level BPE of `vocab_size` ids in all, the last being <|endoftext|>."""
    if vocab_size < MIN_VOCAB:
        raise ValueError(f"data.bpe_vocab_size={vocab_size}: must be at least {MIN_VOCAB}")
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 1,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.add_special_tokens([EOT])
    return tok


def bpe_folder(source, vocab_size: int, cache_root: Path) -> Path:
    """Where the BPE of `source` at `vocab_size` is cached (trained or not yet)."""
    return cache_root / f"bpe-{fingerprint({'source': source.identity, 'vocab_size': vocab_size})}"


def bpe_tokenizer(source, *, vocab_size: int, cache_root: Path, may_train: bool) -> Tokenizer:
    """The cached BPE for `source`, trained first if missing and `may_train`."""
    folder = bpe_folder(source, vocab_size, cache_root)
    path = folder / "tokenizer.json"
    if not path.is_file():
        if not may_train:
            raise FileNotFoundError(
                f"{path}: the trained BPE is missing; the building process (local rank 0) "
                f"did not write it to data.cache_dir"
            )
        started = time.perf_counter()
        texts = (text for split, text in source.documents() if split == "train")
        tok = train_bpe(texts, vocab_size)
        # First publisher wins, and every process loads the published file, so all ranks
        # encode with the same merges even if two nodes trained at once.
        publish_dir(folder, lambda tmp: tok.save(str(tmp / path.name)))
        elapsed = time.perf_counter() - started
        log.info("trained a %d-token byte-level BPE in %.1f s: %s", vocab_size, elapsed, path)
    backend = HFTokenizer.from_file(str(path))
    return from_tokenizers(backend, f"bpe {vocab_size} ({folder.name})", backend.token_to_id(EOT))
