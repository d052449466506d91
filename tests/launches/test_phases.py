"""Every phase of a run under the hang and stop protocols (real launches: 2 CPU ranks, the
default DataLoader, through `python -m launcher.torchrun`), phases slowed or stalled by
`fault.kind=slow_phase` (docs/faults.md).

- Slow but healthy: each phase takes longer than watchdog.min_s, and the job finishes with
  rc 0, because each phase has its own allowance (start-up, first step, a long eval, slow
  checkpoints and trace writes, the profiler's final close; slow storage).
- Stalled (start-up, first step, eval, checkpoint, profiler flush, end of run): past its
  allowance a phase is a hang, exit 5, the hang line naming the phase, its allowance and
  how it was reached, rank 0's summary.json saying so.
- A stop signal in a phase that cannot be cut short and outlasts torchrun's shutdown wait
  (start-up, first step, checkpoint, profiler flush, end of run): the rank says why when
  the signal comes, the job exits 7 (stopped without a checkpoint), and the complete
  checkpoints keep their bytes. A stop during an eval is cut short
  (tests/launches/test_between_steps.py: 143).

min_s is scaled down (2 s, not the default 60 s) so that a phase longer than it costs
seconds, not minutes; the allowances derive from min_s, the measured times and their own
keys the same way at the defaults (tests/test_fault_logic.py computes them there).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from launcher.checkpoint import protocol as checkpoint
from launcher.resilience import exit_codes

from launch import (
    FAST_USER_LOADER,
    explain,
    finish,
    metrics,
    start_torchrun,
    summary,
    sweep_of_points,
    torchrun,
    wait_for,
)
from run_dir_tools import digest, leftovers

MIN_S = 2.0
BASE = [*FAST_USER_LOADER, f"watchdog.min_s={MIN_S}", "trainer.eval_interval=0"]
PROFILE = ["profiler=steps", "profiler.skip_first=1", "profiler.warmup=0", "profiler.active=2"]
SLOWED = ["start-up", "first step", "checkpoint", "profiler flush", "end of run"]


def slow(phases, seconds) -> list[str]:
    return [
        "fault.kind=slow_phase",
        f"fault.phases=[{','.join(phases)}]",
        f"fault.seconds={seconds}",
    ]


# A long eval with a watchdog limit of 1.5 s after a step (the tiny model steps in ~50 ms):
# about 1,000 forward passes per rank per eval, several seconds on two CPU cores.
EVAL_MIN_S = 1.5
LONG_EVAL = ["trainer.eval_interval=2", "trainer.eval_batches=500",
             f"watchdog.min_s={EVAL_MIN_S}", "watchdog.step_multiple=10"]  # fmt: skip


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    """The slow but healthy runs, each a point of one multirun launch (each point its own
    job, run directory, watchdog and rank logs): {point: (run directory, rank 0's log)},
    and the launch's output."""
    tmp = tmp_path_factory.mktemp("healthy")
    points = {
        # start-up, the first step, two checkpoints (the second one's allowance is
        # measured), a trace write and the end of the run each 2.5 s more (above min_s),
        # and an eval of 1,000 batches (real work, seconds)
        "slow": [
            *BASE,
            "trainer.max_steps=4",
            "trainer.checkpoint_interval=2",
            "trainer.eval_interval=4",
            "trainer.eval_batches=1000",
            *PROFILE,
            *slow(SLOWED, MIN_S + 0.5),
        ],
        # every micro-batch read takes 1.2 s, so every step more than min_s=1
        "storage": [
            *FAST_USER_LOADER,
            "watchdog.min_s=1",
            "trainer.max_steps=3",
            "trainer.eval_interval=0",
            "trainer.checkpoint_interval=0",
            "fault.kind=slow_data",
            "fault.seconds=1.2",
        ],
        # two evals, each longer than the watchdog's limit after a step
        "eval": [*FAST_USER_LOADER, *LONG_EVAL, "trainer.max_steps=4"],
    }
    args = sweep_of_points(tmp / "conf", points)
    proc = torchrun([*args, f"run.root={tmp}", "run.id=h"], runner="launcher.torchrun")
    assert proc.returncode == 0, explain(proc)
    runs = {name: tmp / "h" / f"point={name}" for name in points}
    logs = {name: (run, (run / "logs" / "rank0.log").read_text()) for name, run in runs.items()}
    return logs, proc.stderr


def test_a_slow_but_healthy_run_finishes_in_every_phase(healthy):
    """One run: start-up, the first step, two checkpoints, a trace write and the end of the
    run each longer than min_s, and a long eval: each phase has its own allowance."""
    (run, log), out = healthy[0]["slow"], healthy[1]
    assert "hang:" not in out  # nor in any point of the launch
    for phase in SLOWED:
        assert f"fault.kind=slow_phase: {phase} takes" in log, phase
    evals = [r for r in metrics(run) if "eval/loss" in r]
    assert [r["step"] for r in evals] == [4]
    assert evals[0]["eval/time_s"] > MIN_S, evals  # longer than min_s
    assert summary(run)["status"] == "completed"


def test_slow_storage_is_not_a_hang(healthy):
    """Every micro-batch read takes 1.2 s, so every step more than min_s=1: at the second
    step, the first step's time is the estimate until steps are timed."""
    (run, _), out = healthy[0]["storage"], healthy[1]
    assert "hang:" not in out
    assert summary(run)["step_time_s/p50"] > 1.0
    assert summary(run)["status"] == "completed"


def test_an_eval_longer_than_the_hang_limit_is_not_a_hang(healthy):
    """An eval far longer than the watchdog's limit after a step, mid-run and at the end, is
    not a hang: each eval batch is progress."""
    (run, _), out = healthy[0]["eval"], healthy[1]
    assert "hang:" not in out
    evals = [r for r in metrics(run) if "eval/loss" in r]
    assert [r["step"] for r in evals] == [2, 4]
    assert all(r["eval/time_s"] > EVAL_MIN_S for r in evals), evals  # each would have hung
    assert summary(run)["status"] == "completed"


# phase, the overrides that make it come and give it a small allowance, the allowance's
# source as the hang line names it, the step the phase follows
STALLS = [
    ("start-up", ["watchdog.startup_s=2"], "watchdog.startup_s", 0),
    ("first step", ["watchdog.first_step_s=2"], "watchdog.first_step_s", 0),
    ("eval", ["trainer.eval_interval=2", "trainer.eval_batches=2", "watchdog.step_multiple=60"],
     "watchdog.step_multiple x 2 batches x the step time", 2),
    ("checkpoint", ["trainer.checkpoint_interval=2", "watchdog.checkpoint_s=2"],
     "watchdog.checkpoint_s", 2),
    ("profiler flush", [*PROFILE, "watchdog.checkpoint_s=2"], "watchdog.checkpoint_s", 2),
    ("end of run", ["watchdog.checkpoint_s=2"], "watchdog.checkpoint_s", 3),
]  # fmt: skip


@pytest.mark.parametrize(("phase", "overrides", "why", "after"), STALLS, ids=[s[0] for s in STALLS])
def test_a_stalled_phase_is_a_hang_named_with_its_allowance(tmp_path, phase, overrides, why, after):
    args = [*BASE, "trainer.max_steps=3", *overrides, *slow([phase], 120),
            f"run.root={tmp_path}", "run.id=stall"]  # fmt: skip
    proc = torchrun(args, runner="launcher.torchrun")
    assert proc.returncode == exit_codes.HANG, explain(proc)
    lines = [ln for ln in proc.stderr.splitlines() if "hang: no progress" in ln]
    assert lines, explain(proc)
    for line in lines:
        assert f"({phase} allowance " in line and why in line, line
        assert f"after step {after} ({phase})" in line, line
    assert "Traceback" not in proc.stderr
    run = tmp_path / "stall"
    assert summary(run)["status"] == "failed: hang detected"
    # no half-done write; the lock of rank 0, which exited 5, is taken over by the restart
    assert leftovers(run) in ([], [".lock"])
    if phase == "eval":  # docs/faults.md's invocation of torch's own analyser, on these dumps
        fr = tmp_path / "stall" / "logs" / "fr"
        analyser = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", "-v"]
        read = subprocess.run([*analyser, str(fr)], capture_output=True, text=True, timeout=120)
        assert read.returncode == 0, read.stderr[-3000:]
        report = read.stdout + read.stderr  # -v logs its tables
        assert "desc='default_pg', size=2" in report and "Collectives" in report, report[:2000]


# phase (slowed for longer than torchrun's shutdown wait, 3 s here), the overrides that
# make it come, the complete checkpoints when the stop comes
STOPS = [
    ("start-up", [], []),
    ("first step", [], []),
    ("checkpoint", ["trainer.checkpoint_interval=2"], []),  # step 2's, cut off by the kill
    ("profiler flush", [*PROFILE, "trainer.checkpoint_interval=2"], ["step_00000002"]),
    ("end of run", [], ["step_00000004"]),  # the final step's
]


@pytest.mark.parametrize(("phase", "overrides", "checkpoints"), STOPS, ids=[s[0] for s in STOPS])
def test_a_stop_in_a_phase_that_cannot_be_cut_short_says_why(
    tmp_path, phase, overrides, checkpoints
):
    output = tmp_path / "out.txt"
    args = [*BASE, "trainer.max_steps=4", *overrides, *slow([phase], 60),
            f"run.root={tmp_path}", "run.id=stop"]  # fmt: skip
    proc = start_torchrun(args, output, "--shutdown-timeout=3")
    fired = f"fault.kind=slow_phase: {phase} takes"
    wait_for(lambda: output.read_text().count(fired) == 2, proc)  # both ranks are in it
    run = tmp_path / "stop"
    good = complete_checkpoints(run)
    os.kill(proc.pid, signal.SIGTERM)
    out = finish(proc, output)
    assert proc.returncode == exit_codes.STOPPED_NO_CHECKPOINT, out
    said = [ln for ln in out.splitlines() if f"received SIGTERM during {phase}, which" in ln]
    assert len(said) == 2 and "cannot be cut short" in said[0], out  # each rank, at once
    assert "exit code 7 (stopped without a checkpoint)" in out, out
    assert "no stop checkpoint" in out and "Traceback" not in out, out
    # nothing lost: the complete checkpoints keep their bytes (the end of the run's is the
    # final step's), no temporary folder; the killed rank 0's lock is taken over next launch
    assert complete_checkpoints(run) == good and sorted(good) == checkpoints, good.keys()
    assert leftovers(run) in ([], [".lock"])


def complete_checkpoints(run) -> dict[str, dict[str, str]]:
    return {p.name: digest(p) for p in checkpoint.scan(run / "checkpoints").complete}


def test_a_stop_in_a_phase_that_ends_in_time_checkpoints_after_it(tmp_path):
    """The profiler flush takes 4 s more, well within torchrun's shutdown wait (30 s): the
    stop waits for it, and the stop checkpoint follows at a step boundary: 143, the run's
    summary `stopped` at the checkpoint's step."""
    output = tmp_path / "out.txt"
    args = [*BASE, "trainer.max_steps=8", *PROFILE, *slow(["profiler flush"], 4),
            f"run.root={tmp_path}", "run.id=intime"]  # fmt: skip
    proc = start_torchrun(args, output)
    fired = "fault.kind=slow_phase: profiler flush takes"
    wait_for(lambda: output.read_text().count(fired) == 2, proc)
    os.kill(proc.pid, signal.SIGTERM)
    out = finish(proc, output)
    assert proc.returncode == exit_codes.STOPPED, out
    said = [ln for ln in out.splitlines() if "received SIGTERM during profiler flush" in ln]
    assert len(said) == 2, out
    assert "exit code 143 (stopped with a checkpoint)" in out and "Traceback" not in out, out
    run = tmp_path / "intime"
    (stop,) = complete_checkpoints(run)
    done = summary(run)
    assert done["status"] == "stopped" and f"step_{done['steps']:08d}" == stop, (done, stop)
    assert done["steps"] < 8 and leftovers(run) == []
