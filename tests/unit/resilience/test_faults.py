"""The injector fires a kind at the hook points it declared: a kind declared in this file
alone (no other file edited) passes validation and fires at its hook point, on its rank,
once; a loss fault replaces the loss of its step only."""

from __future__ import annotations

import pytest
import torch

from launcher.config import compose, fault_kinds, validate
from launcher.config.fault_kinds import BEFORE_STEP, LOSS, FaultKind
from launcher.resilience.faults import FaultInjector


def fires_before_its_step(fault: FaultInjector, _, step: int) -> None:
    if step == fault.cfg.step:
        fault.fired_at(step)
        raise RuntimeError(f"flaky_switch at step {step}")


@pytest.fixture
def flaky_switch(monkeypatch):
    monkeypatch.setattr(fault_kinds, "KINDS", dict(fault_kinds.kinds()))
    return fault_kinds.register(FaultKind("flaky_switch", {BEFORE_STEP: fires_before_its_step}))


def config(*overrides: str):
    return compose(["trainer.max_steps=10", *overrides])


def test_a_new_kind_fires_at_its_hook_point_on_its_rank_once(flaky_switch, tmp_path):
    (tmp_path / "logs").mkdir()
    cfg = config("fault.kind=flaky_switch", "fault.step=3", "fault.rank=1")
    section = validate(cfg, 2).fault
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


def test_a_loss_fault_replaces_the_loss_of_its_step_only(tmp_path):
    (tmp_path / "logs").mkdir()
    section = validate(config("fault.kind=nonfinite", "fault.step=2"), 1).fault
    fault = FaultInjector(section, rank=0, run_dir=tmp_path)
    assert LOSS in fault_kinds.kinds()["nonfinite"].hooks
    one = torch.tensor(1.0)
    assert fault.poison(1, one) is one
    assert torch.isnan(fault.poison(2, one))
    fault.end_step(2)
    assert fault.poison(2, one) is one  # disarmed after its step
