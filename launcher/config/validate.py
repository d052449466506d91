"""The semantic check of a composed config, judged alone (no machine, no files, no other
layer): values with a spelled-out default resolved (`normalize`), then every value and
combination that cannot run refused (`validate`), naming the key path. What needs the
machine, the files or an engine's own config is launcher.preflight's.
"""

from __future__ import annotations

import os
from dataclasses import fields, is_dataclass

from omegaconf import DictConfig, OmegaConf

from launcher.config.batch import AUTO, BatchPlan, micro_batch_problem
from launcher.config.compose import unknown_key_line
from launcher.config.errors import ConfigError, check_choice
from launcher.config.fault_kinds import fault_problem
from launcher.config.ranges import range_problems
from launcher.config.registry import engine, engines, schemas
from launcher.config.schema import (
    DataConfig,
    ModelConfig,
    ProfilerConfig,
    TrainConfig,
    WatchdogConfig,
    all_choices,
    all_ranges,
    typed,
)

_ABSENT = object()


def normalize(cfg: DictConfig, world_size: int) -> None:
    """Resolve the values that have a spelled-out default.

    YAML's boolean spellings of `trainer.compile` (off/on/true/false) become modes, a
    null `trainer.global_batch_size` becomes one micro-batch per rank (no accumulation),
    a null `data.persistent_workers` follows `data.num_workers` (workers kept when
    there are any), and a null `burnin.enabled` follows the cluster (on for slurm and k8s).
    """
    mode = str(cfg.trainer.compile).lower()
    cfg.trainer.compile = {"false": "off", "none": "off", "true": "default", "on": "default"}.get(
        mode, mode
    )
    if cfg.trainer.global_batch_size is None and isinstance(cfg.trainer.micro_batch_size, int):
        cfg.trainer.global_batch_size = cfg.trainer.micro_batch_size * world_size
    if cfg.data.persistent_workers is None and isinstance(cfg.data.num_workers, int):
        cfg.data.persistent_workers = cfg.data.num_workers > 0
    if cfg.burnin.enabled is None:  # the submitted job's config carries cluster=slurm/k8s
        cfg.burnin.enabled = cfg.cluster.name != "local"
    if cfg.strategy.get("powersgd_warmup_steps", 0) is None:
        cfg.strategy.powersgd_warmup_steps = cfg.trainer.warmup_steps


def _validate_model_bias(m: ModelConfig) -> None:
    """Biases can be left out of the native GPT-2 only: transformers' has them always, and
    so do the weights model.init_from loads."""
    if m.bias:
        return
    if m.impl == "hf":
        raise ConfigError("model.bias=false needs model.impl=native (GPT2LMHeadModel has biases)")
    if m.init_from:
        raise ConfigError(
            f"model.bias=false with model.init_from={m.init_from}: GPT-2 weights have biases; "
            "use model.bias=true"
        )


# A file name's limit in bytes on Linux's file systems (ext4, xfs, btrfs, tmpfs, NFS).
NAME_MAX = 255


def run_id_problem(run_id, key: str = "run.id") -> str | None:
    """Why `run.id` (or `$LAUNCHER_RUN_ID`, its stand-in when unset: `key` names which)
    cannot name a folder directly under `run.root`, or None.

    The id is the run directory's name: a separator or `..` would put the run (and its
    resume) outside run.root or inside another run, and a name past the file system's
    limit fails only when the directory is made, with a traceback."""
    if run_id is None:
        return None
    name = str(run_id)
    size = len(name.encode("utf-8", errors="surrogateescape"))
    if not name.strip() or name in (".", ".."):
        why = "is empty" if not name.strip() else f"is {name!r}"
    elif "/" in name or "\\" in name:
        why = "holds a path separator (it names one folder directly under run.root)"
    elif any(not ch.isprintable() for ch in name):
        bad = next(ch for ch in name if not ch.isprintable())
        why = f"holds the control character {bad!r} (a newline, a tab, ...)"
    elif size > NAME_MAX:
        why = f"is {size} bytes long, past the file system's limit of {NAME_MAX} for one name"
    else:
        return None
    shown = name if name.isprintable() else ascii(name)  # the error stays one line
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return (
        f"{key}={shown} {why}; choose a plain name (letters, digits, - _ .), and put runs "
        f"elsewhere with run.root"
    )


