"""Composing the config as `launcher.train` would, outside `@hydra.main`, and Hydra's and
OmegaConf's multi-line errors worded as the one line a user sees."""

from __future__ import annotations

import contextlib
import difflib
import functools
import importlib.resources
import re
from dataclasses import fields, is_dataclass
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf

from launcher.config import backends
from launcher.config.errors import ConfigError
from launcher.config.registry import schemas
from launcher.config.schema import CONFIG_MODULE, CONFIG_NAME, TrainConfig, register_schema


def compose(overrides: list[str], sweep: bool = False) -> DictConfig:
    """Compose the training config as `launcher.train` would, raising `ConfigError`.

    Used by the front doors that do not run under `@hydra.main` (doctor, submit) and by
    `launcher.train` to check the overrides before Hydra starts any job. `sweep=True`
    composes as Hydra's multirun does (sweep values such as `key=a,b` are accepted) and
    keeps the `hydra` node, whose `mode` and `sweeper.params` say what a sweep will run.
    """
    from hydra import compose as hydra_compose
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    refuse_schema_options(overrides)
    refuse_wrong_forms(overrides)
    try:
        with config_loader():
            if not sweep:
                return hydra_compose(config_name=CONFIG_NAME, overrides=overrides)
            return GlobalHydra.instance().hydra.compose_config(
                config_name=CONFIG_NAME,
                overrides=overrides,
                run_mode=RunMode.MULTIRUN,
                validate_sweep_overrides=False,
            )
    except Exception as exc:  # noqa: BLE001 - every composition failure becomes one line
        raise ConfigError(describe_compose_error(exc)) from exc


def compose_problems(overrides: list[str]) -> tuple[list[str], list[str]]:
    """(every override composition refuses, one line each; the overrides it accepts):
    launcher.doctor lists them all where a launch stops at the first. Each override is added
    to the ones accepted before it, in the order given, so that a key of a chosen option
    (strategy=deepspeed, then strategy.zero_stage) is judged with its option. (Each try
    stands alone, outside the handler of another: an error is described from its causes.)"""
    first = _compose_problem(overrides)
    if first is None:
        return [], list(overrides)
    found, accepted = [], []
    for override in overrides:
        problem = _compose_problem([*accepted, override])
        if problem is None:
            accepted.append(override)
        else:
            found.append(problem)
    return (found, accepted) if found else ([first], [])


def _compose_problem(overrides: list[str]) -> str | None:
    try:
        compose(overrides)
    except ConfigError as exc:
        return str(exc)
    return None


def refuse_schema_options(overrides: list[str]) -> None:
    """`strategy=ddp_schema` names the typed schema an option file starts from (registered in
    the same group, so Hydra would compose it), not an engine option: one line instead."""
    for text in overrides:
        key, _, value = text.partition("=")
        if key.lstrip("+~") != "strategy":
            continue
        schemas = [v.strip() for v in value.strip("[]").split(",") if v.strip().endswith("_schema")]
        if schemas:
            raise ConfigError(
                f"strategy={schemas[0]}: a schema the options are checked against, not an "
                f"option; choose {schemas[0].removesuffix('_schema')} (python -m launcher.train "
                "--help lists the options)"
            )


@functools.cache
def config_groups() -> frozenset[str]:
    """The config groups of launcher.conf (model, data, strategy, ..., exp)."""
    conf = importlib.resources.files("launcher.conf")
    return frozenset(p.name for p in conf.iterdir() if p.is_dir() and not p.name.startswith("_"))


@functools.cache
def default_groups() -> frozenset[str]:
    """The groups train.yaml chooses an option of (`group=option` changes the choice); the
    others (`exp`) are added with a `+`."""
    text = importlib.resources.files("launcher.conf").joinpath(f"{CONFIG_NAME}.yaml").read_text()
    entries = yaml.safe_load(text).get("defaults", [])
    chosen = {k for e in entries if isinstance(e, dict) for k in e if not k.startswith("override")}
    return frozenset(chosen & config_groups())


HELP = "python -m launcher.train --help shows each form"


