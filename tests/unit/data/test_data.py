"""The data pipeline on real files: sources, tokenizers, the token cache, loaders, /dev/shm.

Everything runs offline: tokenizers are trained or built here, text comes from the
standard library or from files the tests write, and the cache lives under tmp_path.
"""

from __future__ import annotations

import base64
import contextlib
import json
import multiprocessing
import os
import pickle
import random
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from launcher.config import DataConfig
from launcher.config.batch import BatchPlan
from launcher.data.bpe import train_bpe
from launcher.data.cache import publish_dir
from launcher.data.holdout import assign_splits
from launcher.data.loader import (
    build_eval_batches,
    build_train_loader,
    ignore_stop_signals,
    stop_signals_held,
)
from launcher.data.prepare import prepare_data
from launcher.data.shards import ShardWriter, token_dtype
from launcher.data.shm import check_shm, human_bytes, shm_need_bytes
from launcher.data.tokenizer import cached_gpt2_tiktoken, resolve_tokenizer
from launcher.data.wikitext import articles
from launcher.data.windows import Segment, SyntheticWindows, TokenWindows, split_tail
from launcher.runtime.disk import shm_available_bytes

from text_corpus import article_folder, prose


@pytest.fixture(autouse=True)
def offline_caches(tmp_path, monkeypatch):
    """Every cache the pipeline or its libraries write goes under tmp_path."""
    monkeypatch.setenv("LAUNCHER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken-cache"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def data_cfg(**fields):
    cfg = OmegaConf.structured(DataConfig)
    for key, value in fields.items():
        cfg[key] = value
    return cfg


def noop() -> None:
    pass


def tree_mtimes(folder: str) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in Path(folder).iterdir()}


def arange_windows(tmp_path: Path, num_windows: int, seq_len: int) -> TokenWindows:
    """Windows whose first token is (index * (seq_len + 1)): each batch names its windows."""
    path = tmp_path / "arange.bin"
    np.arange(num_windows * (seq_len + 1), dtype=np.uint32).tofile(path)
    return TokenWindows([Segment(str(path), "uint32", 0, num_windows * (seq_len + 1))], seq_len)


