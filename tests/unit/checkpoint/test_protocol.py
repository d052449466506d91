"""The checkpoint protocol on a real one-rank gloo group and fabricated ranks: complete or
absent, a failed rank keeps the previous checkpoint, retention by lineage, supersession,
asynchronous saves sealed only when their files are written."""

from __future__ import annotations

import datetime
import json
import os
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch

from launcher.checkpoint import protocol as checkpoint
from launcher.checkpoint.protocol import (
    LATEST,
    META,
    SUPERSEDED,
    CheckpointWriter,
    find_resumable,
    is_complete,
    read_meta,
    scan,
    step_name,
)


class RankFailed(RuntimeError):
    """The fabricated failure of one rank's write."""


def save_on_two_ranks(folder: Path, step: int, *, fail_rank=None, meta=None, keep=5, probe=None):
    """Save `step` with two writers (rank 0 main, rank 1 not) on two threads that share a
    barrier and an all-gather, as two processes would. Each rank writes
    `model_rank<r>.pt`. A failing rank raises in its write; the writers compare notes in
    the gather, so both give up together. Returns each rank's exception or None."""
    barrier = threading.Barrier(2, timeout=20)
    errors: list[BaseException | None] = [None, None]
    meta = {"lineage": "L1"} if meta is None else meta
    shared: list = [None, None]

    def gather_of(r: int):
        def gather(obj) -> list:
            shared[r] = obj
            barrier.wait()
            out = list(shared)
            barrier.wait()  # both have read before either writes the next one
            return out

        return gather

    def rank(r: int) -> None:
        writer = CheckpointWriter(
            folder, is_main=r == 0, barrier=barrier.wait, keep=keep, meta=dict(meta),
            gather=gather_of(r),
        )  # fmt: skip

        def write(tmp: Path) -> None:
            if probe is not None:
                probe(r, tmp)
            if r == fail_rank:
                raise RankFailed(f"rank {r} could not write")
            torch.save({"rank": r, "step": step}, tmp / f"model_rank{r}.pt")

        try:
            writer.save(step, write, {"world_size": 2})
        except checkpoint.CheckpointNotWritten as exc:
            errors[r] = exc  # every rank raises it, after the last collective
        except BaseException as exc:
            errors[r] = exc
            barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    return errors


def test_two_rank_save_is_complete_with_meta_and_pointer(tmp_path):
    """Both ranks' files land in step_<n>/ with a meta.json listing them at their sizes,
    the step, the lineage and the extra meta; `latest` names it; nothing temporary stays."""
    assert save_on_two_ranks(tmp_path, 10) == [None, None]
    final = tmp_path / step_name(10)
    meta = read_meta(final)
    assert meta["step"] == 10 and meta["lineage"] == "L1" and meta["world_size"] == 2
    assert meta["files"] == {
        name: (final / name).stat().st_size for name in ("model_rank0.pt", "model_rank1.pt")
    }
    assert is_complete(final)
    assert (tmp_path / LATEST).read_text() == step_name(10) + "\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [LATEST, step_name(10)]
    assert find_resumable(tmp_path) == final
    found = scan(tmp_path)
    assert found.complete == [final] and not found.leftovers and found.pointer_problem is None
    assert torch.load(final / "model_rank1.pt")["rank"] == 1


def test_checkpoint_appears_only_complete(tmp_path):
    """While the ranks write, the step's folder does not exist under its name and resume
    still finds the previous checkpoint; `latest` still names that one."""
    save_on_two_ranks(tmp_path, 10)
    seen = []

    def probe(rank: int, tmp: Path) -> None:
        seen.append(
            (
                rank,
                tmp.name,
                (tmp_path / step_name(20)).exists(),
                find_resumable(tmp_path),
                (tmp_path / LATEST).read_text(),
            )
        )

    assert save_on_two_ranks(tmp_path, 20, probe=probe) == [None, None]
    for _, tmp_name, final_exists, resumable, latest in seen:
        assert tmp_name == f".tmp-{step_name(20)}"
        assert not final_exists
        assert resumable == tmp_path / step_name(10)
        assert latest == step_name(10) + "\n"
    assert sorted(r for r, *_ in seen) == [0, 1]
    assert find_resumable(tmp_path) == tmp_path / step_name(20)