def wrong_form_problem(text: str) -> str | None:
    """The one line for an override written in the wrong form (`exp=profile` for
    `+exp=profile`, `+model=gpt2` for `model=gpt2`, a key without `=`, a flag's dashes), or
    None: the forms a user types are `+exp=NAME`, `group=option` and `key=value`."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType
    from hydra.errors import HydraException

    key = text.partition("=")[0]
    if text.startswith("-"):
        bare = text.lstrip("-")
        return (f"{text}: not a flag this command takes; an override is written without dashes"
                f"{f': {bare}' if '=' in bare else ''} ({HELP})")  # fmt: skip
    if "=" not in text and not text.startswith("~"):
        if ":" in text:
            what = text.replace(":", "=", 1)
        else:
            what = f"{text}=<option>" if text in config_groups() else f"{text}=<value>"
        return f"{text}: an override is key=value; write {what} ({HELP})"
    if not key.lstrip("+~"):
        return f"{text}: the key before = is missing ({HELP})"
    try:
        (override,) = OverridesParser.create().parse_overrides([text])
    except HydraException:
        return None  # the parser's own line says where the syntax breaks
    name, kind = override.key_or_group, override.type
    if name in config_groups() and name not in default_groups():
        if kind == OverrideType.CHANGE:
            return f"{text}: an experiment is added, with a +: write +{text} ({HELP})"
    elif name in default_groups():
        fix = f"{name}=<option>"
        if override.value() and not override.is_sweep_override():
            fix = f"{name}={override.get_value_element_as_str()}"
        if kind in (OverrideType.ADD, OverrideType.FORCE_ADD):
            return (f"{text}: {name} is a group every run has one option of; choose another with "
                    f"{fix}, without the + ({HELP})")  # fmt: skip
        if kind == OverrideType.DEL:
            return (f"{text}: every run needs a {name}; choose another option with "
                    f"{name}=<option> instead of removing it ({HELP})")  # fmt: skip
    elif kind == OverrideType.DEL and "." not in name and _schema_node(name) is not None:
        return f"{text}: {name} cannot be removed; set its keys instead ({name}.<key>=<value>)"
    return None


def refuse_wrong_forms(overrides: list[str]) -> None:
    """One line for the first override in a wrong form (see wrong_form_problem); `~exp`
    without an `+exp=` to remove too."""
    for text in overrides:
        problem = wrong_form_problem(text)
        added = [g for g in config_groups() - default_groups() if text == f"~{g}"]
        if added and not any(o.startswith(f"+{added[0]}=") for o in overrides):
            problem = f"{text}: no {added[0]} was added (+{added[0]}=NAME), so none can be removed"
        if problem:
            raise ConfigError(problem)


@contextlib.contextmanager
def config_loader():
    """Hydra initialised over the launcher's config module, and its config loader (what
    composes, and what knows a group's options: a sweep's `glob(...)`); cleared after."""
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    register_schema()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
            yield GlobalHydra.instance().hydra.config_loader
    finally:
        GlobalHydra.instance().clear()


def friendly_overrides(overrides: list[str]) -> list[str]:
    """The overrides with a single value given to a list key made a one-element list.

    `data.paths=/data/*.txt` means `data.paths=[/data/*.txt]`; the schema would refuse the
    string. Sweeps (`key=a,b`) and anything that does not parse are left as they are, for
    Hydra to judge. The entry points apply this to the command line before composing, so
    Hydra's own composition of each job sees the same overrides.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType, ValueType
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    out = []
    for text in overrides:
        try:
            (override,) = parser.parse_overrides([text])
        except HydraException:
            out.append(text)
            continue
        value = override.value() if override.value_type == ValueType.ELEMENT else None
        wrap = (
            override.type in (OverrideType.CHANGE, OverrideType.ADD, OverrideType.FORCE_ADD)
            and value is not None
            and not isinstance(value, (list, dict))
            and isinstance(_schema_node(override.key_or_group), ListConfig)
        )
        prefix = text[: len(text) - len(text.lstrip("+~"))]
        element = override.get_value_element_as_str() if wrap else ""
        out.append(f"{prefix}{override.key_or_group}=[{element}]" if wrap else text)
    return out


