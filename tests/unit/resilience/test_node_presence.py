"""A lost node that is not replaced ends the job within a minute (launcher.resilience.
node_presence, docs/faults.md): each node's front door keeps a heartbeat in the run directory
and, once its agent has had no worker for LAUNCHER_LOST_NODE_S while a node of this attempt
is gone (its heartbeat stopped, or its front door ended), ends the job with exit 8 naming that
node's ranks; a replacement
(a new attempt) resets the wait, and a node that stopped before the attempt began is not of
it. Driven here by the files the ranks and the other node leave, on a clock of the test's;
the launch (agents as nodes, one SIGKILLed and not replaced) is benchmarks/goodput.py's
`lost` case."""

from __future__ import annotations

import json
import os

from launcher.resilience import exit_codes, node_presence
from launcher.resilience.node_presence import BEAT_S, SILENT_AFTER_S, NodePresence

WAIT = 30.0


def started(outcome, run_dir, attempt: int, ranks, first_pid: int = 101, world=None) -> None:
    """Ranks `ranks` of `attempt` (named a<attempt>, of `world` ranks: None, not said) say
    they run (as exit_codes.report_start writes), rank r as pid first_pid + r."""
    for r in ranks:
        record = {"run_dir": str(run_dir), "pid": first_pid + r, "attempt": f"a{attempt}",
                  "world": world}  # fmt: skip
        (outcome / f"attempt{attempt:04d}.rank{r:05d}{exit_codes.STARTED}").write_text(
            json.dumps(record)
        )


def other_node(run_dir, ranks, beat: int, ended: int | None = None, attempt: str = "a0") -> None:
    folder = run_dir / "logs" / node_presence.FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    record = {"host": "n2", "pid": 7, "attempt": attempt, "ranks": ranks, "beat": beat,
              "ended": ended}  # fmt: skip
    (folder / "n2-7.json").write_text(json.dumps(record))


def presence(tmp_path, workers: list[int], killed: list[int] | None = None):
    """The watch on a node whose agent's live workers are `workers` (the test empties it);
    the workers it ends go to `killed`."""
    outcome, run_dir = tmp_path / "outcome", tmp_path / "run"
    outcome.mkdir(parents=True)
    ends = []
    watch = NodePresence(outcome, WAIT, end=lambda: ends.append(True), workers=lambda: workers,
                         kill=(killed if killed is not None else []).append)  # fmt: skip
    return watch, outcome, run_dir, ends


def test_a_silent_node_after_this_nodes_ranks_ended_ends_the_job_naming_its_ranks(tmp_path):
    workers = [101, 102]
    watch, outcome, run_dir, ends = presence(tmp_path, workers)
    started(outcome, run_dir, 0, [0, 1])
    other_node(run_dir, [2, 3], beat=1)
    watch.tick(0.0)
    other_node(run_dir, [2, 3], beat=2)  # it beats in this attempt: one of its nodes
    watch.tick(BEAT_S)
    mine = json.loads((run_dir / "logs" / "nodes" / f"{watch.me}.json").read_text())
    assert (mine["attempt"], mine["ranks"], mine["beat"]) == ("a0", [0, 1], 2)
    workers.clear()  # the collective broke: this node's ranks are gone, the agent waits
    t = BEAT_S
    while not ends:
        t += BEAT_S
        watch.tick(t)
        assert t <= BEAT_S + SILENT_AFTER_S + WAIT + 2 * BEAT_S
    # The wait counts from the ranks' end (the first tick without them), the time it takes
    # to tell the node's silence included: not silence first, then the whole wait.
    assert t == 2 * BEAT_S + WAIT
    assert watch.lost.startswith(
        "launcher.torchrun: lost node n2 (ranks 2-3, its heartbeat stopped): no node took"
    )
    assert "within 30 s (LAUNCHER_LOST_NODE_S); exit code 8 (node lost)" in watch.lost


def test_a_beating_node_a_node_of_no_attempt_or_workers_running_end_nothing(tmp_path):
    watch, outcome, run_dir, ends = presence(tmp_path, [])
    started(outcome, run_dir, 0, [0, 1])
    for i in range(60):  # the other node beats on: a crash, not a loss; the restart comes
        other_node(run_dir, [2, 3], beat=i)
        watch.tick(i * BEAT_S)
    assert not ends
    watch, outcome, run_dir, ends = presence(tmp_path / "b", [])
    started(outcome, run_dir, 0, [0, 1])
    other_node(run_dir, [2, 3], beat=1, attempt="earlier")
    for i in range(60):  # a node of an earlier attempt, silent since: not of this one
        watch.tick(i * BEAT_S)
    assert not ends
    watch, outcome, run_dir, ends = presence(tmp_path / "c", [101])
    started(outcome, run_dir, 0, [0, 1])
    for i in range(60):  # silent, but this node's workers still run: not for it to say
        other_node(run_dir, [2, 3], beat=min(i, 2))
        watch.tick(i * BEAT_S)
    assert not ends


