"""The first failure of a job, told once.

Under plain torchrun every rank of a failed job ends with an error of its own: the rank that
failed, then each of the others in the collective it was waiting in ("Connection reset by
peer"), or on the SIGTERM torchrun sends them. Only the first is the cause. The rank that
fails first writes one record, `logs/failure.rank<r>.json` (its step and its one line),
before it ends; a rank that fails after it finds that record, says at most "stopping: rank
R failed" (rank 0) and keeps its traceback in its own log, and summary.json names the first
failing rank, its step and its line.

A peer killed outright (SIGKILL, the kernel's OOM killer) leaves no record. The ranks learn
of it one after another, each when the rank it waits on in a collective has ended, and each
used to wait the whole PEER_RECORD_WAIT_S for a record that never came: 2 s a hop, 22 s
from one SIGKILLed rank of 16 to the last rank's end (measured on 4 nodes x 4). The first
rank whose wait ends empty leaves `logs/peer_lost.rank<r>.json`; a rank that finds one waits
no more.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path

from launcher.paths import atomic_write

log = logging.getLogger("launcher")

# A record with this attribute goes to the rank's log file, not to the terminal
# (launcher.runtime.process's console filter): tracebacks a user does not need on screen.
FILE_ONLY = {"file_only": True}

# How long a rank whose collective broke waits for the peer that broke it to leave its
# record: the peer writes it before its sockets close, so this is a bound, not a delay.
PEER_RECORD_WAIT_S = 2.0

# What a collective says when the rank at the other end is gone (gloo, NCCL, the store).
PEER_LOSS_MARKERS = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "remote process exited",
    "Socket Timeout",
    "Connection refused",
)


class _Job:
    """The running job's run directory and rank (None between jobs)."""

    run_dir: Path | None = None
    rank: int = 0
    # a record older than this process is an earlier launch's (every rank of this launch
    # imported this module before any of them could fail)
    started: float = time.time()


def watch(run_dir: Path, rank: int) -> None:
    """From now on failures are recorded in `run_dir`'s logs/ (the job holds its lock)."""
    _Job.run_dir, _Job.rank = run_dir, rank


def forget() -> None:
    _Job.run_dir = None


def _path(run_dir: Path, rank: int, kind: str = "failure") -> Path:
    return run_dir / "logs" / f"{kind}.rank{rank}.json"


def record(step: int | None, line: str, kind: str = "failure") -> None:
    """This rank failed first (as far as it knows): leave its step and line for the others.
    Written before the process ends, so before any peer sees its sockets close. With
    `kind="peer_lost"`: this rank lost a peer that left no record in the time allowed."""
    if _Job.run_dir is None:
        return
    entry = {"rank": _Job.rank, "step": step, "line": line, "time": time.time()}
    with contextlib.suppress(OSError):  # a full disk: the others then say less, no more
        atomic_write(_path(_Job.run_dir, _Job.rank, kind), json.dumps(entry))


def records(run_dir: Path, kind: str = "failure") -> list[dict]:
    """Every rank's record of `kind` (failure, peer_lost), earliest first."""
    found = []
    for path in (run_dir / "logs").glob(f"{kind}.rank*.json"):
        with contextlib.suppress(OSError, ValueError):
            found.append(json.loads(path.read_text()))
    return sorted(found, key=lambda r: r.get("time", 0.0))


def _others(kind: str) -> list[dict]:
    """The running job's records of `kind` by other ranks, earliest first."""
    return [
        r
        for r in records(_Job.run_dir, kind)
        if r.get("rank") != _Job.rank and r.get("time", 0.0) >= _Job.started
    ]


def peer_failure(wait_s: float = 0.0) -> dict | None:
    """The first failure record of another rank of the running job, waiting up to `wait_s`
    for one to appear, unless another rank has already waited for it in vain."""
    if _Job.run_dir is None:
        return None
    deadline = time.monotonic() + wait_s
    while True:
        others = _others("failure")
        if others or time.monotonic() >= deadline or _others("peer_lost"):
            return others[0] if others else None
        time.sleep(0.05)


def says_any(exc: BaseException, markers: tuple[str, ...]) -> bool:
    """Whether `exc`, or an exception it was raised from or while handling, says one of
    `markers`."""
    seen: BaseException | None = exc
    while seen is not None:
        if any(marker in str(seen) for marker in markers):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def is_peer_loss(exc: BaseException) -> bool:
    """Whether `exc` is a collective that broke because the rank at the other end is gone."""
    return says_any(exc, PEER_LOSS_MARKERS)


def one_line(exc: BaseException, limit: int = 300) -> str:
    """`Type: message` on one line: the message's first line, and its last when it has
    more (a DataLoader worker's error is "Caught X in DataLoader worker process 0", its
    traceback, then the worker's own error: the cause is the last line)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    text = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return f"{type(exc).__name__}: {text}"[:limit]


def failed_status(first: dict) -> dict:
    """summary.json's fields that name the first failing rank."""
    step = first.get("step")
    at = f" at step {step}" if step is not None else ""
    return {
        "status": f"failed: rank {first['rank']}{at}: {first['line']}",
        "failed_rank": first["rank"],
        "failed_step": step,
    }


def settle(exc: BaseException, step: int | None, is_main: bool) -> dict:
    """Say why this rank's job ended, once for the whole job, and return summary.json's
    failure fields: a rank another rank's failure explains says one line (rank 0) or
    nothing; the first failing rank says its own line and leaves its record. The traceback
    goes to the rank's log file either way."""
    log.info("traceback of the failure", exc_info=exc, extra=FILE_ONLY)
    peer = peer_failure(PEER_RECORD_WAIT_S if is_peer_loss(exc) else 0.0)
    if peer is not None:
        why = "left the job on purpose" if "on purpose" in str(peer.get("line")) else "failed"
        (log.warning if is_main else log.info)("stopping: rank %d %s", peer["rank"], why)
        return failed_status(peer)
    if is_peer_loss(exc):  # a peer killed before it could say why (SIGKILL, the OOM killer)
        line = f"lost a peer rank ({one_line(exc)}); the rank logs under logs/ say which"
        record(step, line, kind="peer_lost")  # the ranks that learn of it later wait no more
        (log.error if is_main else log.info)("error: %s", line)
        return {"status": f"failed: {line}", "failed_rank": None, "failed_step": step}
    line = one_line(exc)
    record(step, line)
    where = f" at step {step}" if step is not None else ""
    rank_log = _Job.run_dir / "logs" / f"rank{_Job.rank}.log" if _Job.run_dir else "its log"
    log.error("error: rank %d failed%s: %s (traceback in %s)", _Job.rank, where, line, rank_log)
    return failed_status({"rank": _Job.rank, "step": step, "line": line})