def validate(cfg: DictConfig, world_size: int) -> TrainConfig:
    """Reject impossible values and combinations before any process group or worker starts;
    the checked config as the schema's dataclasses (`typed`), what the job's parts read.

    Order matters: unknown keys, then every numeric key's range (docs/configuration.md),
    then choices, then the rules that relate keys, so that each later check may assume
    the earlier ones held (no division by a zero `model.n_head`). The first checks read
    the composed config (its keys and nodes); the rules read the typed sections, as the
    job's parts do.
    """
    found = key_problems(cfg, world_size)
    if found:
        raise ConfigError(found[0])
    _validate_engine(cfg)
    checked = typed(cfg)
    _validate_rules(checked, world_size)
    return checked


def check_config(cfg: DictConfig, world_size: int) -> TrainConfig:
    """The config alone (`validate`, which normalises it too), then the engine's own config
    as these keys build it (DeepSpeed's, with `strategy.extra`): what a submission and the
    plan check before anything reaches a cluster. The checked config as the schema's
    dataclasses."""
    checked = validate(cfg, world_size)
    check = engine(checked.strategy.name).capabilities.config_check
    if check is not None:
        check(checked, world_size)  # the dataclasses the strategy will get
    return checked


def key_problems(cfg: DictConfig, world_size: int) -> list[str]:
    """The problems of keys judged each alone, all of them, in validate's order: unknown
    keys, every numeric key's range, the run id, the choices (the config normalised first)."""
    normalize(cfg, world_size)
    found = [*_unknown_keys(cfg, ""), *range_problems(cfg, all_ranges())]
    problem = run_id_problem(cfg.run.id)
    if cfg.run.id is None and os.environ.get("LAUNCHER_RUN_ID"):
        problem = run_id_problem(os.environ["LAUNCHER_RUN_ID"], "LAUNCHER_RUN_ID")
    found += [problem] if problem else []
    for key, allowed in all_choices().items():
        if OmegaConf.select(cfg, key, default=_ABSENT) is not _ABSENT:  # the chosen engine's
            try:
                check_choice(key, OmegaConf.select(cfg, key), allowed)
            except ConfigError as exc:
                found.append(str(exc))
    return found


def problems(cfg: DictConfig, world_size: int) -> list[str]:
    """Every problem `validate` refuses the config for, one line each (launcher.doctor's
    list): each key's own problems, all; the rules that relate keys only when those hold
    (they assume them), the first of them."""
    found = key_problems(cfg, world_size)
    if found:
        return found
    try:
        validate(cfg, world_size)
    except ConfigError as exc:
        return [str(exc)]
    return []