def test_a_replacement_that_starts_a_new_attempt_resets_the_wait(tmp_path):
    workers = [101]
    watch, outcome, run_dir, ends = presence(tmp_path, workers)
    started(outcome, run_dir, 0, [0, 1])
    other_node(run_dir, [2, 3], beat=1)
    watch.tick(0.0)
    other_node(run_dir, [2, 3], beat=2)
    watch.tick(BEAT_S)
    workers.clear()
    for i in range(2, 20):  # silent for most of the wait
        watch.tick(i * BEAT_S)
    started(outcome, run_dir, 1, [0, 1])  # the replacement came: the next attempt runs
    for i in range(20, 80):  # the lost node's file stays silent: not of this attempt
        watch.tick(i * BEAT_S)
    assert not ends and watch.attempt == "a1"


def test_a_node_whose_front_door_ended_while_this_one_waits_is_lost_after_the_wait(tmp_path):
    """One node stopped (its ranks 143, its front door ended: one node preempted) while the
    others restart and wait for it: nobody will bring it back, so after the wait the job
    ends with 8, the line saying how that node left. At a job's end, a node that ended is
    not a lost one (every front door of a crashed job ends)."""
    workers = [101]
    watch, outcome, run_dir, ends = presence(tmp_path, workers)
    started(outcome, run_dir, 0, [0, 1])
    other_node(run_dir, [2, 3], beat=1)
    watch.tick(0.0)
    other_node(run_dir, [2, 3], beat=2, ended=143)
    watch.tick(BEAT_S)
    assert watch.silent_at_end() == {}  # ended, not silent
    workers.clear()
    t = BEAT_S
    while not ends:
        t += BEAT_S
        watch.tick(t)
    assert t == BEAT_S + WAIT + BEAT_S  # the wait alone: its end was said at once
    assert "lost node n2 (ranks 2-3, its launcher.torchrun ended with 143)" in watch.lost


def test_the_line_without_a_wait_says_torchrun_did_not_wait():
    silent = {"n2-7": {"host": "n2", "ranks": [4, 5, 6, 7]}, "n3-9": {"host": "n3", "ranks": [9]}}
    line = node_presence.lost_line(silent)
    assert "lost node n2 (ranks 4-7, its heartbeat stopped); node n3 (ranks 9, its " in line
    assert "torchrun ended without waiting for a replacement (no restart left" in line


def test_this_nodes_ranks_end_as_soon_as_a_node_of_the_attempt_stops_beating(tmp_path):
    """Its ranks' next collective would wait for the gone node until the hang watchdog: they
    are ended once its heartbeat has stopped for SILENT_AFTER_S (once an attempt), so the
    restart begins then; a node that ended on its own (a stop's 143) ends nothing."""
    killed: list[int] = []
    watch, outcome, run_dir, _ = presence(tmp_path, [101, 102], killed)
    started(outcome, run_dir, 0, [0, 1])
    other_node(run_dir, [2, 3], beat=1)
    watch.tick(0.0)
    other_node(run_dir, [2, 3], beat=2)
    t = BEAT_S
    watch.tick(t)
    while not killed:
        t += BEAT_S
        watch.tick(t)
    assert killed == [101, 102] and t <= BEAT_S + SILENT_AFTER_S + BEAT_S
    watch.tick(t + BEAT_S)
    assert killed == [101, 102]  # once
    killed.clear()
    watch, outcome, run_dir, _ = presence(tmp_path / "b", [101], killed)
    started(outcome, run_dir, 0, [0, 1])
    other_node(run_dir, [2, 3], beat=1)
    watch.tick(0.0)
    other_node(run_dir, [2, 3], beat=2, ended=143)
    for i in range(1, 20):
        watch.tick(i * BEAT_S)
    assert killed == []


