"""The engines a run can name (`strategy=<name>`), and everything the rest of the launcher
may know about one: each engine declares it in its own package as an `Engine`, and nothing
outside `launcher/strategy/` compares an engine's name.

Every engine, the built-in `ddp`, `deepspeed` and `fsdp2` too, is an entry point of the
`launcher.engines` group naming a module whose `ENGINE` is an `Engine` (the built-in ones in
the launcher's pyproject.toml; another package adds one in its own, with no edit to the
launcher: docs/architecture.md, "Adding an engine").

The registry is config's: the schema registers each engine's config as a `strategy` option
and the rules read what each engine allows, while the engines (launcher.strategy, a higher
layer) import this module for `Engine`, `Format` and `StrategyConfig`. The registry reads
the entry-point group and names no engine (launcher.config.plugins), so config stays below
the engines at run time too (docs/architecture.md, "The layers"), and an engine's own
imports (DeepSpeed) happen only when a run chooses it.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from launcher.config import plugins

ENTRY_POINTS = "launcher.engines"


@dataclass
class StrategyConfig:
    """What every engine's config has. Each engine's schema extends it and is registered as
    that option's schema (`conf/strategy/<engine>.yaml` names `<engine>_schema` first), so a key
    of another engine is an unknown key, not a setting silently ignored."""

    name: str = MISSING
    # Time gradient communication per step (comm/allreduce_s, comm/exposed_s, ...); false:
    # the engine's own collectives untimed (DDP: its built-in C++ all-reduce), no comm figures.
    time_comm: bool = True


@dataclass(frozen=True)
class Format:
    """A checkpoint layout on disk, declared by the engine that writes it.

    `marker` is the file that tells the layout apart (a step folder holding it is in this
    format). `reader` names a module with `load_into(folder, model, optimizer)` (the whole
    state into any engine's model and optimizer, sharded or not), `weights(folder)` (the
    model's state dict, for export) and, when a checkpoint must be converted before it is
    loaded (rank 0, under the run directory's lock), `prepare(candidates, now)`.
    """

    name: str
    marker: str
    reader: str

    def module(self):
        return importlib.import_module(self.reader)


def _nothing(*_args, **_kwargs):
    return None


def _no_differences(_saved: dict, _now: dict) -> list[tuple[str, str]]:
    return []


@dataclass(frozen=True)
class Capabilities:
    """What a run of the engine may ask for and what it needs: config.validate judges a
    config by it, preflight checks the machine for it, the job starts the process group."""

    needs_process_group: bool = False  # even a run of one process
    rules: Callable[[Any, int], None] = _nothing  # (cfg, world_size): raises ConfigError
    # (typed cfg, world size): the engine's own config built and judged (raises ConfigError);
    # None: nothing beyond `rules`
    config_check: Callable[[Any, int], None] | None = None
    packages: tuple[tuple[str, str], ...] = ()  # (import name, pip install line)
    device_problem: Callable[[Any, bool], str | None] = _nothing  # (cfg, on_cpu)
    compiles: bool = True  # trainer.compile is allowed
    async_checkpoint: bool = False  # trainer.async_checkpoint is allowed
    drops_steps: bool = False  # Strategy.drop_step: trainer.on_nonfinite=skip|rewind allowed
    # Strategy.zero_grad between micro-steps: trainer.micro_batch_size=auto and
    # trainer.on_oom=retry (the micro-batch changes in-process) allowed
    resizes_micro_batch: bool = False


@dataclass(frozen=True)
class Resume:
    """How the engine's checkpoints resume and are resumed (launcher.checkpoint.resume)."""

    # None: loads every other engine's format its `Format.reader` can read; else the clause
    # that says why it cannot ("DeepSpeed loads no other engine's checkpoint").
    refuses_other_formats: str | None = None
    identity: Callable[[Any], dict] = lambda _cfg: {}  # extra keys meta.json records
    # (saved, now) identity dicts of two checkpoints of this engine: [(what, fix)] that keeps
    # one from being resumed by the other
    own_differences: Callable[[dict, dict], list[tuple[str, str]]] = _no_differences
    resume_with: Callable[[dict], str] | None = None  # saved identity -> overrides; None: name
    # saved identity -> why other engines cannot load it (None: they can)
    unreadable_by_others: Callable[[dict], str | None] = _nothing


@dataclass(frozen=True)
class Plan:
    """What the plan (launcher.plan) computes the engine's run with, per rank at a world
    size: (cfg, parameters, world size) -> bytes of the training state {"weights",
    "grads", "optimizer"} (and "gathered": weights unsharded for a while, where the engine
    shards them); -> bytes each rank writes into one durable checkpoint, rank 0 first, one
    entry per writing rank (DDP: rank 0 alone; sharded engines: all); -> one step's
    gradient and parameter collectives [(op, bytes, times)], op one of all_reduce,
    reduce_scatter, all_gather (bytes: the full buffer, as nccl-tests counts it)."""

    train_state: Callable[[Any, int, int], dict[str, int]]
    checkpoint_writes: Callable[[Any, int, int], list[int]]
    step_collectives: Callable[[Any, int, int], list[tuple[str, int, int]]]
    # (cfg, parameters, world size) -> bytes of the training state one rank keeps in host
    # memory rather than on its device (offload; launcher.plan.host); None: none
    host_state: Callable[[Any, int, int], int] | None = None
    # what the engine's own imports and set-up add to a rank's host memory (measured with
    # benchmarks/host_memory.py; launcher.plan.host)
    host_process_bytes: int = 0


@dataclass(frozen=True)
class Tuning:
    """What the tuner (launcher.tune) may try for the engine."""

    # (cfg) -> [(changes, changes_math)]: what it may try against exposed communication
    candidates: Callable[[Any], list[tuple[dict, bool]]] = lambda _cfg: []
    # The key (MiB) that sizes the engine's gradient buckets, if one does: the tuner tries
    # the sizes the plan's bucket model (launcher.plan.comm.bucket_sizes) predicts best
    bucket_key: str | None = None


@dataclass(frozen=True)
class MemoryCheckpoint:
    """The engine writes the memory tier (trainer.memory_checkpoint_interval) through
    `Strategy.snapshot` (launcher.checkpoint.memory)."""

    # (cfg, the model's parameter count, world size) -> bytes of one rank's memory
    # checkpoint (its shard where the engine shards)
    size: Callable[[Any, int, int], int]
    # that estimate is of state every rank holds alike, which a node's ranks write once
    # between them (launcher.checkpoint.memory.node_share), not once each
    replicated: bool = False


@dataclass(frozen=True)
class Engine:
    """One engine: its config, its strategy and checkpoint format, and the facets it has,
    each read by the one place that needs it (None: the engine has not that facet)."""

    name: str
    schema: type[StrategyConfig]
    strategy: str  # "module:Class" of its launcher.strategy.base.Strategy, built when chosen
    format: Format
    has_yaml: bool = True  # conf/strategy/<name>.yaml exists; else the schema is the option
    capabilities: Capabilities = Capabilities()
    resume: Resume = Resume()
    plan: Plan | None = None
    tuning: Tuning | None = None
    memory_checkpoint: MemoryCheckpoint | None = None

    def overrides_to_resume(self, saved: dict) -> str:
        with_ = self.resume.resume_with
        return with_(saved) if with_ else f"strategy={self.name}"

    def build(self, *args):
        module, _, cls = self.strategy.partition(":")
        return getattr(importlib.import_module(module), cls)(*args)


@functools.cache
def engines() -> dict[str, Engine]:
    """Every engine this installation has, by name: the built-in ones, then other
    packages'. A name declared twice is an error of the installation, said at once."""
    return plugins.by_name(plugins.loaded(ENTRY_POINTS, "ENGINE"), "engine")


def schemas() -> dict[str, type[StrategyConfig]]:
    """`strategy.name` -> its config schema."""
    return {name: e.schema for name, e in engines().items()}


def engine(name: str) -> Engine:
    """The engine `name`; a KeyError names the ones there are."""
    try:
        return engines()[name]
    except KeyError:
        raise KeyError(f"strategy.name={name}: not one of {', '.join(engines())}") from None


def formats() -> dict[str, Format]:
    return {e.format.name: e.format for e in engines().values()}


def format_of(folder: Path) -> Format | None:
    """The format of a step folder, from its marker file (None: none this installation
    knows)."""
    return next((f for f in formats().values() if (Path(folder) / f.marker).is_file()), None)


def build_strategy(s, t, rt, model):
    """The strategy named by `strategy.name`, set up around `model`."""
    return engine(s.name).build(s, t, rt, model)