@pytest.mark.parametrize("fail_rank", [0, 1])
def test_failed_write_on_one_rank_leaves_previous_checkpoint(tmp_path, fail_rank):
    """A rank whose write raises leaves no checkpoint resume would pick: both ranks give
    up together with the same line naming the rank, the previous one stays complete,
    `latest` names it, and the half-written folder is removed."""
    save_on_two_ranks(tmp_path, 10)
    errors = save_on_two_ranks(tmp_path, 20, fail_rank=fail_rank)
    assert all(isinstance(e, checkpoint.CheckpointNotWritten) for e in errors), errors
    assert str(errors[0]) == str(errors[1])
    assert f"rank {fail_rank}: RankFailed: rank {fail_rank} could not write" in str(errors[0])
    assert not (tmp_path / step_name(20)).exists()
    assert find_resumable(tmp_path) == tmp_path / step_name(10)
    assert is_complete(tmp_path / step_name(10))
    assert (tmp_path / LATEST).read_text() == step_name(10) + "\n"
    found = scan(tmp_path)
    assert found.leftovers == []
    assert found.incomplete == [] and found.pointer_problem is None


def test_pruning_keeps_newest_of_this_lineage_only(tmp_path):
    """With keep=2 only this lineage's two newest complete checkpoints remain; another
    lineage's checkpoints are never deleted, older or newer."""
    save_on_two_ranks(tmp_path, 5, meta={"lineage": "other"})
    save_on_two_ranks(tmp_path, 25, meta={"lineage": "other"})
    for step in (10, 20, 30, 40):
        assert save_on_two_ranks(tmp_path, step, keep=2) == [None, None]
    assert [p.name for p in scan(tmp_path).complete] == [step_name(s) for s in (40, 30, 25, 5)]
    assert read_meta(tmp_path / step_name(25))["lineage"] == "other"


def test_pruning_never_deletes_ahead_of_the_run(tmp_path):
    """A rewound run writing step 20 with keep=1 keeps its own step 30 (newer than what it
    just wrote) and deletes only its step 10."""
    for step in (10, 30):
        save_on_two_ranks(tmp_path, step, keep=5)
    save_on_two_ranks(tmp_path, 20, keep=1)
    assert [p.name for p in scan(tmp_path).complete] == [step_name(30), step_name(20)]


def test_adopted_lineage_is_pruned_and_meta_carried(tmp_path):
    """A resumed run takes over the lineage of the checkpoint it resumed from: its new
    checkpoints carry it, and that lineage's older checkpoints are pruned."""
    save_on_two_ranks(tmp_path, 10, meta={"lineage": "first"})
    calls = []
    writer = CheckpointWriter(
        tmp_path, is_main=True, barrier=lambda: calls.append(1), keep=1, meta={}
    )
    writer.adopt(tmp_path / step_name(10))
    writer.save(20, lambda tmp: (tmp / "m.pt").write_bytes(b"x"), {})
    assert read_meta(tmp_path / step_name(20))["lineage"] == "first"
    assert [p.name for p in scan(tmp_path).complete] == [step_name(20)]


def test_complete_checkpoint_at_same_step_is_superseded_not_replaced(tmp_path):
    """Writing a step that already has a complete checkpoint moves the old one under
    superseded/ (contents intact) and puts the new one in its place; an incomplete
    folder at that step is simply replaced."""
    save_on_two_ranks(tmp_path, 10, meta={"lineage": "old"})
    save_on_two_ranks(tmp_path, 10, meta={"lineage": "new"})
    assert read_meta(tmp_path / step_name(10))["lineage"] == "new"
    (aside,) = (tmp_path / SUPERSEDED).iterdir()
    assert aside.name.startswith(step_name(10) + "-")
    assert is_complete(aside) and read_meta(aside)["lineage"] == "old"

    broken = tmp_path / step_name(30)
    broken.mkdir()
    (broken / "model_rank0.pt").write_bytes(b"partial")
    save_on_two_ranks(tmp_path, 30)
    assert is_complete(broken)
    assert len(list((tmp_path / SUPERSEDED).iterdir())) == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


