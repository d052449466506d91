"""The pure parts of fault handling, in-process and fast: the job's exit code from the ranks'
reports, the straggler streak, the compute-time spread, the watchdog's limits, and the hang
analyser on run directories laid out as the watchdog leaves them."""

from __future__ import annotations

import json
import pickle
import time

import pytest
from omegaconf import OmegaConf

from launcher.analyze.hang import analyze_hang, load_flight_recorder, markdown_hang
from launcher.config import WatchdogConfig
from launcher.observe.metrics import aggregate
from launcher.resilience import bad_hosts, exit_codes, watchdog
from launcher.resilience.bad_steps import BadSteps
from launcher.resilience.stragglers import StragglerWatch
from launcher.resilience.watchdog import HangWatchdog

E = exit_codes


@pytest.mark.parametrize(
    ("codes", "succeeded", "expected"),
    [
        ({0: 0, 1: 0}, True, E.DONE),
        ({0: 143, 1: 143}, False, E.STOPPED),
        ({0: 2, 1: 2}, False, E.BAD_INPUT),
        ({0: 1, 1: 4}, False, E.OOM),  # the OOM explains the other rank's crash
        ({0: 5}, False, E.HANG),  # rank 1 was frozen and reported nothing
        ({0: 1, 1: 3}, False, E.NONFINITE),
        ({0: 143, 1: 1}, False, E.STOPPED),  # the checkpoint was complete before rank 1 died
        ({0: 1, 1: 9}, False, 9),  # a code a rank chose (fault.exit_code) passes through
        ({0: 7, 1: 7}, False, E.STOPPED_NO_CHECKPOINT),  # killed in a phase not cut short
        ({0: 143, 1: 7}, False, E.STOPPED),  # rank 0's stop checkpoint is complete: all wrote
        ({0: 1}, False, E.CRASH),
        ({}, False, E.CRASH),  # killed before any rank could say anything
        ({0: 0, 1: 0}, False, E.CRASH),  # torchrun failed although the ranks did not
    ],
)
def test_job_code_prefers_the_most_specific_diagnosis(codes, succeeded, expected):
    assert exit_codes.job_code(codes, succeeded) == expected


@pytest.mark.parametrize(
    ("codes", "chosen", "expected"),
    [
        ({0: 1}, {1: 0}, E.DONE),  # fault.exit_code=0: its peer's crash is its doing
        ({0: 1}, {1: 9}, 9),
        ({0: 5}, {1: 0}, E.HANG),  # a contract code still explains more
        ({0: 1}, {}, E.CRASH),
    ],
)
def test_a_code_a_rank_chose_to_leave_with_is_the_jobs(codes, chosen, expected):
    assert exit_codes.job_code(codes, False, chosen) == expected


def test_chosen_codes_are_reported_apart(tmp_path, monkeypatch):
    monkeypatch.setenv(exit_codes.OUTCOME_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    exit_codes.report(0, chosen=True)
    monkeypatch.setenv("RANK", "0")
    exit_codes.report(1)
    assert exit_codes.read_reports(tmp_path) == {0: 1}
    assert exit_codes.read_reports(tmp_path, chosen=True) == {1: 0}


def test_reports_of_the_latest_attempt_count(tmp_path, monkeypatch):
    monkeypatch.setenv(exit_codes.OUTCOME_DIR_ENV, str(tmp_path))
    for attempt, rank, code in [(0, 0, 1), (0, 1, 4), (1, 0, 143), (1, 1, 143)]:
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(attempt))
        monkeypatch.setenv("RANK", str(rank))
        exit_codes.report(code)
    (tmp_path / "stray.txt").write_text("x")
    assert exit_codes.read_reports(tmp_path) == {0: 143, 1: 143}