def window_ids(x: torch.Tensor, seq_len: int) -> list[int]:
    return (x[:, 0] // (seq_len + 1)).tolist()


# --- sources, tokenization and the cache ---------------------------------------------------


def test_stdlib_bpe_builds_shards_and_reuses_cache():
    cfg = data_cfg(
        source="stdlib", tokenizer="bpe", max_bytes=300_000, bpe_vocab_size=512, shard_tokens=40_000
    )
    data = prepare_data(cfg, seq_len=64, seed=0, is_builder=True, wait=noop)
    meta = json.loads((Path(data.cache_path) / "meta.json").read_text())
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == data.vocab_size == 512
    assert data.eot_id == meta["eot_id"] == 511
    counts = meta["shards"]["train"]
    assert len(counts) > 1 and max(counts) <= 40_000
    assert (Path(data.cache_path) / "train_001.bin").stat().st_size == counts[1] * 2
    # Windows never cross a shard boundary.
    assert len(data.train) == sum(s.tokens // 65 for s in data.train.segments)
    x, y = data.train[len(data.train) - 1]
    assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (64,)
    assert torch.equal(x[1:], y[:-1]) and int(x.max()) < 512
    assert len(data.val) >= 1 and data.cache_path in data.description

    before = tree_mtimes(data.cache_path)
    again = prepare_data(cfg, seq_len=64, seed=0, is_builder=True, wait=noop)
    assert again.cache_path == data.cache_path
    assert tree_mtimes(again.cache_path) == before
    assert torch.equal(again.train[5][0], data.train[5][0])


def test_non_builder_waits_then_opens_the_builders_cache():
    cfg = data_cfg(source="stdlib", tokenizer="bpe", max_bytes=100_000, bpe_vocab_size=300)
    with pytest.raises(FileNotFoundError, match="local rank 0"):
        prepare_data(cfg, seq_len=32, seed=0, is_builder=False, wait=noop)
    built: list = []

    def barrier() -> None:  # the builder on another rank finishes before the barrier opens
        built.append(prepare_data(cfg, seq_len=32, seed=0, is_builder=True, wait=noop))

    data = prepare_data(cfg, seq_len=32, seed=0, is_builder=False, wait=barrier)
    assert data.cache_path == built[0].cache_path
    assert torch.equal(data.train[3][0], built[0].train[3][0])


def test_too_little_text_names_the_keys_to_change():
    cfg = data_cfg(source="stdlib", tokenizer="bpe", max_bytes=300, bpe_vocab_size=300)
    with pytest.raises(ValueError, match=r"data\.max_bytes.*trainer\.seq_len"):
        prepare_data(cfg, seq_len=1024, seed=0, is_builder=True, wait=noop)


def test_token_dtype_widens_past_65536():
    assert token_dtype(512) == "uint16"
    assert token_dtype(65_536) == "uint16"
    assert token_dtype(65_537) == "uint32"
    assert token_dtype(100_277) == "uint32"


def test_shard_writer_rolls_over(tmp_path):
    writer = ShardWriter(tmp_path, "train", "uint32", shard_tokens=10)
    writer.write(np.arange(7))
    writer.write(np.arange(70_000, 70_008))
    assert writer.counts == [10, 5]
    first = np.fromfile(tmp_path / "train_000.bin", dtype=np.uint32)
    assert first.tolist() == [0, 1, 2, 3, 4, 5, 6, 70_000, 70_001, 70_002]


def test_text_files_globs(tmp_path):
    corpus = tmp_path / "corpus"
    for i, rel in enumerate(["a/one.txt", "a/b/two.txt", "c/three.txt", "c/skip.md", "four.txt"]):
        (corpus / rel).parent.mkdir(parents=True, exist_ok=True)
        (corpus / rel).write_text(prose(i, 3000))
    cfg = data_cfg(
        source="text_files",
        paths=[str(corpus / "**" / "*.txt"), str(corpus / "a" / "*.txt")],
        tokenizer="bpe",
        bpe_vocab_size=300,
    )
    data = prepare_data(cfg, seq_len=32, seed=0, is_builder=True, wait=noop)
    meta = json.loads((Path(data.cache_path) / "meta.json").read_text())
    assert meta["documents"]["train"] + meta["documents"]["val"] == 4  # .md not matched, no dups
    assert meta["documents"]["val"] >= 1 and len(data.val) >= 1
    with pytest.raises(ValueError, match="data.paths"):
        prepare_data(
            data_cfg(source="text_files", paths=[str(tmp_path / "none*.txt")]),
            seq_len=32,
            seed=0,
            is_builder=True,
            wait=noop,
        )


def test_holdout_is_stable_and_never_empty():
    names = [f"doc{i}" for i in range(200)]
    splits = assign_splits(names, 0.1)
    assert splits == assign_splits(names, 0.1)
    assert 5 <= splits.count("val") <= 40
    assert assign_splits(["x", "y"], 1e-9).count("val") == 1
    assert assign_splits(["only"], 0.999) == ["train"]


def test_memmap_source(tmp_path):
    tokens = (np.arange(20_000) % 997).astype(np.uint16)
    tokens.tofile(tmp_path / "train.bin")
    cfg = data_cfg(source="memmap", paths=[str(tmp_path / "train.bin")], vocab_size=997)
    data = prepare_data(cfg, seq_len=99, seed=0, is_builder=True, wait=noop)
    assert data.vocab_size == 997 and data.cache_path is None and data.eot_id is None
    assert len(data.val) == 10 and len(data.train) == 190  # the last 5% = 1,000 tokens
    x, y = data.train[3]
    assert x.tolist() == (np.arange(300, 399) % 997).tolist()
    assert y.tolist() == (np.arange(301, 400) % 997).tolist()
    assert data.val[0][0][0].item() == 19_000 % 997

    tokens[:500].tofile(tmp_path / "val.bin")
    cfg.val_paths = [str(tmp_path / "val.bin")]
    data = prepare_data(cfg, seq_len=99, seed=0, is_builder=True, wait=noop)
    assert len(data.train) == 200 and len(data.val) == 5


def test_split_tail_keeps_a_window_over_short_shards():
    segments = [Segment("a", "uint16", 0, 1000), Segment("b", "uint16", 0, 5)]
    train, val = split_tail(segments, 0.01, 65)
    assert [s.tokens for s in val] == [65, 5] and [s.tokens for s in train] == [935]
    assert len(TokenWindows(val, 64)) == 1
    train, val = split_tail([Segment("a", "uint16", 0, 1000)] * 2, 0.5, 65)
    assert [s.tokens for s in val] == [1000] and [s.tokens for s in train] == [1000]
    train, val = split_tail([Segment("a", "uint16", 0, 40)] * 3, 0.1, 65)
    assert train == [] and sum(s.tokens for s in val) == 120


def test_synthetic_is_deterministic_without_files():
    cfg = data_cfg(source="synthetic", vocab_size=1000)
    one = prepare_data(cfg, seq_len=16, seed=3, is_builder=True, wait=noop)
    two = prepare_data(cfg, seq_len=16, seed=3, is_builder=False, wait=noop)
    assert len(one.train) == 1_000_000 and len(one.val) == 1_000 and one.vocab_size == 1000
    assert torch.equal(one.train[123_456][0], two.train[123_456][0])
    x, y = one.train[7]
    assert torch.equal(x[1:], y[:-1]) and int(x.min()) >= 0 and int(x.max()) < 1000
    assert not torch.equal(one.train[7][0], one.val[7][0])
    other = SyntheticWindows(vocab_size=1000, seq_len=16, seed=4, split="train", length=10)
    assert not torch.equal(other[7][0], x)


def test_wikitext2_from_a_local_folder(tmp_path):
    folder = article_folder(tmp_path / "wikitext")
    cfg = data_cfg(source="wikitext2", hf_path=str(folder), hf_name=None, bpe_vocab_size=300)
    cfg.tokenizer = "bpe"
    data = prepare_data(cfg, seq_len=32, seed=0, is_builder=True, wait=noop)
    meta = json.loads((Path(data.cache_path) / "meta.json").read_text())
    assert meta["documents"] == {"train": 6, "val": 2}
    assert len(data.train) > 0 and len(data.val) > 0


def test_wikitext_articles_split_at_top_level_headings():
    lines = [" = A = ", " ", " text a ", " = = Sub = = ", " more a ", " = B = ", " text b "]
    assert list(articles(lines)) == [
        " = A = \n \n text a \n = = Sub = = \n more a ",
        " = B = \n text b ",
    ]


# --- tokenizer files -----------------------------------------------------------------------


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level vocab.json."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    chars = list(keep)
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(keep, map(chr, chars), strict=True))


@pytest.fixture
def bpe_files(tmp_path):
    """A small trained byte-level BPE saved as vocab.json + merges.txt and as a .tiktoken."""
    texts = [Path(m.__file__).read_text() for m in (json, os, random)]
    texts.append("def f(x):\n    return x + 1  # é ü 字\n")
    trained = train_bpe(texts, 400)
    folder = tmp_path / "bpe-folder"
    folder.mkdir()
    trained.model.save(str(folder))
    vocab = json.loads((folder / "vocab.json").read_text())
    decode = {c: b for b, c in bytes_to_unicode().items()}
    lines = [
        f"{base64.b64encode(bytes(decode[c] for c in token)).decode()} {rank}"
        for token, rank in sorted(vocab.items(), key=lambda kv: kv[1])
    ]
    tiktoken_path = tmp_path / "small.tiktoken"
    tiktoken_path.write_text("\n".join(lines) + "\n")
    return trained, folder, tiktoken_path


def test_folder_and_tiktoken_routes_agree(bpe_files):
    trained, folder, tiktoken_path = bpe_files
    from_folder = resolve_tokenizer(str(folder), bpe=lambda: pytest.fail("no bpe"))
    from_tiktoken = resolve_tokenizer(str(tiktoken_path), bpe=lambda: pytest.fail("no bpe"))
    assert from_folder.vocab_size == from_tiktoken.vocab_size == 400
    assert from_folder.eot_id == from_tiktoken.eot_id == trained.token_to_id("<|endoftext|>") == 399
    texts = ["the model reads a shard.", "def f(x):\n    return x + 1  # é ü 字", "<|endoftext|>"]
    expected = [e.ids for e in trained.encode_batch(texts)[:2]]
    assert from_folder.encode_batch(texts)[:2] == expected
    assert from_tiktoken.encode_batch(texts) == from_folder.encode_batch(texts)
    assert 399 not in from_tiktoken.encode_batch(texts)[2]  # special text stays plain text
    assert from_folder.fingerprint != from_tiktoken.fingerprint


def test_tiktoken_file_drives_the_cache(tmp_path, bpe_files):
    _, _, tiktoken_path = bpe_files
    (tmp_path / "doc.txt").write_text(prose(9, 4000))
    cfg = data_cfg(source="text_files", paths=[str(tmp_path / "doc.txt")])
    cfg.tokenizer = str(tiktoken_path)
    data = prepare_data(cfg, seq_len=32, seed=0, is_builder=True, wait=noop)
    assert data.vocab_size == 400 and data.eot_id == 399 and "tiktoken" in data.description
    # One document only: validation is the last val_fraction of its tokens.
    assert len(data.val) >= 1 and len(data.train) > len(data.val)


def test_unusable_tokenizer_paths_are_named(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    for spec in (tmp_path / "nope.tiktoken", tmp_path / "tokenizer.json", tmp_path / "nope"):
        with pytest.raises(ValueError, match="data.tokenizer="):
            resolve_tokenizer(str(spec), bpe=lambda: pytest.fail("no bpe"))


def test_auto_ignores_a_tiktoken_that_is_not_gpt2(tmp_path, bpe_files):
    _, _, tiktoken_path = bpe_files
    cache = Path(os.environ["TIKTOKEN_CACHE_DIR"])
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "gpt2.tiktoken").write_bytes(tiktoken_path.read_bytes())
    assert cached_gpt2_tiktoken() is None


def test_publish_dir_discards_the_slower_builders_copy(tmp_path):
    final = tmp_path / "entry"

    def slow_build(tmp: Path) -> None:
        (tmp / "mine").write_text("loser")
        final.mkdir()  # another node renames its finished entry in first
        (final / "theirs").write_text("winner")

    assert publish_dir(final, slow_build) is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry"]
    assert (final / "theirs").read_text() == "winner"
    assert publish_dir(final, lambda tmp: pytest.fail("already published")) is False


# --- the train loader and eval batches ----------------------------------------------------


def loader(windows, *, world_size=1, rank=0, seed=0, start_step=0, num_workers=0, **kw):
    plan = BatchPlan(kw.get("global_batch", 8), kw.get("micro_batch", 2), world_size, seq_len=8)
    return build_train_loader(
        windows,
        plan,
        rank=rank,
        seed=seed,
        start_step=start_step,
        num_workers=num_workers,
        pin_memory=False,
        persistent_workers=num_workers > 0,
        prefetch_factor=2,
    )


def take_steps(dl, steps: int, accum: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    it = iter(dl)
    return [[next(it) for _ in range(accum)] for _ in range(steps)]


def step_x(step: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    return torch.cat([x for x, _ in step])


def test_ranks_split_each_global_batch_exactly(tmp_path):
    windows = arange_windows(tmp_path, 37, 8)
    single = take_steps(loader(windows), 12, accum=4)
    ranks = [take_steps(loader(windows, world_size=2, rank=r), 12, accum=2) for r in range(2)]
    for s in range(12):
        assert torch.equal(step_x(single[s]), torch.cat([step_x(ranks[0][s]), step_x(ranks[1][s])]))
        assert not set(window_ids(step_x(ranks[0][s]), 8)) & set(window_ids(step_x(ranks[1][s]), 8))
        for x, y in single[s]:
            assert x.shape == y.shape == (2, 8) and torch.equal(x[:, 1:], y[:, :-1])


def test_order_is_fixed_by_the_seed(tmp_path):
    windows = arange_windows(tmp_path, 37, 8)
    a, b = (step_x(sum(take_steps(loader(windows, seed=1), 5, 4), [])) for _ in range(2))
    c = step_x(sum(take_steps(loader(windows, seed=2), 5, 4), []))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_start_step_resumes_where_a_fresh_run_would_be(tmp_path):
    windows = arange_windows(tmp_path, 37, 8)
    fresh = take_steps(loader(windows, world_size=2, rank=1), 10, accum=2)
    resumed = take_steps(loader(windows, world_size=2, rank=1, start_step=7), 3, accum=2)
    for k in range(3):
        assert torch.equal(step_x(resumed[k]), step_x(fresh[7 + k]))
    far = next(iter(loader(windows, start_step=10**12)))[0]
    assert far.shape == (2, 8)


def test_epochs_roll_over_as_fresh_permutations(tmp_path):
    windows = arange_windows(tmp_path, 20, 8)
    stream = window_ids(step_x(sum(take_steps(loader(windows), 10, 4), [])), 8)  # 80 = 4 epochs
    epochs = [stream[i : i + 20] for i in range(0, 80, 20)]
    for epoch in epochs:
        assert sorted(epoch) == list(range(20))
    assert len({tuple(e) for e in epochs}) == 4


def test_workers_yield_the_same_batches(tmp_path):
    windows = arange_windows(tmp_path, 37, 8)
    plain = take_steps(loader(windows), 6, 4)
    copy = pickle.loads(pickle.dumps(windows))  # what a spawned worker receives
    assert copy._maps == {} and torch.equal(copy[5][0], windows[5][0])
    workers = take_steps(loader(windows, num_workers=2), 6, 4)
    for s in range(6):
        assert torch.equal(step_x(plain[s]), step_x(workers[s]))


def test_eval_batches_are_fixed_and_disjoint(tmp_path):
    windows = arange_windows(tmp_path, 10, 8)
    single = build_eval_batches(windows, micro_batch=2, num_batches=3, rank=0, world_size=1)
    parts = [
        build_eval_batches(windows, micro_batch=2, num_batches=3, rank=r, world_size=2)
        for r in range(2)
    ]
    assert [window_ids(x, 8) for x, _ in single] == [[0, 1], [2, 3], [4, 5]]
    ids = [window_ids(x, 8) for x, _ in parts[0]], [window_ids(x, 8) for x, _ in parts[1]]
    assert ids[0] == [[0, 1], [2, 3], [4, 5]] and ids[1] == [[6, 7], [8, 9], [0, 1]]  # wraps
    again = build_eval_batches(windows, micro_batch=2, num_batches=3, rank=1, world_size=2)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(again, parts[1], strict=True))


# --- shared memory -------------------------------------------------------------------------


def test_shm_need_follows_the_formula():
    assert shm_need_bytes(num_workers=0, prefetch_factor=4, micro_batch=8, seq_len=1024) == 0
    need = shm_need_bytes(num_workers=4, prefetch_factor=2, micro_batch=8, seq_len=1024)
    assert need == 4 * 2 * (2 * 8 * 1024 * 8) * 2


def test_check_shm_reports_both_numbers_and_the_fixes(tmp_path):
    assert check_shm(need=0, path=str(tmp_path)) is None
    assert check_shm(need=1, path=str(tmp_path)) is None
    assert check_shm(need=10**15, path=str(tmp_path / "missing")) is None
    assert shm_available_bytes(str(tmp_path / "missing")) is None
    free_before = shm_available_bytes(str(tmp_path))[1]
    message = check_shm(need=10**15, path=str(tmp_path))
    free_after = shm_available_bytes(str(tmp_path))[1]
    assert human_bytes(10**15) in message
    assert human_bytes(free_before) in message or human_bytes(free_after) in message
    assert "--shm-size" in message and "--ipc=host" in message and "emptyDir" in message
    assert "data.num_workers" in message and "\n" not in message


def _worker_start_with_a_stop_signal_in_between(queue) -> None:
    """What a DataLoader worker does at start-up, with a SIGTERM (torchrun's killpg)
    arriving between torch's worker signal handlers and the init function."""
    from torch.utils.data._utils import signal_handling

    signal_handling._set_worker_signal_handlers()  # torch's: SIGTERM kills the worker
    os.kill(os.getpid(), signal.SIGTERM)
    ignore_stop_signals(0)
    queue.put("alive")


@pytest.mark.parametrize("held", [True, False])
def test_a_stop_signal_while_a_worker_starts_does_not_kill_it(held):
    """Workers started under stop_signals_held are born with the stop signals blocked, so
    one that arrives before their init function ignores it is discarded, not fatal; the
    same start without the hold dies of it (the defect this guards against)."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    with stop_signals_held() if held else contextlib.nullcontext():
        worker = ctx.Process(target=_worker_start_with_a_stop_signal_in_between, args=(queue,))
        worker.start()
    worker.join(timeout=60)
    if held:
        assert worker.exitcode == 0 and queue.get(timeout=5) == "alive"
    else:
        assert worker.exitcode == -signal.SIGTERM
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == set()  # the test process unblocked
