"""The run directory's files, on rank 0: claimed under its lock before anything is written
there, config.yaml and env.json, the sinks every record goes to (metrics.jsonl, ranks.jsonl,
the console, W&B and TensorBoard when enabled) and summary.json. A full disk stops every
rank with one line, the files as they were (each is written whole or not at all)."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from pathlib import Path

from omegaconf import OmegaConf

from launcher.checkpoint import resume
from launcher.config import ConfigError, TrainConfig
from launcher.config.secret_keys import is_secret_key
from launcher.config.sweep import flatten
from launcher.observe.report import RANKS
from launcher.observe.sinks import ConsoleSink, JsonlSink, RankFileSink, Sink, write_summary
from launcher.observe.tensorboard_sink import (  # imports no tensorboardX
    TensorBoardSink,
    code_block,
    tensorboard_enabled,
)
from launcher.observe.wandb_sink import WandbSink, wandb_enabled  # imports no wandb
from launcher.paths import atomic_write, make_run_dir
from launcher.plan.memory import shm_need
from launcher.resilience import burnin
from launcher.resilience.decide import decide_on_main
from launcher.runtime import disk, envinfo
from launcher.runtime.latest import point_latest
from launcher.runtime.lock import LockHeld, RunLock
from launcher.runtime.placement import launch_key, ranks_per_node
from launcher.runtime.process import Runtime, open_run_dir
from launcher.train.next_steps import next_commands

log = logging.getLogger("launcher")


def redacted(cfg: TrainConfig) -> dict:
    """The resolved config with values of secret-looking keys masked."""

    def mask(node):
        if isinstance(node, dict):
            return {k: "***" if is_secret_key(k) and v else mask(v) for k, v in node.items()}
        if isinstance(node, list):
            return [mask(v) for v in node]
        return node

    return mask(dataclasses.asdict(cfg))


def changed_settings(before: dict, now: dict) -> list[str]:
    """`key: old -> new` for each setting that differs between two configs (a key only
    one of them has counts as changed; secrets are masked in both, so never shown)."""
    old, new = flatten(before), flatten(now)
    keys = sorted(set(old) | set(new))
    missing = "(unset)"
    return [
        f"{k}: {old.get(k, missing)} -> {new.get(k, missing)}"
        for k in keys
        if old.get(k, missing) != new.get(k, missing)
    ]


def log_changed_settings(config_file: Path, now: dict, start_step: int) -> None:
    """A continued run says what its settings changed since the launch that wrote
    config.yaml (e.g. a raised trainer.max_steps), before that file is replaced: the
    resume checks refuse the changes that would lose or repeat data, so what is left
    here is what the user chose to change. A config.yaml that cannot be read says so."""
    try:
        before = OmegaConf.to_container(OmegaConf.load(config_file))
    except FileNotFoundError:
        return
    except Exception as exc:  # noqa: BLE001 - a damaged file must not stop the resume
        log.warning("%s is unreadable (%s); cannot say which settings changed", config_file, exc)
        return
    changes = changed_settings(before if isinstance(before, dict) else {}, now)
    if changes:
        log.info("continuing from step %d with changed settings: %s", start_step,
                 "; ".join(changes))  # fmt: skip


def write_run_files(
    cfg: TrainConfig, rt: Runtime, start_step: int, gate: dict | None = None
) -> None:
    """config.yaml and env.json (with the burn-in gate's verdict, when it ran), each whole
    or not at all (a full disk cuts neither). A continued run (start_step > 0) first logs
    what changed since its last launch."""
    settings = OmegaConf.create(redacted(cfg))
    if start_step > 0:
        now = OmegaConf.to_container(settings)  # as config.yaml holds it: lists, not tuples
        log_changed_settings(rt.run_dir / "config.yaml", now, start_step)
    atomic_write(rt.run_dir / "config.yaml", OmegaConf.to_yaml(settings))
    env = envinfo.collect(shm_need(cfg, ranks_per_node(), rt.world_size))
    env.update(world_size=rt.world_size, backend=rt.backend, run_id=rt.run_id)
    if gate is not None:
        env["burnin"] = burnin.summary(gate)
    atomic_write(rt.run_dir / "env.json", json.dumps(env, indent=1))


def wandb_sink(cfg: TrainConfig, rt: Runtime, point: str | None) -> WandbSink:
    """The run's one W&B run (rank 0 only): config is the redacted config plus env.json.

    A sweep point's run is named by its point and grouped under the sweep's id."""
    env = json.loads((rt.run_dir / "env.json").read_text())
    return WandbSink(
        cfg.logger,
        run_dir=rt.run_dir,
        run_id=rt.run_id,
        config={**redacted(cfg), "env": env},
        group=cfg.logger.group or (rt.launch.sweep_id if point else None),
        name=cfg.logger.name or point or rt.run_id,
    )


def tensorboard_sink(rt: Runtime, start_step: int) -> TensorBoardSink:
    """The run's TensorBoard event files (rank 0 only), with config.yaml and env.json as
    text at the step the run starts from."""
    texts = {
        "config": code_block((rt.run_dir / "config.yaml").read_text(), "yaml"),
        "env": code_block((rt.run_dir / "env.json").read_text(), "json"),
    }
    return TensorBoardSink(rt.run_dir, start_step=start_step, texts=texts)


def claim_run_dir(rt: Runtime, run) -> RunLock | None:
    """Check every entry of the run directory (launcher.runtime.run_dir_check), make it if
    new with `run.access`'s mode (`run`: the config's run section), take its lock (rank 0
    holds it) before writing anything there, and open the per-rank logs; an entry in the
    wrong form, or a directory in use by another launch, stops this one with one line, the
    directory as it was."""
    taken: list[RunLock] = []

    def take() -> None:
        resume.check_run_files(rt.run_dir, rt.world_size)
        make_run_dir(rt.run_dir, Path(run.root).expanduser(), run.access)
        lock = RunLock(rt.run_dir, launch_key())
        try:
            lock.acquire()
        except LockHeld as exc:
            raise ConfigError(str(exc)) from exc
        except OSError as exc:
            if not disk.is_full(exc, rt.run_dir):
                raise
            raise ConfigError(disk.no_space_line("the lock", lock.path, None)) from exc
        taken.append(lock)

    decide_on_main(rt, take)
    open_run_dir(rt)
    return taken[0] if taken else None


def already_completed(rt: Runtime) -> bool:
    """Whether this run directory holds a completed run (rank 0 decides for all)."""
    done = False
    if rt.is_main:
        try:
            done = json.loads((rt.run_dir / "summary.json").read_text())["status"] == "completed"
        except (OSError, ValueError, KeyError, TypeError):
            done = False  # no summary, or an unreadable one: the point runs (and resumes)
    return rt.broadcast_object(done)


def write_summary_if_room(run_dir: Path, summary: dict) -> None:
    """summary.json; on a full disk one line instead (the old one, if any, stays whole)."""
    try:
        write_summary(run_dir, summary)
    except OSError as exc:
        if not disk.is_full(exc, run_dir):
            raise
        log.warning("%s", disk.no_space_line("summary.json", run_dir / "summary.json", 0))


def open_rank0_sinks(
    cfg: TrainConfig, rt: Runtime, point: str | None, start_step: int, gate: dict | None
) -> list[Sink]:
    """`rank0_sinks` on rank 0 (none elsewhere); a full disk stops every rank, one line."""
    opened: list[Sink] = []

    def open_them() -> None:
        try:
            opened.extend(rank0_sinks(cfg, rt, point, start_step, gate))
        except OSError as exc:
            if not disk.is_full(exc, rt.run_dir):
                raise
            raise ConfigError(disk.no_space_line("the run's files", rt.run_dir, None)) from exc

    decide_on_main(rt, open_them)
    return opened


def rank0_sinks(
    cfg: TrainConfig, rt: Runtime, point: str | None, start_step: int, gate: dict | None = None
) -> list[Sink]:
    """Rank 0's run files and sinks: config.yaml and env.json, metrics.jsonl, the console,
    and W&B and TensorBoard when enabled."""
    write_run_files(cfg, rt, start_step, gate)
    # a sweep's or tuning run's points: its folder, not the point of the moment
    point_latest(Path(cfg.run.root).expanduser(), rt.run_id.split("/")[0])
    sinks = [
        JsonlSink(rt.run_dir / "metrics.jsonl", start_step),
        RankFileSink(rt.run_dir / RANKS, start_step),
        ConsoleSink(
            cfg.trainer.max_steps,
            start_step,
            run_dir=rt.run_dir,
            what_next=functools.partial(next_commands, rt.run_dir),
            world_size=rt.world_size,
            brief=point is not None,
            quiet=rt.launch.quiet_progress,
            report=cfg.run.report,
        ),
    ]
    if wandb_enabled(cfg.logger):
        sinks.append(wandb_sink(cfg, rt, point))
    if tensorboard_enabled(cfg.logger):
        sinks.append(tensorboard_sink(rt, start_step))
    return sinks
