"""The fault kinds are a registry: a kind declared here alone (no other file edited) is a
value of `fault.kind` that validation accepts with its own rules; an undeclared one is
refused by name; the schema's choices are the registry's kinds."""

from __future__ import annotations

import pytest

from launcher.config import ConfigError, compose, fault_kinds, validate
from launcher.config.fault_kinds import AT_ITS_RANK_AND_STEP, BEFORE_STEP, FaultKind
from launcher.config.schema import all_choices


def seconds_below_one_minute(f, world_size: int, max_steps: int) -> str | None:
    return None if f.seconds < 60 else f"fault.seconds={f.seconds}: flaky_switch needs < 60"


@pytest.fixture
def flaky_switch(monkeypatch):
    """A new kind, its hook point and rules declared in one place; gone after the test."""
    monkeypatch.setattr(fault_kinds, "KINDS", dict(fault_kinds.kinds()))
    hooks = {BEFORE_STEP: lambda fault, _, step: None}
    rules = (*AT_ITS_RANK_AND_STEP, seconds_below_one_minute)
    return fault_kinds.register(FaultKind("flaky_switch", hooks, rules=rules))


def config(*overrides: str):
    return compose(["trainer.max_steps=10", *overrides])


def test_a_new_kind_is_accepted_by_validation_with_its_own_rules(flaky_switch):
    checked = validate(config("fault.kind=flaky_switch", "fault.step=3", "fault.seconds=5"), 2)
    assert checked.fault.kind == "flaky_switch"
    with pytest.raises(ConfigError, match="fault.seconds=90.0: flaky_switch needs < 60"):
        validate(config("fault.kind=flaky_switch", "fault.seconds=90"), 2)
    with pytest.raises(ConfigError, match="fault.step=11: the fault would never fire"):
        validate(config("fault.kind=flaky_switch", "fault.step=11", "fault.seconds=5"), 2)


def test_an_undeclared_kind_is_refused_by_name():
    with pytest.raises(ConfigError, match="fault.kind"):
        validate(config("fault.kind=flaky_switch"), 2)


def test_the_choices_of_fault_kind_are_the_registry():
    assert all_choices()["fault.kind"] == tuple(fault_kinds.kinds())
    assert {"none", "stall", "sigstop", "exit", "oom", "loader_error", "slow", "slow_data",
            "nonfinite", "slow_device", "slow_phase",
            "device_error"} == set(fault_kinds.kinds())  # fmt: skip
