"""Every knob has its row in the knob matrix (tests/knob_rows.py), and every refusal row is
refused, in process: no launches.

The knobs come from the schema itself: every field of the matrix's groups whose default is
a bool or whose type admits one (a switch: the other value needs a row), and every string
key that the validator refuses a made-up value for with "not one of" (its choices, read
from that line: each one but the default needs a row). A key added to the schema, or a
choice added to the validator, without a row fails here.
"""

from __future__ import annotations

import re
from dataclasses import MISSING, fields

import pytest
from omegaconf import OmegaConf

from launcher.config import ConfigError, compose, normalize, validate
from launcher.config.registry import schemas
from launcher.config.schema import TrainConfig
from launcher.preflight import preflight
from launcher.strategy.deepspeed import cpu_has_fp16

from knob_rows import BASE, ENGINE_FREE, GROUPS, ROWS
from knob_rows import ENGINES as MATRIX_ENGINES
from launch import FAST_USER_LOADER

BOGUS = "zz-not-a-choice"
# Where a choice is judged only in a context: data.dtype with the sources that read it.
CONTEXTS = {"data.dtype": ["data=synthetic"]}


def _default(f):
    if f.default is not MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not MISSING else MISSING


def _schemas(engine: str):
    """(prefix, dataclass) of the matrix's groups with `engine` as the strategy."""
    groups = {f.name: f.default_factory for f in fields(TrainConfig)}
    for group in GROUPS:
        yield group, schemas()[engine] if group == "strategy" else groups[group]


def defaults(engine: str, *overrides: str):
    """The defaults the matrix starts from, their spelled-out defaults resolved."""
    cfg = compose([f"strategy={engine}", *overrides])
    normalize(cfg, 2)
    return cfg


def switches(engine: str) -> set[tuple[str, object]]:
    """(key, each value but the default) of every boolean field (a null default: both)."""
    base, out = defaults(engine), set()
    for prefix, schema in _schemas(engine):
        for f in fields(schema):
            if isinstance(_default(f), bool) or "bool" in str(f.type):
                key = f"{prefix}.{f.name}"
                out |= {(key, v) for v in (True, False) if v != OmegaConf.select(base, key)}
    return out


def choices(engine: str) -> set[tuple[str, object]]:
    """(key, choice) of every string key the validator checks against a list, but the
    default: found by giving each string field a made-up value."""
    base, out = defaults(engine), set()
    for prefix, schema in _schemas(engine):
        for f in fields(schema):
            key = f"{prefix}.{f.name}"
            if f.type not in ("str", "str | None") or key == "strategy.name":
                continue  # strategy.name is the engine: the matrix's other axis
            cfg = defaults(engine, *CONTEXTS[key]) if key in CONTEXTS else base.copy()
            OmegaConf.update(cfg, key, BOGUS)
            try:
                validate(cfg, 2)
            except ConfigError as exc:
                found = re.search(rf"{re.escape(key)}={BOGUS}: not one of (.+)$", str(exc))
                if found:
                    values = [v.strip() for v in found.group(1).split(",")]
                    out |= {(key, v) for v in values if v != OmegaConf.select(base, key)}
    return out


def parsed(override: str) -> tuple[str, object]:
    key, _, value = override.partition("=")
    return key, {"true": True, "false": False}.get(value, value)


def covered(engine: str) -> set[tuple[str, object]]:
    """The knob values the engine's matrix launches: its rows', and the base's (its
    reference point runs them: run.report=false)."""
    base = {parsed(o) for o in [*FAST_USER_LOADER, *BASE]}
    return base | {parsed(o) for r in ROWS if engine in r.engines for o in r.overrides}


def engine_free() -> set[tuple[str, object]]:
    """The engine-free knobs some row covers on any engine."""
    return {k for e in MATRIX_ENGINES for k in covered(e) if k[0] in ENGINE_FREE}


@pytest.mark.parametrize("engine", MATRIX_ENGINES)
def test_every_switch_and_choice_has_a_row(engine):
    knobs = switches(engine) | choices(engine)
    # What the schema says must be found, so that the derivation itself can fail.
    assert ("strategy.time_comm", False) in knobs and ("trainer.precision", "bf16") in knobs
    assert ("model.attention", "math") in knobs and ("data.source", "memmap") in knobs
    missing = sorted(knobs - covered(engine) - engine_free(), key=str)
    assert {k for k in knobs if k[0] in ENGINE_FREE} <= engine_free()
    assert not missing, f"knobs without a row in tests/knob_rows.py for {engine}: {missing}"


def test_rows_are_well_formed():
    names = [r.name for r in ROWS]
    assert len(names) == len(set(names))
    for r in ROWS:
        assert r.expect in ("equal", "finite", "refused"), r.name
        assert set(r.engines) <= set(MATRIX_ENGINES) and r.why, r.name
        assert bool(r.refusal) == (r.expect == "refused"), r.name
        assert r.expect != "finite" or r.rel > 0, f"{r.name}: a finite row states its tolerance"


REFUSED = [(r, e) for r in ROWS if r.expect == "refused" for e in r.engines]


@pytest.mark.parametrize("r,engine", REFUSED, ids=lambda x: getattr(x, "name", x))
def test_refused_before_start_in_one_line(r, engine, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", "/nonexistent")
    if r.name == "fp16_deepspeed" and cpu_has_fp16():
        pytest.skip("needs a CUDA GPU or a CPU without fp16 to refuse it")
    cfg = compose([f"strategy={engine}", *r.overrides])
    with pytest.raises(ConfigError) as exc:
        preflight(cfg, 2, 2)
    line = str(exc.value)
    assert r.refusal.format(engine=engine) in line and "\n" not in line, line
