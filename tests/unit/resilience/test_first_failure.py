"""The first failure of a job, told once (launcher.resilience.first_failure): the rank that
fails first leaves its record and says its line; a rank whose collective broke because of
it finds the record, says at most one line, and names it in summary.json."""

from __future__ import annotations

import logging
import time

import pytest

from launcher.resilience import first_failure

RESET = (
    "[../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:45191: Connection reset by "
    "peer. This is typically caused by a remote worker hanging or bugs in the application."
)


@pytest.fixture(autouse=True)
def this_launch(monkeypatch):
    """Every record these tests write is this launch's (whatever the process's start)."""
    monkeypatch.setattr(first_failure._Job, "started", 0.0)
    yield
    first_failure.forget()


def as_rank(run_dir, rank):
    first_failure.watch(run_dir, rank)


def test_first_rank_records_and_the_peer_names_it(tmp_path, caplog):
    (tmp_path / "logs").mkdir()
    caplog.set_level(logging.INFO, logger="launcher")
    as_rank(tmp_path, 1)
    mine = first_failure.settle(ValueError("bad shape"), 5, is_main=False)
    assert mine == {"status": "failed: rank 1 at step 5: ValueError: bad shape",
                    "failed_rank": 1, "failed_step": 5}  # fmt: skip
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert said == [f"error: rank 1 failed at step 5: ValueError: bad shape (traceback in "
                    f"{tmp_path}/logs/rank1.log)"]  # fmt: skip
    caplog.clear()
    as_rank(tmp_path, 0)  # rank 0's collective then breaks on the closed connection
    try:
        try:
            raise RuntimeError(RESET)
        except RuntimeError:  # as DDP's hook, then the stop vote's drain, raise it
            raise RuntimeError("the stop vote could not finish")  # noqa: B904
    except RuntimeError as exc:
        theirs = first_failure.settle(exc, 5, is_main=True)
    assert theirs == mine  # summary.json names the first failing rank, not the reset
    on_screen = [r for r in caplog.records if not getattr(r, "file_only", False)]
    assert [(r.levelno, r.getMessage()) for r in on_screen] == [
        (logging.WARNING, "stopping: rank 1 failed")
    ]
    assert any(r.exc_info for r in caplog.records if getattr(r, "file_only", False))
    first_failure.forget()


def test_a_peer_lost_without_a_record_is_not_this_ranks_fault(tmp_path):
    (tmp_path / "logs").mkdir()
    as_rank(tmp_path, 0)
    first_failure.PEER_RECORD_WAIT_S, wait = 0.1, first_failure.PEER_RECORD_WAIT_S
    try:
        status = first_failure.settle(RuntimeError(RESET), 3, is_main=True)
    finally:
        first_failure.PEER_RECORD_WAIT_S = wait
        first_failure.forget()
    assert status["failed_rank"] is None and status["status"].startswith("failed: lost a peer")
    assert not first_failure.records(tmp_path)  # it left no record: it is not the cause


def test_after_one_rank_waited_in_vain_the_others_do_not_wait(tmp_path, monkeypatch):
    """A SIGKILLed peer leaves no record: the first rank to lose it waits the whole bound
    and says so in logs/peer_lost.rank<r>.json; the ranks that lose it after (one hop
    later each) end at once, where each used to wait the bound again."""
    (tmp_path / "logs").mkdir()
    monkeypatch.setattr(first_failure, "PEER_RECORD_WAIT_S", 0.3)
    as_rank(tmp_path, 6)
    began = time.monotonic()
    first = first_failure.settle(RuntimeError(RESET), 9, is_main=False)
    assert time.monotonic() - began >= 0.3  # the first waited for a record
    assert [r["rank"] for r in first_failure.records(tmp_path, "peer_lost")] == [6]
    monkeypatch.setattr(first_failure, "PEER_RECORD_WAIT_S", 60.0)
    for rank in (7, 0):
        as_rank(tmp_path, rank)
        began = time.monotonic()
        later = first_failure.settle(RuntimeError(RESET), 9, is_main=rank == 0)
        assert time.monotonic() - began < 30.0  # not the 60 s bound
        assert later == first  # the same status: a lost peer, no rank to blame
    assert not first_failure.records(tmp_path)  # no failure record: none of them is the cause


def test_an_earlier_launchs_record_is_not_this_ones(tmp_path):
    (tmp_path / "logs").mkdir()
    as_rank(tmp_path, 1)
    first_failure.record(4, "exited with code 1 (fault.kind=exit)")
    as_rank(tmp_path, 0)
    assert first_failure.peer_failure()["rank"] == 1
    first_failure._Job.started = time.time() + 10  # a relaunch, after that record was written
    assert first_failure.peer_failure() is None


def test_a_wrapped_errors_line_keeps_its_cause():
    worker = RuntimeError(
        "Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback (most recent "
        'call last):\n  File "x.py", line 1\nRuntimeError: fault.kind=loader_error at step 5'
    )
    assert first_failure.one_line(worker) == (
        "RuntimeError: Caught RuntimeError in DataLoader worker process 0. ... "
        "RuntimeError: fault.kind=loader_error at step 5"
    )