class FrozenClock:
    """checkpoint.dt with a clock that does not move: saves within the same second."""

    class datetime(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(2026, 1, 1, 12, 0, 0)


def test_same_step_superseded_twice_in_one_second_keeps_both(tmp_path, monkeypatch):
    """Each complete checkpoint a save supersedes is kept under superseded/, even when the
    same step is superseded twice within one second (the name carries only seconds), and
    the new checkpoint is sealed in place."""
    monkeypatch.setattr(checkpoint, "dt", FrozenClock)
    for lineage in ("first", "second", "third"):
        assert save_on_two_ranks(tmp_path, 10, meta={"lineage": lineage}) == [None, None]
    assert read_meta(tmp_path / step_name(10))["lineage"] == "third"
    aside = sorted(read_meta(p)["lineage"] for p in (tmp_path / SUPERSEDED).iterdir())
    assert aside == ["first", "second"]


def test_barrier_protocol_and_async_save(tmp_path):
    """A synchronous save calls the barrier three times (folder ready, files written,
    sealed; the last two carry each rank's problem, here as a plain barrier). An
    asynchronous save (write returns a Future) calls it twice (folder ready, writes
    started) and counts only once `complete()` has waited for it: until then no
    step_<n> exists; the next save completes it first (two more)."""
    calls = []
    writer = CheckpointWriter(tmp_path, is_main=True, barrier=lambda: calls.append(1), keep=5)
    writer.save(10, lambda tmp: (tmp / "a.pt").write_bytes(b"1"), {})
    assert len(calls) == 3 and is_complete(tmp_path / step_name(10))

    calls.clear()
    future: Future = Future()

    def write_later(tmp: Path) -> Future:
        (tmp / "a.pt").write_bytes(b"2")
        return future

    final = writer.save(20, write_later, {})
    assert final == tmp_path / step_name(20)
    assert len(calls) == 2 and not final.exists()
    assert find_resumable(tmp_path) == tmp_path / step_name(10)
    future.set_result(None)
    writer.save(30, lambda tmp: (tmp / "a.pt").write_bytes(b"3"), {})
    assert len(calls) == 2 + 2 + 3
    assert [p.name for p in scan(tmp_path).complete] == [step_name(s) for s in (30, 20, 10)]
    assert json.loads((final / META).read_text())["step"] == 20
    writer.complete()  # nothing in progress: no barrier
    assert len(calls) == 7


def test_async_save_whose_files_fail_is_not_sealed(tmp_path):
    """An asynchronous write that fails raises from complete() and leaves no checkpoint,
    nor its temporary folder."""
    writer = CheckpointWriter(tmp_path, is_main=True, barrier=lambda: None, keep=5)
    future: Future = Future()
    writer.save(10, lambda tmp: future, {})
    future.set_exception(RankFailed("the device went away"))
    with pytest.raises(checkpoint.CheckpointNotWritten, match="rank 0: RankFailed: the device"):
        writer.complete()
    assert find_resumable(tmp_path) is None
    assert scan(tmp_path).leftovers == []
    assert checkpoint.candidates(tmp_path) == []


def wait_for(predicate, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_async_save_seals_itself_when_every_rank_has_written(tmp_path):
    """A run's durable writer (rank given) seals an asynchronous save as soon as every
    rank's files are written, not at the next save: a job that ends (a hang, a crash)
    before that save keeps it. Rank 1's marker is what rank 1's writer leaves."""
    writer = CheckpointWriter(
        tmp_path, is_main=True, barrier=lambda: None, keep=5, meta={"lineage": "L"},
        rank=0, world_size=2,
    )  # fmt: skip
    future: Future = Future()

    def write_later(tmp: Path) -> Future:
        (tmp / "a.pt").write_bytes(b"2")
        return future

    final = writer.save(20, write_later, {"tokens": 40})
    tmp = tmp_path / f".tmp-{final.name}"
    future.set_result(None)  # rank 0's files written: its marker, not yet rank 1's
    assert (tmp / ".written_rank0").exists() and not wait_for(final.exists, 0.5)
    (tmp / ".written_rank1").touch()
    assert wait_for(final.exists)  # sealed by itself, no complete() called
    meta = read_meta(final)
    assert meta["files"] == {"a.pt": 1} and meta["tokens"] == 40 and meta["lineage"] == "L"
    writer.complete()  # the seal already done (its pointer too, now): no error
    assert (tmp_path / LATEST).read_text().strip() == final.name
    assert [p.name for p in scan(tmp_path).complete] == [final.name]


def unsealed_save(folder: Path, step: int, ranks_written=(0, 1)) -> Path:
    """What a save whose job ended before its seal leaves: intent, files, markers."""
    tmp = folder / f".tmp-{step_name(step)}"
    tmp.mkdir(parents=True)
    intent = {"step": step, "world_size": 2, "lineage": "L", "tokens": step * 8}
    (tmp / ".intent.json").write_text(json.dumps(intent))
    for r in (0, 1):
        torch.save({"rank": r}, tmp / f"model_rank{r}.pt")
    for r in ranks_written:
        (tmp / f".written_rank{r}").touch()
    return tmp


def test_a_relaunch_seals_a_save_every_rank_had_written(tmp_path, caplog):
    save_on_two_ranks(tmp_path, 10)
    tmp = unsealed_save(tmp_path, 20)
    before = {p.name: p.read_bytes() for p in tmp.iterdir() if p.suffix == ".pt"}
    with caplog.at_level("WARNING"):
        assert checkpoint.recover_leftovers(scan(tmp_path))
    final = tmp_path / step_name(20)
    assert is_complete(final) and not tmp.exists()
    assert {p.name: p.read_bytes() for p in final.glob("*.pt")} == before
    assert read_meta(final)["tokens"] == 160 and set(read_meta(final)["files"]) == set(before)
    assert (tmp_path / LATEST).read_text().strip() == final.name
    assert "sealed" in caplog.text and "every rank had written" in caplog.text


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda tmp: (tmp / ".written_rank1").unlink(), "rank(s) [1] had not finished"),
        (lambda tmp: (tmp / ".intent.json").unlink(), "no readable .intent.json"),
    ],
    ids=["a rank not done", "no intent"],
)
def test_a_save_that_cannot_be_verified_is_moved_aside_never_deleted(tmp_path, caplog, damage, why):
    save_on_two_ranks(tmp_path, 10)
    tmp = unsealed_save(tmp_path, 20)
    damage(tmp)
    before = {p.name: p.read_bytes() for p in tmp.iterdir()}
    assert not checkpoint.recover_leftovers(scan(tmp_path))
    (aside,) = (tmp_path / checkpoint.UNSEALED).iterdir()
    assert {p.name: p.read_bytes() for p in aside.iterdir()} == before
    assert why in caplog.text and str(aside) in caplog.text
    assert find_resumable(tmp_path) == tmp_path / step_name(10)  # the resume goes on as before
    assert scan(tmp_path).strays == []  # unsealed/ is the launcher's own


