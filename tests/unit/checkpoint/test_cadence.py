"""When each tier saves (launcher.checkpoint.cadence, docs/checkpoints.md): a fixed interval,
or `auto`, Young's sqrt(2 x cost x MTBF) from the costs the run measures, recomputed at
every save; the config takes a number or auto and refuses anything else in one line. The
knob matrix launches `auto` on every engine with the memory tier (tests/knob_rows.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from launcher.checkpoint import cadence
from launcher.config import ConfigError, compose, validate
from launcher.runtime.process import Runtime

RT = Runtime(0, 0, 1, torch.device("cpu"), None, run_id="r", run_dir=Path("/nonexistent"))


def test_youngs_interval_balances_saves_against_redone_work():
    # a 10 s save with a failure every 5 hours: sqrt(2 x 10 x 18000) = 600 s
    assert cadence.young_s(10.0, 5 * 3600) == pytest.approx(600.0)
    assert cadence.steps_between(10.0, 5 * 3600, step_s=2.0) == 300
    assert cadence.steps_between(1e-6, 1.0, step_s=5.0) == 1  # never below one step
    # the optimum: the time lost per second, C/T + T/(2M), is least at Young's T
    cost, mtbf = 3.0, 7200.0
    lost = lambda t: cost / t + t / (2 * mtbf)  # noqa: E731
    best = cadence.young_s(cost, mtbf)
    assert lost(best) < min(lost(best * 0.8), lost(best * 1.25))


def test_the_default_mtbf_is_llama_3s_node_mtbf_over_the_nodes():
    assert round(cadence.NODE_MTBF_H) == round(54 * 24 * 2048 / 419) == 6335
    seconds, why = cadence.mtbf_s(None, 16)
    assert seconds == pytest.approx(cadence.NODE_MTBF_H * 3600 / 16)
    assert why.startswith("trainer.mtbf_h=null: 6,335 node-hours") and "/ 16 node(s)" in why
    assert cadence.mtbf_s(0.5, 16) == (1800.0, "trainer.mtbf_h=0.5")


def test_a_fixed_interval_saves_on_its_multiples():
    every = cadence.Fixed(5)
    assert [s for s in range(1, 16) if every.due(s)] == [5, 10, 15]
    assert not any(cadence.Fixed(0).due(s) for s in range(1, 16))


def ticks(
    clock: cadence.LoopClock,
    seconds: dict[int, float],
    default: float = 1.0,
    steps: range = range(1, 41),
) -> None:
    """Steps ending one after another, each `default` seconds after the one before (the
    clock's last) unless given."""
    now = max(clock.ends.values(), default=0.0)
    for step in steps:
        now += seconds.get(step, default)
        clock.tick(step, now)


def test_a_saves_cost_is_the_time_the_loop_lost_to_it_not_its_call():
    """A memory save whose call takes 0.1 s and whose write, seal and peer copy slow the
    two iterations after it by 0.5 and 0.3 s costs 0.8 s; the pace leaves those out."""
    clock = cadence.LoopClock()
    ticks(clock, {}, steps=range(1, 11))
    clock.touch(10)
    ticks(clock, {11: 1.5}, steps=range(11, 12))
    assert clock.cost(10, call_s=0.1) is None  # its second step has not ended yet
    ticks(clock, {12: 1.3}, steps=range(12, 13))
    assert clock.cost(10, call_s=0.1) == pytest.approx(0.8)
    assert clock.cost(10, call_s=2.0) == 2.0  # never less than the call itself
    ticks(clock, {}, steps=range(13, 21))
    assert clock.pace() == 1.0 and len(clock.free) == 17  # the touched two left out


def test_a_resume_starts_the_clock_afresh():
    """The first iteration after a resume (or a rewind) spans the restart: not a pace."""
    clock = cadence.LoopClock()
    ticks(clock, {}, steps=range(1, 6))
    clock.begin()
    ticks(clock, {3: 30.0}, steps=range(3, 6))  # 30 s to restart, then steps of 1 s
    assert list(clock.free) == [1.0] * 6


def test_auto_saves_early_then_at_youngs_interval_from_what_it_measured():
    clock = cadence.LoopClock()
    every = cadence.Young("trainer.checkpoint_interval", RT, (3600.0, "given"), clock)
    assert next(s for s in range(1, 5) if every.due(s)) == cadence.FIRST
    ticks(clock, {}, default=0.25, steps=range(1, cadence.FIRST + 1))
    clock.touch(cadence.FIRST)
    every.saved(cadence.FIRST, call_s=0.1)
    # the save slows its two iterations by 0.5 s in all: steps of 0.25 s, a save of 0.5 s
    ticks(clock, {3: 0.65, 4: 0.35}, default=0.25, steps=range(3, 5))
    every.settle(cadence.FIRST + 1)  # one step on: not known yet
    assert every.note() is None
    every.settle(cadence.FIRST + 2)
    assert every.note() == (pytest.approx(0.5), 0.25)  # taken by the next vote to carry
    assert every.note() is None  # once
    assert every.every == cadence.FIRST and every.writes == []  # none made yet
    every.saved(4, call_s=0.1)  # the next save, at the interval so far
    every.agree([(0.5, 0.25), (0.3, 0.26), (0.4, None)])  # the vote: every rank's note
    assert every.note() is None and every.writes == [0.5]  # the slowest rank's cost
    young = math.sqrt(2 * 0.5 * 3600)  # 60 s at the median pace, 0.255 s a step
    assert every.every == round(young / 0.255) == 235
    assert every.next == 4 + every.every  # from the last save
    every.begin(100)  # a resume: the interval measured so far, from the step resumed
    assert every.next == 100 + every.every
    every.settle(200)  # nothing pending after a resume
    assert every.note() is None and every.writes == [0.5]


@pytest.mark.parametrize("key", ["checkpoint_interval", "memory_checkpoint_interval"])
def test_an_interval_is_a_number_of_steps_or_auto(key):
    assert getattr(validate(compose([f"trainer.{key}=auto"]), 1).trainer, key) == "auto"
    for bad in ("often", "2.5", "true"):
        with pytest.raises(ConfigError) as exc:
            validate(compose([f"trainer.{key}={bad}"]), 1)
        line = str(exc.value)
        assert line.startswith(f"trainer.{key}={bad}: ") and "\n" not in line
    with pytest.raises(ConfigError, match=r"trainer.mtbf_h=0.0: must be greater than 0"):
        validate(compose(["trainer.mtbf_h=0"]), 1)


def test_the_durable_tier_follows_the_failures_the_memory_tier_cannot_recover_from():
    every = (180.0, "trainer.mtbf_h=0.05")
    assert cadence.memory_loss_mtbf_s(0.5, every) == (1800.0, "trainer.memory_loss_mtbf_h=0.5")
    seconds, why = cadence.memory_loss_mtbf_s(None, every)  # null: the safe side
    assert seconds == 180.0 and why == "trainer.memory_loss_mtbf_h=null: every failure's"
    assert validate(compose(["trainer.mtbf_h=1", "trainer.memory_loss_mtbf_h=1"]), 1)
    with pytest.raises(ConfigError) as exc:
        validate(compose(["trainer.mtbf_h=2", "trainer.memory_loss_mtbf_h=1"]), 1)
    assert str(exc.value).startswith("trainer.memory_loss_mtbf_h=1 is below trainer.mtbf_h=2:")
    with pytest.raises(ConfigError, match=r"trainer.memory_loss_mtbf_h=-1.0: must be greater"):
        validate(compose(["trainer.memory_loss_mtbf_h=-1"]), 1)


def test_a_restart_recalls_the_measured_interval_once_and_every_rank_alike():
    """`state` is what the vote agreed (the same on every rank); `recall` in a new process
    sets the interval from it; a process that measured its own keeps its own."""
    clock = cadence.LoopClock()
    first = cadence.Young("trainer.memory_checkpoint_interval", RT, (180.0, "given"), clock)
    assert first.state() is None  # nothing agreed yet: nothing to carry
    first.agree([(0.1, 0.3), (0.12, 0.32)])
    state = first.state()
    assert state == {"writes": [0.12], "pace": 0.31}
    again = cadence.Young("trainer.memory_checkpoint_interval", RT, (180.0, "given"), clock)
    assert "the first save 2 steps in" in again.opening_line()
    assert again.recall(state) and again.every == first.every == round(
        math.sqrt(2 * 0.12 * 180) / 0.31
    )
    again.begin(100)
    assert again.next == 100 + again.every  # from the first save on, not FIRST steps in
    assert again.opening_line().endswith("as this run measured before the restart")
    assert not again.recall({"writes": [9.0], "pace": 0.3})  # it has its own now
    assert not cadence.Young("k", RT, (180.0, "g"), clock).recall({"writes": [], "pace": None})
    assert not cadence.Fixed(5).recall(state) and cadence.Fixed(5).state() is None