def test_report_without_a_front_door_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(exit_codes.OUTCOME_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    exit_codes.report(3)
    assert list(tmp_path.iterdir()) == []


# (each node's code, srun's: the highest of them or of a node killed before it reported)
NODE_CASES = [
    ({"n1": 0, "n2": 0}, 0, E.DONE),
    ({"n1": E.OOM, "n2": E.STOPPED}, E.STOPPED, E.OOM),  # srun's highest is not the cause
    ({"n1": E.BAD_INPUT, "n2": E.CRASH}, E.BAD_INPUT, E.BAD_INPUT),
    ({"n1": E.HANG}, 137, E.HANG),  # n2 SIGKILLed: srun's 137 stands for it
    ({"n1": 0, "n2": 0}, 1, E.CRASH),  # srun itself failed
    ({}, E.STOPPED, E.STOPPED),  # no node reported (a container without the launcher)
]


@pytest.mark.parametrize(("nodes", "srun", "expected"), NODE_CASES)
def test_the_batch_script_takes_the_job_code_from_every_node(tmp_path, monkeypatch, nodes,
                                                             srun, expected):  # fmt: skip
    folder = tmp_path / "job7.start0"
    monkeypatch.setenv(exit_codes.NODE_CODES_ENV, str(folder))
    for node, code in nodes.items():
        monkeypatch.setenv("SLURMD_NODENAME", node)  # two nodes may share a host name
        exit_codes.report_node(code)
    assert sorted(p.name for p in folder.glob("*")) == sorted(nodes)
    assert exit_codes.nodes_code(folder, srun) == expected


def _figures(rank, excess):
    return {"compute_s/slowest_rank": rank, "compute_s/excess_frac": excess}


def test_a_straggler_is_named_only_after_a_streak_of_the_same_rank():
    watch = StragglerWatch(OmegaConf.structured(WatchdogConfig), announce=False)
    named = [
        watch.update(_figures(rank, excess))["straggler/rank"]
        for rank, excess in [(1, 0.5), (1, 0.5), (0, 0.5), (0, 0.9), (0, 0.3), (0, 0.4), (0, 0.1)]
    ]
    # rank 1 twice, then rank 0 four times above 0.2: named from its third interval on
    assert named == [None, None, None, None, 0, 0, None]


def test_compute_time_takes_out_waiting_for_data_and_for_other_ranks():
    def rank(waits: float, exposed: float) -> dict:  # two steps of 1 s each
        return {"loss": 1.0, "nonfinite": 0.0, "grad_norm": 1.0, "mem_gb": None,
                "host_gb": 1.0, "step_time_s": [1.0, 1.0], "data_wait_s": [waits] * 2,
                "comm/allreduce_s": [0.1, 0.1], "comm/exposed_s": [exposed] * 2,
                "comm/bytes": [1.0, 1.0]}  # fmt: skip

    fast, slow = rank(waits=0.1, exposed=0.6), rank(waits=0.0, exposed=0.0)
    agg = aggregate([fast, slow], world_size=2)
    # equal step times; rank 0 spent 0.1 + 0.6 of each second waiting, rank 1 nothing
    assert agg.figures["step_time_s/slowest_rank"] == 0  # a tie: the first
    assert agg.figures["compute_s/slowest_rank"] == 1
    assert agg.figures["compute_s/excess_frac"] == pytest.approx(1.0 / 0.3 - 1)


def test_watchdog_limits_follow_recent_steps_and_phases(tmp_path):
    cfg = OmegaConf.structured(WatchdogConfig(enabled=False, min_s=2.0, step_multiple=10.0))
    dog = HangWatchdog(cfg, rank=0, run_dir=tmp_path, start_step=0, on_hang=lambda step: None)
    assert dog._limit == cfg.startup_s and dog.current_phase() == "start-up"
    dog.begin_steps(0)
    assert dog._limit == cfg.first_step_s
    dog.step_done(1)
    assert dog._limit == 2.0  # no step time known yet: the floor
    dog._last -= 0.5  # a step of 0.5 s
    dog.step_done(2)
    assert dog._limit == pytest.approx(5.0, rel=0.05)
    with dog.phase("checkpoint"):
        assert dog._limit == cfg.checkpoint_s  # none measured yet
        dog._last -= 0.4  # it took 0.4 s (the watchdog reads its own clock)
    dog.step_done(3)  # the interval after the checkpoint is not a step time
    assert len(dog._durations) == 1


def test_each_phase_has_an_allowance_scaled_by_what_it_does(tmp_path):
    """The defaults (min_s=60, step_multiple=10): an eval of 500 batches after 0.5 s steps
    gets 2,500 s, a checkpoint that took 30 s gets 300 s the next time, a quick one the
    floor; the first step and start-up their own keys. The hang line names them."""
    cfg = OmegaConf.structured(WatchdogConfig(enabled=False))
    dog = HangWatchdog(cfg, rank=0, run_dir=tmp_path, start_step=0, on_hang=lambda step: None)
    assert dog.allowance("eval", batches=500) == (60.0, "watchdog.min_s")  # no step time yet
    dog.begin_steps(0)
    dog._last -= 9.0  # a first step (compilation) of 9 s: the estimate until steps are timed
    dog.step_done(1)
    assert dog.allowance("eval", batches=2)[0] == pytest.approx(180.0, rel=0.01)
    for step in (2, 3, 4):
        dog._last -= 0.5
        dog.step_done(step)
    limit, why = dog.allowance("eval", batches=500)
    assert limit == pytest.approx(2500.0, rel=0.01)
    assert why.startswith("watchdog.step_multiple x 500 batches x the step time 0.5")
    assert dog.allowance("checkpoint") == (600.0, "watchdog.checkpoint_s")
    for took, phase in ((30.0, "checkpoint"), (2.0, "profiler flush")):
        with dog.phase(phase):
            dog._last -= took
        dog._longest[phase] = took  # as the clock would have it
    assert dog.allowance("checkpoint")[0] == pytest.approx(300.0)
    assert dog.allowance("profiler flush") == (60.0, "watchdog.min_s")  # 10 x 2 s < the floor
    assert dog.allowance("end of run") == dog.allowance("profiler flush")  # its final close
    dog.async_writes = True  # the next checkpoint may wait for the last one's writes
    dog._longest["checkpoint"] = 1.0
    assert dog.allowance("checkpoint")[0] == 600.0


# -- the analyser on laid-out run directories ----------------------------------------------
def _frame(function, file="/x/torch/distributed/distributed_c10d.py"):
    return {"file": file, "line": 1, "function": function}


WAITING = [_frame("run", "/x/launcher/train/loop.py"), _frame("all_reduce")]


BUSY = [_frame("run", "/x/launcher/train/loop.py"), _frame("load", "/x/launcher/data/cache.py")]


def _run_dir(tmp_path, world, reports, recorders=None):
    logs = tmp_path / "logs"
    (logs / "fr").mkdir(parents=True)
    (tmp_path / "env.json").write_text(json.dumps({"world_size": world}))
    for rank, stack in reports.items():
        record = {"rank": rank, "host": f"h{rank}", "pid": 100 + rank, "step": 41}
        record.update(phase="training", idle_s=130.0, main_stack=stack)
        (logs / f"hang.rank{rank}.json").write_text(json.dumps(record))
    for rank, seq in (recorders or {}).items():
        entry = {"pg_id": 0, "collective_seq_id": seq, "profiling_name": "nccl:all_reduce"}
        entry["frames"] = [{"name": "allreduce_hook"}]
        (logs / "fr" / f"rank_{rank}").write_bytes(pickle.dumps({"entries": [entry]}))
    return tmp_path


@pytest.mark.parametrize(
    ("reports", "recorders", "culprits", "reason"),
    [
        ({0: WAITING, 2: WAITING}, {0: 9, 2: 9}, [1], "could not run"),
        ({0: WAITING, 1: WAITING, 2: WAITING}, {0: 9, 1: 8, 2: 9}, [1], "never entered"),
        ({0: WAITING, 1: BUSY, 2: WAITING}, {}, [1], "busy in its own code"),
        ({0: WAITING, 1: WAITING, 2: WAITING}, {0: 9, 1: 9, 2: 9}, [], "network or peer"),
    ],
    ids=["silent", "behind-in-collectives", "busy", "all-waiting"],
)
def test_hang_culprit(tmp_path, reports, recorders, culprits, reason):
    result = analyze_hang(_run_dir(tmp_path, 3, reports, recorders))
    assert result["culprits"] == culprits
    assert reason in result["reason"]
    assert result["step"] == 41
    text = markdown_hang(result)
    assert (f"Culprit: rank {culprits[0]}" in text) if culprits else ("No single culprit" in text)


@pytest.mark.parametrize(
    ("where", "text", "skipped"),
    [
        ("logs/fr/rank_1", "garbage", "logs/fr/rank_1: not a flight-recorder dump"),
        ("logs/hang.rank1.json", "[1, 2]", "logs/hang.rank1.json: not a hang record"),
        ("env.json", '{"world_size": "three"}', "env.json: its world_size is 'three'"),
        ("env.json", "[3]", "env.json: unreadable"),
    ],
    ids=["garbage dump", "a list for a record", "a word for the world size", "a list env"],
)
def test_hang_evidence_it_cannot_use_is_named_not_ignored(tmp_path, where, text, skipped):
    """A garbage flight-recorder dump, a hang record or env.json of another shape: the
    analysis goes on without it (a rank whose record is unusable counts as silent; the
    world size falls back to the rank logs) and says which file it skipped."""
    run = _run_dir(tmp_path, 3, {0: WAITING, 1: WAITING, 2: WAITING}, {0: 9, 1: 9, 2: 9})
    for rank in range(3):
        (run / "logs" / f"rank{rank}.log").write_text("")
    (run / where).write_text(text)
    result = analyze_hang(run)
    assert [s for s in result["skipped"] if skipped in s], result["skipped"]
    assert f"skipped {tmp_path}" in markdown_hang(result)
    assert len(result["ranks"]) == 3


def test_a_recorder_dump_with_objects_is_refused(tmp_path):
    path = tmp_path / "rank_0"
    path.write_bytes(pickle.dumps({"entries": [OmegaConf.create({})]}))
    with pytest.raises(pickle.UnpicklingError):
        load_flight_recorder(path)


def test_bad_steps_allow_max_bad_steps_within_the_window():
    """trainer.max_bad_steps=2 within bad_step_window=10: a third bad step inside ten steps
    is one too many; bad steps that leave the window no longer count."""
    bad = BadSteps(max_bad=2, window=10)
    assert not bad.record(3) and not bad.record(5)
    assert not bad.record(13)  # step 3 has left the window (steps 4..13)
    assert (bad.skipped, bad.in_window()) == (3, 2)
    assert bad.record(14)  # 5, 13, 14: three within 5..14
    assert bad.skipped == 3


def test_a_peers_record_of_this_job_makes_a_rank_write_its_own(tmp_path):
    """The ranks of one hung job notice at different moments (each limit from its own step
    times): a rank that finds another's declaration of this job fires at once, and one that
    fired waits a few polls for the others' records, so that no rank that could run is
    stopped before it wrote (and then named as the one that could not)."""
    cfg = OmegaConf.structured(WatchdogConfig(enabled=False, min_s=0.5))
    dog = HangWatchdog(cfg, rank=0, run_dir=tmp_path, start_step=0, on_hang=lambda step: None)
    logs = tmp_path / "logs"
    logs.mkdir()
    declared = logs / "hang.declared"
    assert dog.peer_declaring() is None
    for stale in ({"rank": 1, "time": dog._started - 60}, {"rank": 0, "time": time.time()}):
        declared.write_text(json.dumps(stale))  # a job before's, then its own
        assert dog.peer_declaring() is None
    declared.write_text('{"rank": 1, "ti')  # being written
    assert dog.peer_declaring() is None
    declared.write_text(json.dumps({"rank": 1, "time": time.time()}))
    assert dog.peer_declaring() == 1
    (logs / "hang.rank1.json").write_text(json.dumps({"time": time.time()}))
    (logs / "hang.rank2.json").write_text(json.dumps({"time": dog._started - 60}))  # old
    started = time.monotonic()
    assert dog.await_peers(3) == [2]  # rank 2 never writes this job's record: the wait ends
    assert 2.0 <= time.monotonic() - started < 5.0
    (logs / "hang.rank2.json").write_text(json.dumps({"time": time.time()}))
    assert dog.await_peers(3) == [] and dog.await_peers(1) == []


def test_the_wait_for_peers_ends_once_the_silent_ones_are_named_stopped(tmp_path):
    """A rank that a peer's record names stopped (SIGSTOP, seen on its node) will never
    write: the wait for records ends when every rank has written or been named so, not at
    its deadline (the frozen rank is still returned: the analyser names it by its silence)."""
    cfg = OmegaConf.structured(WatchdogConfig(enabled=False, min_s=10))
    dog = HangWatchdog(cfg, rank=0, run_dir=tmp_path, start_step=0, on_hang=lambda step: None)
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "hang.rank1.json").write_text(json.dumps({"time": time.time(), "stopped_peers": [2]}))
    (logs / "hang.rank3.json").write_text(json.dumps({"time": time.time(), "stopped_peers": []}))
    started = time.monotonic()
    assert dog.await_peers(4) == [2]
    assert time.monotonic() - started < 1.0  # the deadline is 3 polls + 2 s = 5 s
    started = time.monotonic()
    assert dog.await_peers(5) == [2, 4]  # rank 4 is named by nobody: waited for in full
    assert time.monotonic() - started >= 5.0


