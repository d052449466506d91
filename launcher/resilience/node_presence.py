"""A node lost and not replaced ends the job within a minute, naming its ranks (exit 8).

When a node is lost whole (powered off, its processes killed), the ranks of the other nodes
fail in their next collective ("Connection closed by peer") and their torchrun agents meet
again in the rendezvous to restart, where they wait for as many nodes as before: a
replacement (a new pod, a spare) takes the lost node's place and the job resumes; without
one, torchrun's rendezvous waits its join timeout (600 s by default) and then fails with 1.

Each node's `python -m launcher.torchrun` therefore keeps a heartbeat in the run directory,
`logs/nodes/<host>-<pid>.json` (the name of the attempt its ranks run, which every node of
that attempt shares, its ranks of it, a counter it raises every BEAT_S seconds), and watches
the others' from the same thread. While this node's ranks of an attempt run and a node of
that attempt falls silent, they are ended at once (they cannot go on without it); a
restart's new ranks, which run for a while before they say which attempt they are, are not
judged by the attempt before theirs. Once this node's ranks have all ended and
no new attempt has started for `LAUNCHER_LOST_NODE_S` seconds (10 by default) while a node of
the attempt is gone (its heartbeat stopped, its front door ended, or it never beat: ranks
of the attempt that no heartbeat names), the node is lost and
nothing replaced it: the front door says so in one line naming that node's ranks and ends
with exit code 8 (node lost), which a scheduler requeues; the run resumes from its last
checkpoint of either tier. The wait counts from the ranks' end, not from the node's
departure: a replacement shows only once its own ranks start (its agent started, the
rendezvous met, its process group formed), seconds after its scheduler started it.

The wait is for a replacement on its way, and how long one takes is the scheduler's: a spare
agent already running or a replacement started as the node is lost joins within seconds (4-5
s at 16 ranks on one machine, measured), the default's case; a Kubernetes pod that must be
scheduled takes longer, and the pod renderer sets the wait to the rendezvous timeout; inside
a Slurm allocation nothing can take a node's place, and the sbatch script sets it to 5 s
(the requeue brings a full set of nodes). Every second waited in vain is a second of every
node's time lost. The wait is never 0 in practice: when every node ends together (a
preemption reaches every node), the front door that ends first is a gone node to one whose
ranks have ended and whose agent is still ending; an agent's end, a second or two, must fit
in the wait. (A node's ranks' own codes cannot tell such an end from a restart: torchrun
closes the ranks of a restart with the same SIGTERM a preemption sends.)
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from launcher.paths import atomic_write
from launcher.resilience import exit_codes
from launcher.runtime import process_tree
from launcher.runtime.placement import node_name, ranks_text
from launcher.runtime.process_tree import kill_tree

log = logging.getLogger("launcher.torchrun")

FOLDER = "nodes"  # in the run directory's logs/
BEAT_S = 1.0
SILENT_AFTER_S = 4 * BEAT_S  # a heartbeat that has not moved for this long has stopped
WAIT_ENV = "LAUNCHER_LOST_NODE_S"
DEFAULT_WAIT_S = 10.0
UNHEARD = "(no heartbeat)"  # the gone node of the ranks no heartbeat names (`never_heard`)


def wait_s(environ=os.environ) -> float:
    """How long ended ranks wait for a lost node's replacement (`LAUNCHER_LOST_NODE_S`)."""
    try:
        return max(0.0, float(environ.get(WAIT_ENV, DEFAULT_WAIT_S)))
    except ValueError:
        return DEFAULT_WAIT_S


