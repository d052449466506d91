"""The documented range of every numeric config key, checked before anything starts.

The schema only knows types: `model.n_head=0` or `trainer.lr=nan` compose fine and then fail
deep inside the trainer, after the process group exists. A `Range` gives each numeric key
(int, float, or a list of them) the values the trainer can use, declared beside its default
in the schema's dataclass (`ranged`); `range_problems` names every key outside its range.
A test walks the schema (`numeric_keys`) and fails when a numeric key has no range, so a new
key cannot skip it. Rules that tie two keys
together (divisible, within `model.n_positions`) are in `launcher.config.validate`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf
from omegaconf.nodes import AnyNode, FloatNode, IntegerNode


@dataclass(frozen=True)
class Range:
    """Allowed values: `low`/`high` (None: unbounded), each end included unless `*_open`.
    Floats must also be finite. `why` follows the rule in the error line."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    why: str = ""

    def holds(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if self.low is not None and not (value > self.low if self.low_open else value >= self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def rule(self) -> str:
        """The range in words, as docs/configuration.md lists it."""
        lo, hi = _num(self.low), _num(self.high)
        if self.high is None:
            if self.low_open:
                return f"greater than {lo}"
            return "0 or more" if self.low == 0 else f"at least {lo}"
        if isinstance(self.low, int) and isinstance(self.high, int) and not self.low_open:
            return f"within {lo}..{hi}"
        return f"within {'(' if self.low_open else '['}{lo}, {hi}{')' if self.high_open else ']'}"


def _num(value: float | None) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


AT_LEAST_1 = Range(low=1)
NON_NEGATIVE = Range(low=0)
POSITIVE = Range(low=0.0, low_open=True)
FRACTION = Range(low=0.0, high=1.0)
BELOW_1 = Range(low=0.0, high=1.0, high_open=True)

RANGE = "range"  # the dataclass field metadata key that holds a key's Range


def ranged(default: Any = MISSING, allowed: Range | None = None, *, factory=None) -> Any:
    """A schema field whose documented range sits beside its default: `n_head: int =
    ranged(MISSING, AT_LEAST_1)`; `factory` for a list default. A null value is always
    allowed where the field's type allows null."""
    if factory is not None:
        return field(default_factory=factory, metadata={RANGE: allowed})
    return field(default=default, metadata={RANGE: allowed})


CHOICES = "choices"  # the dataclass field metadata key that holds a string key's values


def one_of(default: str, choices: tuple[str, ...] | Callable[[], tuple[str, ...]]) -> Any:
    """A schema field whose allowed values sit beside its default: `precision: str =
    one_of("fp32", PRECISIONS)`; anything else is refused by name before start. `choices`
    may be a function, read when checked: the values of a registry that grows."""
    return field(default=default, metadata={CHOICES: choices})


def choices_of(schema: type, prefix: str = "") -> dict[str, tuple[str, ...]]:
    """`prefix.key` -> its values for every `one_of` field of a schema, nested sections too."""
    found = _walk(schema, prefix, CHOICES)
    return {key: values() if callable(values) else values for key, values in found.items()}


def ranges_of(schema: type, prefix: str = "") -> dict[str, Range]:
    """`prefix.key` -> Range for every ranged field of a schema dataclass, nested sections
    (a field whose default is a dataclass) included."""
    return _walk(schema, prefix, RANGE)


def _walk(schema: type, prefix: str, key: str) -> dict[str, Any]:
    found = {}
    for f in fields(schema):
        if f.metadata.get(key) is not None:
            found[f"{prefix}{f.name}"] = f.metadata[key]
        elif is_dataclass(f.default_factory):
            found.update(_walk(f.default_factory, f"{prefix}{f.name}.", key))
    return found


_ABSENT = object()


def range_problems(cfg: DictConfig, ranges: dict[str, Range]) -> list[str]:
    """The error line of every key of `ranges` outside its range, in the order of `ranges`."""
    found = []
    for key, allowed in ranges.items():
        value = OmegaConf.select(cfg, key, default=_ABSENT)
        if value is _ABSENT or value is None:
            continue
        values = list(value) if isinstance(value, ListConfig) else [value]
        # A word in a key typed Any (trainer.micro_batch_size=auto) is its own check's.
        bad = next((v for v in values if not isinstance(v, str) and not allowed.holds(v)), _ABSENT)
        if bad is _ABSENT:
            continue
        shown = f"{key}={list(value)}" if isinstance(value, ListConfig) else f"{key}={value}"
        finite = "a finite number " if isinstance(bad, float) and not math.isfinite(bad) else ""
        why = f" ({allowed.why})" if allowed.why else ""
        found.append(f"{shown}: must be {finite}{allowed.rule()}{why}")
    return found


def numeric_keys(schema: DictConfig, prefix: str = "") -> list[str]:
    """Every key of a structured config whose type is int or float, or a list of them, or
    Any with a number or null as its default (trainer.micro_batch_size: a number, or auto;
    trainer.memory_checkpoint_interval: a number, auto, or null)."""
    keys = []
    for key in schema:
        node = schema._get_node(key)
        path = f"{prefix}{key}"
        numeric_list = isinstance(node, ListConfig) and node._metadata.element_type in (int, float)
        numeric_any = isinstance(node, AnyNode) and type(node._value()) in (int, float, type(None))
        if isinstance(node, (IntegerNode, FloatNode)) or numeric_list or numeric_any:
            keys.append(path)
        elif isinstance(node, DictConfig):
            keys += numeric_keys(node, f"{path}.")
    return keys