def test_a_straggler_is_said_once_per_rank_and_run_however_often_it_flaps(caplog):
    watch = StragglerWatch(OmegaConf.structured(WatchdogConfig), announce=True)
    for excess in [0.5, 0.5, 0.5, 0.1, 0.5, 0.5, 0.5]:  # two streaks of rank 1
        watch.update(_figures(1, excess))
    assert sum("straggler: rank 1" in r.getMessage() for r in caplog.records) == 1
    again = StragglerWatch(OmegaConf.structured(WatchdogConfig), announce=True)  # the next run
    for _ in range(3):
        again.update(_figures(1, 0.5))
    assert sum("straggler: rank 1" in r.getMessage() for r in caplog.records) == 2


def test_a_hangs_culprit_is_kept_off_but_not_a_rank_that_ended_on_its_own_error(tmp_path):
    """The declaring rank records the verdict's culprits' hosts in bad_hosts (exclude.hang):
    ranks 1 and 3 wrote no hang record; rank 1 could not run (its log stops mid-step), rank
    3 had ended on an error of its own since the job began (its peer lost): only rank 1's
    host is kept off."""
    run = _run_dir(tmp_path, 4, {0: WAITING, 2: WAITING})
    since = time.time() - 60
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since + 30))
    early = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since - 30))
    lasts = {1: "INFO launcher: step 41/100 | loss 3.1",
             3: "ERROR launcher: error: lost a peer rank (Connection closed)"}  # fmt: skip
    for rank, last in lasts.items():
        (run / "logs" / f"rank{rank}.log").write_text(
            f"{early},000 [rank {rank}] ERROR launcher: an earlier attempt's error\n"
            f"{early},000 [rank {rank}] INFO launcher: rank {rank}/4 (local {rank}, pid 9{rank}) "
            f"on host node{rank}, device cpu\n{stamp},500 [rank {rank}] {last}\n"
        )
    watchdog.keep_culprits_off(run, 41, since)
    assert bad_hosts.reasons(run) == {
        "node1": "hang: rank 1 wrote no stacks: the process could not run at all (stopped, "
        "swapped out, or stuck in the kernel or a driver) (after step 41)"
    }
