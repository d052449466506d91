"""One decision for every rank, made on rank 0 (what to resume, whether the run directory
is free, opening the run's files): the others wait for its outcome, and a failure there
ends every rank alike instead of leaving them waiting for a broadcast that never comes."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from launcher.config import ConfigError
from launcher.resilience import first_failure
from launcher.runtime.process import Runtime

T = TypeVar("T")


def decide_on_main(rt: Runtime, decide: Callable[[], T]) -> T:
    """Run `decide()` on rank 0 only and give every rank its result; a ConfigError raised
    there is raised on every rank (rank 0 then prints the one line), anything else ends
    every rank rather than leave the others waiting for a broadcast that never comes."""
    outcome = ("ok", None)
    if rt.is_main:
        try:
            outcome = ("ok", decide())
        except ConfigError as exc:
            outcome = ("bad", str(exc))
        except Exception as exc:
            # recorded first: the others, raising on this, find rank 0 was the first to fail
            first_failure.record(None, first_failure.one_line(exc))
            rt.broadcast_object(("crash", f"{type(exc).__name__} on rank 0: {exc}"))
            raise
    kind, value = rt.broadcast_object(outcome)
    if kind == "bad":
        raise ConfigError(value)
    if kind == "crash":
        raise RuntimeError(value)
    return value