def _validate_rules(cfg: TrainConfig, world_size: int) -> None:
    """The rules that relate keys, within a section and across sections."""
    t, d, m = cfg.trainer, cfg.data, cfg.model
    _validate_model_bias(m)
    problem = micro_batch_problem(t, world_size) or BatchPlan.of(t, world_size).problem()
    if problem:
        raise ConfigError(problem)
    for key in ("checkpoint_interval", "memory_checkpoint_interval"):
        value = getattr(t, key)
        if value != AUTO and (isinstance(value, bool) or not isinstance(value, int | None)):
            shown = {"True": "true", "False": "false"}.get(str(value), value)  # as typed
            raise ConfigError(
                f"trainer.{key}={shown}: give a whole number of steps (0: off) or auto "
                "(Young's interval from the measured cost and trainer.mtbf_h)"
            )
    if None not in (t.mtbf_h, t.memory_loss_mtbf_h) and t.memory_loss_mtbf_h < t.mtbf_h:
        raise ConfigError(
            f"trainer.memory_loss_mtbf_h={t.memory_loss_mtbf_h:g} is below trainer.mtbf_h="
            f"{t.mtbf_h:g}: the failures that lose the memory tier are some of all failures, "
            "so they come no more often; raise it, or leave it null (every failure's)"
        )
    if t.seq_len > m.n_positions:
        raise ConfigError(
            f"trainer.seq_len={t.seq_len} exceeds model.n_positions={m.n_positions}; "
            f"shorten the sequence or raise model.n_positions"
        )
    if m.n_embd % m.n_head:
        raise ConfigError(f"model.n_embd={m.n_embd} is not divisible by model.n_head={m.n_head}")
    if d.num_workers == 0 and d.persistent_workers:
        raise ConfigError(
            "data.persistent_workers=true needs data.num_workers>0; "
            "set data.persistent_workers=false (or leave it null) or add workers"
        )
    _validate_data_source(d)
    _validate_profiler(cfg.profiler, t.max_steps, world_size)
    _validate_watchdog(cfg.watchdog, cfg.dist.timeout_s)
    problem = fault_problem(cfg.fault, world_size, t.max_steps)  # the kind's own rules
    if problem:
        raise ConfigError(problem)
    declared = engine(cfg.strategy.name)
    chosen = declared.capabilities
    if t.async_checkpoint and not chosen.async_checkpoint:
        able = [e.name for e in engines().values() if e.capabilities.async_checkpoint]
        raise ConfigError(
            f"trainer.async_checkpoint=true needs strategy={' or '.join(able)} (an asynchronous "
            f"save); strategy={cfg.strategy.name} writes its checkpoints synchronously"
        )
    if t.memory_checkpoint_interval and declared.memory_checkpoint is None:  # an added engine's
        able = [e.name for e in engines().values() if e.memory_checkpoint is not None]
        raise ConfigError(
            f"trainer.memory_checkpoint_interval={t.memory_checkpoint_interval} needs "
            f"strategy={' or '.join(able)}; strategy={cfg.strategy.name} cannot write the "
            "memory tier yet: set trainer.memory_checkpoint_interval=0 (its durable "
            "checkpoints are kept as before)"
        )
    if t.memory_checkpoint_peer and t.memory_checkpoint_interval == 0:
        raise ConfigError(
            "trainer.memory_checkpoint_peer=true copies the memory tier's checkpoints, but "
            "trainer.memory_checkpoint_interval=0 turns the tier off: give an interval (or "
            "null: 10 under torchrun's restarts), or trainer.memory_checkpoint_peer=false"
        )
    if t.on_nonfinite != "stop" and not chosen.drops_steps:
        able = [e.name for e in engines().values() if e.capabilities.drops_steps]
        raise ConfigError(
            f"trainer.on_nonfinite={t.on_nonfinite} is not supported with "
            f"strategy={cfg.strategy.name} (its engine owns the optimizer step); use "
            f"trainer.on_nonfinite=stop, or strategy={' or '.join(able)}"
        )
    resizing = [f"trainer.{k}={getattr(t, k)}" for k, v in (("micro_batch_size", AUTO),
                ("on_oom", "retry")) if getattr(t, k) == v]  # fmt: skip
    if resizing and not chosen.resizes_micro_batch:
        able = [e.name for e in engines().values() if e.capabilities.resizes_micro_batch]
        raise ConfigError(
            f"{resizing[0]} is not supported with strategy={cfg.strategy.name} (its engine "
            f"cannot abandon a step part-way and redo it at another micro-batch); give "
            f"trainer.micro_batch_size a number and trainer.on_oom=stop, or use "
            f"strategy={' or '.join(able)}"
        )
    chosen.rules(cfg, world_size)