def test_dcp_completeness_check(tmp_path):
    """FSDP2's format reader checks a DCP folder against its .metadata: every shard file
    there and long enough for the byte ranges mapped into it."""
    import torch.distributed.checkpoint as dcp

    from launcher.strategy.fsdp2.dcp import incomplete

    dcp.save({"w": torch.arange(64.0)}, checkpoint_id=tmp_path, no_dist=True)
    assert incomplete(tmp_path) is None
    (shard,) = tmp_path.glob("*.distcp")
    shard.write_bytes(shard.read_bytes()[:10])
    assert "has 10 of" in incomplete(tmp_path)
    shard.unlink()
    assert "is missing" in incomplete(tmp_path)
    (tmp_path / ".metadata").write_bytes(b"garbage")
    assert "unreadable" in incomplete(tmp_path)


@pytest.mark.parametrize("where", ["a file", "/proc", "read-only"])
def test_a_folder_that_cannot_be_made_is_one_agreed_error(tmp_path, where):
    """The memory tier's folder under a file, in /proc, or on a read-only mount: the save
    raises CheckpointNotWritten on every rank (the tier turns itself off with one
    warning), not an OSError from rank 0 alone."""
    if where == "a file":
        (tmp_path / "file").write_text("x")
        folder = tmp_path / "file" / "rank0"
    elif where == "/proc":
        folder = Path("/proc/launcher-test/rank0")
    else:
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o555)
        if os.geteuid() == 0:  # root writes whatever the mode: a read-only /proc file instead
            folder = Path("/proc/self/launcher-test")
    writer = CheckpointWriter(folder, is_main=True, barrier=lambda: None, keep=1)
    with pytest.raises(checkpoint.CheckpointNotWritten, match="could not be written"):
        writer.save(5, lambda tmp: (tmp / "a.pt").write_bytes(b"1"), {})
