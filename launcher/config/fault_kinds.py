"""The fault kinds' registry (`fault.kind`): each kind declares once the hook points where it
fires, on which ranks it is armed, and the rules its `fault` section must keep. The schema's
choices of `fault.kind` and the validation read it; the injector that fires the kinds at
their hook points is launcher.resilience.faults, which declares the built-in kinds.

A module that declares kinds is an entry point of the `launcher.fault_kinds` group (the
built-in ones' in the launcher's pyproject.toml, another package's in its own), loaded when
the registry is first asked, so that this layer names nothing above it and every process of
a launch has the same kinds. A kind of one's own is one `register(FaultKind(...))` in such
a module.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from launcher.config import plugins

ENTRY_POINTS = "launcher.fault_kinds"  # modules that declare kinds when imported

# The hook points: where the job and the loop call the injector (1-based steps).
PHASE = "phase"  # each time a watched phase begins (config.schema.PHASES), every rank
BURN_IN = "burn-in"  # the burn-in gate's device timing: the seconds each matmul takes more
DATA = "data"  # the training loader opens: its windows may be replaced
BEFORE_STEP = "before step"  # inside the timed step, before its first micro-batch
FORWARD = "forward"  # before each forward, with the micro-batch's size
LOSS = "loss"  # each micro-batch's loss, which the hook may replace
AFTER_STEP = "after step"  # the step's micro-batches are done

# hook(injector, value, **context) -> the value the point goes on with (None: unchanged
# where the point carries no value: DATA's windows, LOSS's loss and BURN_IN's seconds do)
Hook = Callable[..., Any]
# rule(fault config, world size, trainer.max_steps) -> the one-line problem, or None
Rule = Callable[[Any, int, int], "str | None"]


def rank_in_job(f, world_size: int, max_steps: int) -> str | None:
    if 0 <= f.rank < world_size:
        return None
    return f"fault.rank={f.rank}: no such rank in a job of {world_size}; give 0..{world_size - 1}"


def step_in_run(f, world_size: int, max_steps: int) -> str | None:
    if 1 <= f.step <= max_steps:
        return None
    return (
        f"fault.step={f.step}: the fault would never fire; give a step within "
        f"1..trainer.max_steps={max_steps}"
    )


# The rules of a fault that fires on rank `fault.rank` at step `fault.step`.
AT_ITS_RANK_AND_STEP: tuple[Rule, ...] = (rank_in_job, step_in_run)


@dataclass(frozen=True)
class FaultKind:
    """One `fault.kind`: what it does at each hook point, on which ranks it is armed, and the
    rules its config must keep (checked with the config, before anything starts)."""

    name: str
    hooks: Mapping[str, Hook] = field(default_factory=dict)
    every_rank: bool = False  # armed on every rank, not on fault.rank alone
    rules: tuple[Rule, ...] = AT_ITS_RANK_AND_STEP
    # whether a config makes it a lasting condition, which `fault.once` does not end
    lasting: Callable[[Any], bool] = lambda f: False


KINDS: dict[str, FaultKind] = {}


def register(kind: FaultKind) -> FaultKind:
    """Declare a fault kind: `fault.kind=<name>` is then accepted and fires at its hooks."""
    KINDS[kind.name] = kind
    return kind


@functools.cache
def _declared() -> None:
    for ep in plugins.declared(ENTRY_POINTS):
        ep.load()


def kinds() -> dict[str, FaultKind]:
    """Every declared kind by name, the built-in ones first."""
    _declared()
    return KINDS


def kind_names() -> tuple[str, ...]:
    """The values `fault.kind` takes (the schema's choices)."""
    return tuple(kinds())


def fault_problem(f, world_size: int, max_steps: int) -> str | None:
    """The first rule of the chosen kind that the `fault` section breaks, or None."""
    for rule in kinds()[f.kind].rules:
        problem = rule(f, world_size, max_steps)
        if problem:
            return problem
    return None
