"""Resolve data.tokenizer into the one thing the shard builder needs: a batch encoder.

Accepted values: `auto` (GPT-2's BPE if its files are at hand offline, else a trained
byte-level BPE), `bpe`, a hub name, a folder holding vocab.json + merges.txt, or a
`.tiktoken` file. Every route ends in either tiktoken or an HF `tokenizers.Tokenizer`,
the two fast batch encoders; their fingerprint (a hash of the vocabulary and merges, not of
the spelling in the config) keys the token cache.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

EOT = "<|endoftext|>"
TOKENIZER_DIR = "tokenizer"  # the run directory's copy of its tokenizer (save_for_transformers)
GPT2_NAME = "gpt2"  # GPT-2's tokenizer on the Hugging Face hub
# tiktoken's r50k_base is GPT-2's BPE; its published file and hash, as tiktoken caches it.
R50K_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"
R50K_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Tokenizer:
    """A batch encoder with its vocabulary size, end-of-text id and fingerprint."""

    description: str
    vocab_size: int
    eot_id: int | None
    fingerprint: str
    encode_batch: Callable[[list[str]], list[list[int]]]
    # writes the tokenizer as a folder transformers' AutoTokenizer loads (None: a tiktoken
    # file, which has no such form; the run then has no tokenizer/ for launcher.generate)
    save: Callable[[Path], None] | None = None


def resolve_tokenizer(spec: str, *, bpe: Callable[[], Tokenizer]) -> Tokenizer:
    """The tokenizer data.tokenizer names; `bpe`, and `auto` without GPT-2, call `bpe`.

    The caller decides what `bpe` may do: the builder trains it if not cached, the processes
    that wait for the builder only load it.
    """
    if spec == "auto":
        return _auto(bpe)
    if spec == "bpe":
        return bpe()
    problem = tokenizer_path_problem(spec)
    if problem:
        raise ValueError(problem)
    path = os.path.expanduser(spec)
    if os.path.isdir(path):
        return gpt2_folder_tokenizer(path)
    if os.path.isfile(path):
        return tiktoken_file_tokenizer(path)
    return hub_tokenizer(spec)


def tokenizer_path_problem(spec: str) -> str | None:
    """Why a `data.tokenizer` that names local files cannot be used, or None (also for
    `auto`, `bpe` and hub names). The preflight asks this before anything starts."""
    if spec in ("auto", "bpe"):
        return None
    path = os.path.expanduser(spec)
    if os.path.isdir(path):
        missing = [f for f in ("vocab.json", "merges.txt") if not os.path.isfile(f"{path}/{f}")]
        return f"data.tokenizer={spec}: folder lacks {', '.join(missing)}" if missing else None
    if os.path.isfile(path) and path.endswith(".tiktoken"):
        return None
    if os.path.exists(path) or path.endswith(".tiktoken") or spec.startswith(("/", ".", "~")):
        return (
            f"data.tokenizer={spec}: not an existing .tiktoken file nor a folder holding "
            f"vocab.json + merges.txt"
        )
    return None


def _auto(bpe: Callable[[], Tokenizer]) -> Tokenizer:
    if gpt2_may_be_offline():
        try:
            tok = _transformers_tokenizer(GPT2_NAME, local_files_only=True)
        except Exception as exc:  # noqa: BLE001 - any failure here means "not in the HF cache"
            log.debug("GPT-2 not in the Hugging Face cache: %s", exc)
        else:
            log.info("data.tokenizer=auto: GPT-2 BPE from the Hugging Face cache")
            return tok
    cached = cached_gpt2_tiktoken()
    if cached is not None:
        log.info("data.tokenizer=auto: GPT-2 BPE from %s", cached)
        return tiktoken_file_tokenizer(cached)
    log.info("data.tokenizer=auto: no GPT-2 BPE files offline; using a trained byte-level BPE")
    return bpe()


def gpt2_may_be_offline() -> bool:
    """Whether transformers could load GPT-2's tokenizer offline: a `gpt2` folder in the
    working directory, or the hub cache's folder for it. Asked before importing transformers,
    which takes about 2 s and, without these, can only fail."""
    from huggingface_hub import constants

    caches = {constants.HF_HUB_CACHE, os.environ.get("TRANSFORMERS_CACHE")} - {None}
    hub_folder = f"models--{GPT2_NAME}"
    return os.path.isdir(GPT2_NAME) or any(
        os.path.isdir(os.path.join(c, hub_folder)) for c in caches
    )


def cached_gpt2_tiktoken() -> str | None:
    """GPT-2's .tiktoken file in $TIKTOKEN_CACHE_DIR (tiktoken's cache name or a plain name)."""
    folder = os.environ.get("TIKTOKEN_CACHE_DIR")
    if not folder:
        return None
    names = (hashlib.sha1(R50K_URL.encode()).hexdigest(), "r50k_base.tiktoken", "gpt2.tiktoken")
    for name in names:
        path = os.path.join(folder, name)
        if os.path.isfile(path) and _sha256(Path(path).read_bytes()) == R50K_SHA256:
            return path
    return None


def tiktoken_file_tokenizer(path: str) -> Tokenizer:
    """A .tiktoken file (base64 token, rank per line) with GPT-2's split pattern and EOT."""
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe
    from tiktoken_ext.openai_public import r50k_pat_str

    digest = _sha256(Path(path).read_bytes())
    # The expected hash makes tiktoken drop a stale cached copy of an edited file.
    ranks = load_tiktoken_bpe(path, expected_hash=digest)
    enc = tiktoken.Encoding(
        name=f"tiktoken:{Path(path).name}",
        pat_str=r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={EOT: len(ranks)},
    )
    return Tokenizer(
        description=f"tiktoken {path}",
        vocab_size=enc.n_vocab,
        eot_id=enc.eot_token,
        fingerprint=digest,
        encode_batch=enc.encode_ordinary_batch,
    )