def test_a_restarts_ranks_are_not_ended_for_the_node_the_attempt_before_lost(tmp_path):
    """After a node's loss, torchrun's restart starts this node's new ranks, which say which
    attempt they are only once their process group forms (seconds later): the node still
    silent is of the attempt before, which the rendezvous that started them left out. They
    run on; once they said so, the lost node is no node of theirs. (Seen in the scale tier:
    the new ranks ended, the restarts used up, the job ended with 8.)"""
    workers = [101, 102]
    killed: list[int] = []
    watch, outcome, run_dir, ends = presence(tmp_path, workers, killed)
    started(outcome, run_dir, 0, [0, 1])
    other_node(run_dir, [2, 3], beat=1)
    watch.tick(0.0)
    other_node(run_dir, [2, 3], beat=2)
    watch.tick(BEAT_S)
    workers[:] = [201, 202]  # the restart's ranks, before they said so
    for i in range(2, 60):
        watch.tick(i * BEAT_S)
    assert killed == [] and not ends
    started(outcome, run_dir, 1, [0, 1], first_pid=201)
    for i in range(60, 120):
        watch.tick(i * BEAT_S)
    assert killed == [] and not ends and watch.attempt == "a1"


def test_a_node_lost_after_its_first_beat_is_lost(tmp_path):
    """A node of this attempt that beat once and died (its ranks had just said they run)
    is judged by its silence from when its beat was read, like any other (seen in a launch:
    a file first read as not moving was never of any attempt, and the job waited for the
    rendezvous' timeout)."""
    workers = [101]
    watch, outcome, run_dir, ends = presence(tmp_path, workers)
    started(outcome, run_dir, 0, [0])
    other_node(run_dir, [1], beat=1)
    watch.tick(0.0)
    workers.clear()
    t = 0.0
    while not ends:
        t += BEAT_S
        watch.tick(t)
        assert t <= SILENT_AFTER_S + WAIT + 2 * BEAT_S
    # silent from 1 + SILENT_AFTER_S, within the wait that began at the ranks' end
    assert t == BEAT_S + WAIT and "lost node n2 (ranks 1, its heartbeat stopped)" in watch.lost


def test_a_node_lost_before_its_first_beat_is_lost_once_this_nodes_ranks_ended(tmp_path):
    """A node killed within a second of its ranks' start leaves no heartbeat to fall silent
    (seen in a launch: the other node waited in the rendezvous for its timeout). The ranks
    of the attempt that no heartbeat names are a gone node: never a reason to end this
    node's running ranks (a slow first beat), but once they have ended, the wait runs and
    the job ends naming those ranks."""
    workers, killed = [101], []
    watch, outcome, run_dir, ends = presence(tmp_path, workers, killed)
    started(outcome, run_dir, 0, [0, 1], world=4)
    t = 0.0
    for _ in range(10):
        watch.tick(t)
        t += BEAT_S
    assert killed == [] and not ends  # running: the broken collective says it, not this
    workers.clear()
    while not ends:
        watch.tick(t)
        t += BEAT_S
        assert t <= 10 * BEAT_S + WAIT + 2 * BEAT_S
    assert t >= 10 * BEAT_S + WAIT
    assert watch.lost.startswith(
        "launcher.torchrun: lost node never heard from (ranks 2-3, no heartbeat from it in 4 s "
        "of its attempt): no node took its place within 30 s"
    )


def test_a_node_whose_first_beat_comes_late_is_heard(tmp_path):
    """The ranks a late heartbeat names are heard of from then on: a crash's restart whose
    other node beat only after this node's ranks had ended is waited for, not lost."""
    workers = [101]
    watch, outcome, run_dir, ends = presence(tmp_path, workers)
    started(outcome, run_dir, 0, [0, 1], world=4)
    watch.tick(0.0)
    workers.clear()
    for i in range(1, 60):
        if i >= 3:
            other_node(run_dir, [2, 3], beat=i)  # its first beat, 3 s in, then on
        watch.tick(i * BEAT_S)
    assert not ends


def test_a_ranks_start_record_carries_the_attempts_name_not_its_agents_restart_count(
    tmp_path, monkeypatch
):
    """What the heartbeat reads of a rank (exit_codes.report_start, read_starts): the file
    is named by this agent's restart count (the latest is the one running), the record holds
    the run directory, the pid and the attempt's name, which every node of the attempt shares
    whatever its agent's count (a replacement's is 0 where the others' is 1: seen in the scale
    tier, the count in the record made every node of another attempt)."""
    monkeypatch.setenv(exit_codes.OUTCOME_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "16")
    for count in ("0", "1"):
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", count)
        exit_codes.report_start(tmp_path / "run", f"vm-7-{count}")
    number, starts = exit_codes.read_starts(tmp_path)
    assert number == 1 and list(starts) == [5]
    assert starts[5] == {"run_dir": str(tmp_path / "run"), "pid": os.getpid(), "attempt": "vm-7-1",
                         "world": 16}  # fmt: skip