@functools.cache
def _schema_tree(schema: type) -> DictConfig:
    """A schema dataclass as an OmegaConf tree: built once a process (the root's takes a
    tenth of a second, and friendly_overrides reads it for every override), read only."""
    return OmegaConf.structured(schema)


def _schema_node(key: str) -> Any:
    """The schema's node at a dotted key (engine keys looked up in every engine, an added
    backend's in its section), or None."""
    head, _, rest = key.partition(".")
    if head == "strategy" and rest:
        engines = map(_schema_tree, schemas().values())
        nodes = (e._get_node(rest, validate_access=False) for e in engines)
        return next((n for n in nodes if n is not None), None)
    section, _, inner = rest.partition(".")
    added = {b.name: b.schema for b in backends.added() if b.schema}
    if head == "cluster" and section in added and inner:
        return _schema_tree(added[section])._get_node(inner, validate_access=False)
    parent, _, leaf = key.rpartition(".")
    root = _schema_tree(TrainConfig)
    holder = OmegaConf.select(root, parent, default=None) if parent else root
    return holder._get_node(leaf, validate_access=False) if isinstance(holder, DictConfig) else None


def describe_compose_error(exc: BaseException) -> str:
    """Turn Hydra's and OmegaConf's multi-line errors into one line naming key and fix."""
    from hydra.errors import MissingConfigException
    from omegaconf.errors import (
        ConfigAttributeError,
        ConfigKeyError,
        OmegaConfBaseException,
        ValidationError,
    )

    chain: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in chain:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    for err in chain:
        if isinstance(err, MissingConfigException):
            group = (err.missing_cfg_file or "").split("/")[0]
            options = ", ".join(sorted(err.options or []))
            wanted = (err.missing_cfg_file or "").split("/")[-1]
            if options:
                return f"{group}={wanted}: no such option; choose one of: {options}"
            return f"{err.missing_cfg_file}: config not found"
    for err in chain:
        if isinstance(err, (ConfigKeyError, ConfigAttributeError)):
            key = str(err.full_key or getattr(err, "key", "?"))
            return unknown_key_line(key, err.object_type, "check the spelling, or see")
        if isinstance(err, ValidationError):
            key = err.full_key or "?"
            if isinstance(_schema_node(key), ListConfig):
                return (
                    f"{key}: a list is expected; write {key}='[{err.value}]' "
                    f"(quoted, so the shell keeps the brackets), or [a,b] for several"
                )
            first = str(err.msg).splitlines()[0]
            return f"{key}: {first}; give a value of the right type"
        if isinstance(err, OmegaConfBaseException) and getattr(err, "full_key", None):
            return f"{err.full_key}: {str(err.msg).splitlines()[0]}"
    text = " ".join(str(exc).split())
    added = re.search(r"An item is already at '([^']+)'\. Either remove \+ prefix: '([^']+)'", text)
    if added:
        key, fixed = added.groups()
        return f"+{fixed}: {key} exists already; write {fixed}, without the + ({HELP})"
    return f"bad override: {text}"


def unknown_key_line(key: str, parent_type: Any, advice: str = "see") -> str:
    """`<key>: unknown key` with the closest keys of its parent's schema, and, for a key of
    another engine than the chosen one, which engine has it."""
    parent, _, leaf = key.rpartition(".")
    known = [f.name for f in fields(parent_type)] if is_dataclass(parent_type) else []
    close = difflib.get_close_matches(leaf, known, n=3)
    hint = f" (did you mean {', '.join(f'{parent}.{c}' if parent else c for c in close)}?)"
    hint = hint if close else ""
    if parent == "strategy" and is_dataclass(parent_type):
        chosen = next((n for n, s in schemas().items() if s is parent_type), "?")
        owners = [n for n, s in schemas().items() if leaf in {f.name for f in fields(s)}]
        if owners:
            hint = (
                f" for strategy={chosen}: it is a key of strategy={'/'.join(owners)}, "
                f"which this engine does not read"
            )
    return f"{key}: unknown key{hint}; {advice} docs/configuration.md"