def _validate_engine(cfg: DictConfig) -> None:
    """`strategy.name` must be the engine whose schema the strategy option loaded."""
    name, loaded = cfg.strategy.name, OmegaConf.get_type(cfg.strategy)
    known = schemas()
    if name not in known:
        raise ConfigError(f"strategy.name={name}: not one of {', '.join(known)}")
    if known[name] is not loaded:
        chosen = next((n for n, s in known.items() if s is loaded), "?")
        raise ConfigError(
            f"strategy.name={name} does not match the strategy option (strategy={chosen}); "
            f"choose the engine with strategy={name}, not with strategy.name"
        )


def _validate_profiler(p: ProfilerConfig, max_steps: int, world_size: int) -> None:
    outside = [r for r in p.ranks if not r < world_size]
    if outside:
        raise ConfigError(
            f"profiler.ranks={list(p.ranks)}: rank(s) {outside} do not exist in a job of "
            f"{world_size} rank(s); give ranks 0..{world_size - 1} or [] for all"
        )
    if p.name == "off":
        return
    cycle = p.wait + p.warmup + p.active
    cycles = max(p.repeat, 1)
    needed = p.skip_first + cycles * cycle
    if needed <= max_steps:
        return
    first = p.skip_first + p.wait + p.warmup + 1
    recorded = (
        "nothing would be recorded"
        if first > max_steps
        else f"only steps {first}-{min(first + p.active - 1, max_steps)} would be recorded"
    )
    raise ConfigError(
        f"profiler: profiler.skip_first={p.skip_first} then {cycles} cycle(s) of "
        f"wait={p.wait} + warmup={p.warmup} + active={p.active} steps need {needed} steps but "
        f"trainer.max_steps={max_steps}, so {recorded}; lower profiler.skip_first "
        f"(or repeat, wait, warmup, active) or raise trainer.max_steps"
    )


def _validate_watchdog(w: WatchdogConfig, dist_timeout_s: int) -> None:
    """The allowances must end before a collective times out (ranges are in ranges.py)."""
    if not w.enabled:
        return
    for key in ("min_s", "startup_s", "first_step_s", "checkpoint_s"):
        if getattr(w, key) >= dist_timeout_s:
            raise ConfigError(
                f"watchdog.{key}={getattr(w, key)} is not below dist.timeout_s={dist_timeout_s}: a "
                "collective would time out before the hang is explained; lower it or raise "
                "dist.timeout_s"
            )


def _unknown_keys(node: DictConfig, prefix: str) -> list[str]:
    """Keys added with Hydra's `+key=value`, which composition lets through, one line each.
    Each node is judged by its own schema: the `strategy` node by the chosen engine's."""
    schema_type = OmegaConf.get_type(node)
    if not is_dataclass(schema_type):
        return []  # a free-form mapping such as strategy.extra or cluster.env
    known = {f.name for f in fields(schema_type)}
    found = []
    for key in node:
        path = f"{prefix}{key}"
        if key not in known:
            found.append(unknown_key_line(path, schema_type))
            continue
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            found += _unknown_keys(child, f"{path}.")
    return found


def _validate_data_source(d: DataConfig) -> None:
    """What each data source needs set (whether its files exist is launcher.preflight's)."""
    wanted = {
        "text_files": "text file globs, e.g. data.paths=[a/*.txt]",
        "memmap": "pre-tokenized .bin files",
    }
    if d.source in wanted and not d.paths:
        raise ConfigError(f"data.paths is empty; give {wanted[d.source]}")
    if d.source in ("memmap", "synthetic"):
        if d.dtype not in ("uint16", "uint32"):
            raise ConfigError(f"data.dtype={d.dtype}: not one of uint16, uint32")
        if d.vocab_size is None:
            raise ConfigError(
                f"data.vocab_size is not set; {d.source} data needs its vocabulary size"
            )