def gpt2_folder_tokenizer(folder: str) -> Tokenizer:
    """GPT-2-style BPE from a folder holding vocab.json and merges.txt."""
    from transformers import GPT2TokenizerFast

    # from_pretrained maps the files onto the right keywords; in transformers 5.x passing
    # vocab_file=/merges_file= to the constructor silently builds an empty tokenizer.
    return from_transformers(GPT2TokenizerFast.from_pretrained(folder), f"gpt2-bpe {folder}")


def hub_tokenizer(name: str) -> Tokenizer:
    """A tokenizer from the Hugging Face hub (or its local cache)."""
    try:
        return _transformers_tokenizer(name, local_files_only=False)
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(
            f"data.tokenizer={name}: could not load it from the Hugging Face hub or cache "
            f"({first}); offline, give a folder with vocab.json + merges.txt, a .tiktoken "
            f"file, or data.tokenizer=bpe"
        ) from exc


def _transformers_tokenizer(name: str, *, local_files_only: bool) -> Tokenizer:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(name, local_files_only=local_files_only)
    return from_transformers(tok, name)


def from_transformers(tok, description: str) -> Tokenizer:
    """Wrap a transformers tokenizer through its fast `tokenizers` backend."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(f"data.tokenizer={description}: has no fast (tokenizers) backend")
    return from_tokenizers(backend, description, tok.eos_token_id)


def from_tokenizers(backend, description: str, eot_id: int | None) -> Tokenizer:
    """Wrap an HF `tokenizers.Tokenizer`; special-token text in documents stays plain text."""
    backend.encode_special_tokens = True

    def encode_batch(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]

    return Tokenizer(
        description=description,
        vocab_size=backend.get_vocab_size(with_added_tokens=True),
        eot_id=eot_id,
        fingerprint=_sha256(backend.to_str().encode()),
        encode_batch=encode_batch,
        save=lambda folder: save_for_transformers(backend, eot_id, folder),
    )


def saved_vocab_size(folder: Path) -> int | None:
    """The vocabulary of a tokenizer saved by save_for_transformers (a run directory's
    tokenizer/), with its added tokens as the model counts them; None without one."""
    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer as Backend

    try:
        return Backend.from_file(str(path)).get_vocab_size(with_added_tokens=True)
    except Exception:  # noqa: BLE001 - tokenizers raises its own kinds for a damaged file
        return None


def save_for_transformers(backend, eot_id: int | None, folder: Path) -> None:
    """tokenizer.json and tokenizer_config.json in `folder`: what `AutoTokenizer` (as a
    PreTrainedTokenizerFast) and launcher.generate load, written without importing
    transformers (seconds of start-up on every run otherwise)."""
    eot = backend.id_to_token(eot_id) if eot_id is not None else None
    specials = {"bos_token": eot, "eos_token": eot, "unk_token": eot} if eot else {}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **specials}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        backend.save(str(folder / "tokenizer.json"))
        (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    except OSError as exc:  # a full disk: training goes on, generate then says what is missing
        log.warning("could not save the tokenizer into %s: %s", folder, exc)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
