"""The fault kinds are a registry: a kind declared here alone (no other file edited) is a
value of `fault.kind` that validation accepts with its own rules, and it fires at the hook
point it declared, on its rank, once."""

from __future__ import annotations

import pytest
import torch

from launcher.config import ConfigError, compose, typed, validate
from launcher.resilience import faults
from launcher.resilience.faults import BEFORE_STEP, LOSS, FaultInjector, FaultKind


def fires_before_its_step(fault: FaultInjector, _, step: int) -> None:
    if step == fault.cfg.step:
        fault.fired_at(step)
        raise RuntimeError(f"flaky_switch at step {step}")


def seconds_below_one_minute(f, world_size: int, max_steps: int) -> str | None:
    return None if f.seconds < 60 else f"fault.seconds={f.seconds}: flaky_switch needs < 60"


@pytest.fixture
def flaky_switch(monkeypatch):
    """A new kind, its hook point and rules declared in one place; gone after the test."""
    monkeypatch.setattr(faults, "KINDS", dict(faults.KINDS))
    return faults.register(
        FaultKind(
            "flaky_switch",
            {BEFORE_STEP: fires_before_its_step},
            rules=(*faults.AT_ITS_RANK_AND_STEP, seconds_below_one_minute),
        )
    )


def config(*overrides: str):
    return compose(["trainer.max_steps=10", *overrides])


def test_a_new_kind_is_accepted_by_validation_with_its_own_rules(flaky_switch):
    validate(config("fault.kind=flaky_switch", "fault.step=3", "fault.seconds=5"), 2)
    with pytest.raises(ConfigError, match="fault.seconds=90.0: flaky_switch needs < 60"):
        validate(config("fault.kind=flaky_switch", "fault.seconds=90"), 2)
    with pytest.raises(ConfigError, match="fault.step=11: the fault would never fire"):
        validate(config("fault.kind=flaky_switch", "fault.step=11", "fault.seconds=5"), 2)


def test_an_undeclared_kind_is_refused_by_name():
    with pytest.raises(ConfigError, match="fault.kind"):
        validate(config("fault.kind=flaky_switch"), 2)


def test_a_new_kind_fires_at_its_hook_point_on_its_rank_once(flaky_switch, tmp_path):
    (tmp_path / "logs").mkdir()
    cfg = config("fault.kind=flaky_switch", "fault.step=3", "fault.rank=1", "fault.seconds=5")
    validate(cfg, 2)
    section = typed(cfg).fault
    mine = FaultInjector(section, rank=1, run_dir=tmp_path)
    FaultInjector(section, rank=0, run_dir=tmp_path).before_step(3)  # not its rank
    mine.before_step(2)
    loss = torch.tensor(1.0)
    assert mine.poison(3, loss) is loss  # a hook point it did not declare: unchanged
    with pytest.raises(RuntimeError, match="flaky_switch at step 3"):
        mine.before_step(3)
    mine.before_step(3)  # fired: disarmed
    assert (tmp_path / "logs" / "fault.rank1").read_text() == "flaky_switch at step 3\n"
    # the next attempt (fault.once) finds the marker and does not fire again
    FaultInjector(section, rank=1, run_dir=tmp_path).before_step(3)


def test_the_choices_of_fault_kind_are_the_registry():
    from launcher.config.schema import all_choices

    assert all_choices()["fault.kind"] == tuple(faults.KINDS)
    assert {"none", "stall", "sigstop", "exit", "oom", "loader_error", "slow", "slow_data",
            "nonfinite", "slow_device", "slow_phase"} == set(faults.KINDS)  # fmt: skip


def test_a_loss_fault_replaces_the_loss_of_its_step_only(tmp_path):
    (tmp_path / "logs").mkdir()
    cfg = config("fault.kind=nonfinite", "fault.step=2")
    fault = FaultInjector(typed(cfg).fault, rank=0, run_dir=tmp_path)
    assert LOSS in faults.KINDS["nonfinite"].hooks
    one = torch.tensor(1.0)
    assert fault.poison(1, one) is one
    assert torch.isnan(fault.poison(2, one))
    fault.end_step(2)
    assert fault.poison(2, one) is one  # disarmed after its step