@dataclass
class Heartbeats:
    """The other nodes' heartbeats as this node has seen them: each file's counter and when
    (this node's clock) it last moved, so that no two hosts' clocks are compared; a file
    counts as moved when first read. Which attempt a record is of, its name says (every
    rank of one process group has the same, runtime.process.attempt_name): a node stopped
    before this attempt began is none of its nodes, however recently it beat."""

    me: str
    seen: dict[str, tuple[int, float]] = field(default_factory=dict)
    last: dict[str, dict] = field(default_factory=dict)  # each node's last record read

    def look(self, folder: Path, now: float) -> dict[str, dict]:
        """Read every other node's heartbeat; {node: its record}."""
        records = {}
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            node = path.stem
            if node == self.me:
                continue
            try:
                record = json.loads(path.read_text())
                beat = int(record["beat"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if self.seen.get(node, (None,))[0] != beat:
                self.seen[node] = (beat, now)
            records[node] = self.last[node] = record
        return records

    def gone(self, records: dict[str, dict], now: float, attempt: str | None,
             ended_too: bool = False) -> dict[str, dict]:  # fmt: skip
        """The nodes of `attempt` that are no more: their counter has not moved for
        SILENT_AFTER_S, or, with `ended_too`, their front door ended (it says so in its last
        record: it left the job and will not return)."""
        out = {}
        for n, record in records.items():
            if attempt is None or record.get("attempt") != attempt:
                continue
            if record.get("ended") is not None:
                if ended_too:
                    out[n] = record
            elif now - self.seen[n][1] > SILENT_AFTER_S:
                out[n] = record
        return out


def never_heard(records: dict[str, dict], attempt: str | None, mine: list[int],
                world: int | None) -> dict[str, dict]:  # fmt: skip
    """The ranks of `attempt` that neither this node (`mine`) nor any heartbeat of the
    attempt names, as one gone node's record: a node lost before its first beat (within a
    second of its ranks' start) leaves no file to fall silent, and without this the others
    waited for it in the rendezvous until its timeout (seen in a launch). {} when every rank
    is heard of, or the world size is not known."""
    if attempt is None or not world:
        return {}
    heard = set(mine)
    for record in records.values():
        if record.get("attempt") == attempt:
            heard.update(record.get("ranks", []))
    missing = sorted(set(range(world)) - heard)
    if not missing:
        return {}
    return {UNHEARD: {"host": "never heard from", "ranks": missing}}


def forget_old(folder: Path) -> None:
    """Remove the heartbeats that stopped long ago (a node replaced at an earlier attempt, an
    earlier launch's): as the run directory's lock judges a holder, by the file's age."""
    for path in folder.glob("*.json") if folder.is_dir() else []:
        with contextlib.suppress(OSError):
            if time.time() - path.stat().st_mtime > 2 * SILENT_AFTER_S:
                path.unlink()


def lost_line(silent: dict[str, dict], waited: float | None = None) -> str:
    """The one line: which node's ranks left and how, and what the job does (`waited`: how
    long this node waited for a replacement; None: torchrun ended without waiting)."""
    named = "; ".join(
        f"node {r.get('host', n)} (ranks {ranks_text(r.get('ranks', []))}, " + how_it_left(n, r)
        for n, r in silent.items()
    )  # fmt: skip
    why = (
        f"no node took its place within {waited:.0f} s ({WAIT_ENV})"
        if waited is not None
        else "torchrun ended without waiting for a replacement (no restart left, or the "
        "rendezvous gone with the node that held it)"
    )
    return (
        f"launcher.torchrun: lost {named}: {why}; exit code "
        f"{exit_codes.NODE_LOST} (node lost): a requeue or restart on a full set of nodes "
        "resumes from the last checkpoint"
    )


def how_it_left(node: str, record: dict) -> str:
    if node == UNHEARD:
        return f"no heartbeat from it in {SILENT_AFTER_S:.0f} s of its attempt)"
    if record.get("ended") is None:
        return "its heartbeat stopped)"
    return f"its launcher.torchrun ended with {record['ended']})"


class NodePresence(threading.Thread):
    """This node's heartbeat in the run directory, and the watch on the others' (see the
    module's docstring); `lost` holds the line once this node decided the job ends."""

    def __init__(self, outcome: Path, wait: float, end: Callable[[], None] | None = None,
                 workers: Callable[[], list[int]] | None = None,
                 kill: Callable[[int], None] | None = None):  # fmt: skip
        super().__init__(name="launcher-node-presence", daemon=True)
        self.outcome = outcome
        self.wait = wait
        self.me = f"{node_name()}-{os.getpid()}"
        self.beats = Heartbeats(self.me)
        self.beat = 0
        self.folder: Path | None = None
        self.ranks: list[int] = []
        self.run_dir: Path | None = None
        self.attempt: str | None = None  # the name of the attempt this node's ranks run
        self.attempt_since = 0.0  # when this node first saw that attempt's ranks start
        self.world: int | None = None  # the attempt's world size, as its ranks say
        self.ended_since: float | None = None  # since when this node has had no worker
        self.stopping = False  # this attempt's workers were ended for a gone node
        self.lost: str | None = None
        self.stopped = threading.Event()
        # how the job is ended: a SIGTERM to this process, which torchrun's agent turns into
        # its shutdown wherever it waits
        self.end = end or (lambda: os.kill(os.getpid(), signal.SIGTERM))
        # this agent's live workers: none while it waits in a rendezvous
        self.workers = workers or (lambda: process_tree.workers(os.getpid()))
        self.kill = kill or kill_tree

    def stop_workers(self, workers: list[int], gone: dict[str, dict]) -> None:
        """A node of this attempt is gone while this node's ranks run: they cannot go on
        without it (their next collective would wait for it until the hang watchdog or the
        collective's timeout), so they end now and torchrun's agent goes back into the
        rendezvous, for a replacement or for the end of the job. A stop that a gone node's
        front door chose (it ended: a preemption's 143) is the stop protocol's, not this."""
        silent = {n: r for n, r in gone.items() if r.get("ended") is None}
        if not silent:
            return
        self.stopping = True
        named = "; ".join(f"node {r.get('host', n)} (ranks {ranks_text(r.get('ranks', []))})"
                          for n, r in silent.items())  # fmt: skip
        print(f"launcher.torchrun: {named}: its heartbeat stopped; ending this node's ranks "
              f"now, which cannot go on without it (torchrun restarts them for the node that "
              f"takes its place)", file=sys.stderr, flush=True)  # fmt: skip
        for pid in workers:
            self.kill(pid)

    def run(self) -> None:
        while not self.stopped.wait(BEAT_S):
            with contextlib.suppress(OSError):  # a full or gone run directory: no heartbeat
                self.tick(time.monotonic())
            if self.lost:
                return

    def tick(self, now: float) -> None:
        number, starts = exit_codes.read_starts(self.outcome)
        if number is None:
            return
        first = next(iter(starts.values()))
        if first.get("attempt") != self.attempt or self.folder is None:  # a new attempt runs
            self.attempt, self.stopping, self.ended_since = first.get("attempt"), False, None
            self.attempt_since, self.world = now, first.get("world")
            self.run_dir = Path(first["run_dir"])
            self.folder = self.run_dir / "logs" / FOLDER
            forget_old(self.folder)
        self.ranks = sorted(starts)  # the attempt's ranks as they say they started
        self.beat += 1
        self.folder.mkdir(parents=True, exist_ok=True)
        atomic_write(self.folder / f"{self.me}.json", json.dumps(self.record()))
        records = self.beats.look(self.folder, now)
        silent = self.beats.gone(records, now, self.attempt, ended_too=True)
        workers = self.workers()
        # Only the ranks that said they are this attempt's are judged by its nodes: a
        # restart's new ranks run before they say so (until their process group forms), and
        # the rendezvous that started them has already left the silent node out.
        said = {start.get("pid") for start in starts.values()}
        ours = [pid for pid in workers if pid in said]
        if ours and silent and not self.stopping:
            self.stop_workers(ours, silent)
        if workers:
            self.ended_since = None
            return
        if not silent and now - self.attempt_since > SILENT_AFTER_S:
            # judged only once this node's ranks have ended, never a reason to end them
            silent = never_heard(records, self.attempt, self.ranks, self.world)
        # The wait counts from this node's ranks' end, not from the node's departure (a
        # replacement shows only once its ranks start: its agent started, the rendezvous
        # met, its process group formed, seconds after its scheduler started it), nor from
        # the moment the node's silence is long enough to tell: that is part of the wait.
        self.ended_since = self.ended_since or now
        if silent and now - self.ended_since >= self.wait:
            self.lost = lost_line(silent, now - self.ended_since)
            self.end()

    def silent_at_end(self) -> dict[str, dict]:
        """At the end of a job that failed: the nodes whose heartbeat has stopped, waiting
        until one that stopped with the failure has been silent long enough to tell (a
        node's loss ends the others' ranks within seconds, torchrun's agent at once when it
        has no restart left)."""
        deadline = time.monotonic() + SILENT_AFTER_S + BEAT_S
        while self.folder is not None and not self.lost:
            now = time.monotonic()
            records = self.beats.look(self.folder, now)
            silent = self.beats.gone(records, now, self.attempt)
            if silent or not records or now > deadline:
                return silent
            time.sleep(BEAT_S / 4)
        return {}

    def close(self, code: int) -> None:
        """Stop the heartbeat; its last record says this node's front door ended with
        `code` (it left the job: the others need not wait for it to beat again)."""
        self.stopped.set()
        if self.is_alive():
            self.join()
        if self.folder is not None:
            self.beat += 1
            with contextlib.suppress(OSError):
                atomic_write(self.folder / f"{self.me}.json", json.dumps(self.record(code)))

    def record(self, ended: int | None = None) -> dict:
        """This node's heartbeat: its ranks of the attempt it runs, and the count; `ended`:
        the code its front door ended with (its last record)."""
        record = {"host": node_name(), "pid": os.getpid(), "attempt": self.attempt,
                  "ranks": self.ranks, "beat": self.beat}  # fmt: skip
        return record if ended is None else {**record, "ended": ended}


def record_in_summary(run_dir: Path | None, ranks: list[int], line: str) -> None:
    """On the node that ran rank 0: summary.json's exit code and status say the job ended
    because a node was lost (rank 0's own account says its peer closed the connection)."""
    if run_dir is None or 0 not in ranks:
        return
    path = run_dir / "summary.json"
    with contextlib.suppress(OSError, ValueError):
        summary = json.loads(path.read_text())
        summary.update(exit_code=exit_codes.NODE_LOST, status=f"failed: {line.split(': ', 2)[1]}")
        atomic_write(path, json.dumps(summary, indent=1))
