"""One definition of a run's wall time (issue 53): from the launch (torchrun's agent under
torchrun, else the process) to the last write, each later job of the process from the end
of the one before; summary.json holds it and the closing block shows it."""

from __future__ import annotations

import os
import time

import pytest

from launcher.observe.recorder import Recorder
from launcher.runtime import launch_clock
from launcher.runtime.launch_state import LaunchState
from launcher.runtime.process import Runtime, end_job

from in_process import CPU, trainer


def test_a_process_start_is_read_from_proc():
    """Between the machine's boot (/proc/stat's btime) and now: this test's interpreter may
    have run for the whole tier, so no bound tighter than that holds."""
    mine = launch_clock.process_started()
    with open("/proc/stat") as stat:
        booted = next(int(ln.split()[1]) for ln in stat if ln.startswith("btime "))
    assert mine is not None and booted - 1 <= mine <= time.time()
    parent = launch_clock.process_started(os.getppid())
    assert parent is not None and parent <= mine + 0.05  # clock ticks: 10 ms
    assert launch_clock.process_started(2**30) is None  # no such process


@pytest.mark.parametrize(
    ("process", "threads", "program"),
    [
        (100.0, [100.4, 101.0], 100.0),  # torchrun started by a shell: its first thread soon
        (100.0, [], 100.0),  # no other thread (yet)
        (100.0, [100.0 + launch_clock.EXEC_GAP_S], 100.0),  # at the gap: still the process's
        (100.0, [190.0, 185.5], 185.5),  # `bash -c 'pip install ... && torchrun ...'`
        (None, [185.5], 185.5),  # /proc could not say the process's start
    ],
)
def test_a_program_a_shell_execd_starts_with_its_first_thread(process, threads, program):
    assert launch_clock.later_program_start(process, threads) == program


def test_the_launch_is_torchruns_start_under_torchrun(monkeypatch):
    """Under torchrun (which sets TORCHELASTIC_RUN_ID for its workers, its children) the
    launch began with the parent; without it, with this process."""
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert launch_clock.launch_started() == pytest.approx(launch_clock.process_started(), abs=0.05)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    parent = launch_clock.process_started(os.getppid())
    assert launch_clock.launch_started() == pytest.approx(parent, abs=0.05)


def test_the_summary_counts_from_the_launch_and_the_next_job_from_the_last_end():
    launch = LaunchState(job_started=time.time() - 100.0)  # start-up took 100 s
    rt = Runtime(0, 0, 1, CPU, None, run_id="r1", launch=launch)
    recorder = Recorder(rt, trainer(), [], 64, 6.0, lambda tokens_per_s: None, 4)
    recorder.begin(0)  # the loop itself has run for no time at all
    assert recorder.summary("completed", 0)["wall_time_s"] == pytest.approx(100.0, abs=1.0)
    end_job(rt)
    assert time.time() - launch.job_started < 1.0  # a sweep's next point starts counting now
