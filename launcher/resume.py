"""The resume decision: which checkpoints a launch may start from, or why it must not start.

Rank 0 decides, holding the run directory's lock, before anything in the directory is
written; the other ranks receive the decision. The rules (docs/checkpoints.md):
 - a checkpoint that cannot be resumed with the current settings (model shape, strategy,
   ZeRO stage and precision, world size where the strategy cannot reshard) stops the
   launch with one line: what differs, the overrides that resume it, how to start fresh.
   DDP and FSDP2 checkpoints resume at any world size, and each engine resumes the other's;
   DeepSpeed's only at the stage, precision and world size that wrote them;
 - what a crash or a person left behind (an incomplete checkpoint, a damaged `latest`,
   stray entries) is skipped with one warning each; a file or folder of the wrong type
   where the launcher writes stops the launch with one line;
 - `resume=never` and `resume=<path>` never start over a run directory's checkpoints;
   `resume=archive` moves them (and the run's history) aside first.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field
from pathlib import Path

from launcher import checkpoint
from launcher.config import ConfigError

log = logging.getLogger("launcher")

# Engines whose checkpoints any of them resumes at any world size: DDP's hold the whole
# model and optimizer, FSDP2's are DCP shards that reshard on load.
RESHARDABLE = {"ddp", "fsdp2"}
MODEL_KEYS = ("n_layer", "n_head", "n_embd", "n_positions", "vocab_size")
ARCHIVE = "archive"
# What a launch writes at the top of a run directory (files), and the folders it writes in.
RUN_FILES = (
    "config.yaml",
    "env.json",
    "metrics.jsonl",
    "summary.json",
    "ds_config.json",
    "comm_collectives.json",
)
RUN_FOLDERS = ("logs", "checkpoints")
# What resume=archive moves into archive/<time>/: whatever a fresh start would overwrite.
ARCHIVED = ("checkpoints", "metrics.jsonl", "summary.json", "config.yaml", "env.json",
            "ds_config.json", "comm_collectives.json")  # fmt: skip


def identity(cfg, model, world_size: int) -> dict:
    """What a checkpoint must share with a launch to be resumed by it (goes in meta.json)."""
    mc = getattr(model, "config", None)
    shape = {k: int(getattr(mc, k, None) or getattr(cfg.model, k, None) or 0) for k in MODEL_KEYS}
    strategy = {"name": str(cfg.strategy.name)}
    if cfg.strategy.name == "deepspeed":
        strategy.update(zero_stage=int(cfg.strategy.zero_stage), precision=cfg.trainer.precision)
    return {
        "model": {"name": str(cfg.model.name), **shape},
        "strategy": strategy,
        "world_size": int(world_size),
    }


@dataclass
class Difference:
    what: str  # "model.n_layer is 2 there, 4 now"
    fix: str  # "model.n_layer=2"


def differences(saved: dict, now: dict) -> list[Difference]:
    """What keeps a checkpoint with meta `saved` from being resumed by a launch `now`.

    Keys a checkpoint does not record (one written before they were) are not compared.
    """
    found: list[Difference] = []
    sm, nm = saved.get("model") or {}, now["model"]
    shape = [k for k in MODEL_KEYS if k in sm and sm[k] != nm[k]]
    if shape and sm.get("name") and sm["name"] != nm["name"]:
        what = f"model is {sm['name']} there, {nm['name']} now"
        found.append(Difference(what, f"model={sm['name']}"))
    else:
        for k in shape:
            fix = (
                "the data and tokenizer settings it was trained with"
                if k == "vocab_size"
                else f"model.{k}={sm[k]}"
            )
            found.append(Difference(f"model.{k} is {sm[k]} there, {nm[k]} now", fix))
    ss, ns = saved.get("strategy") or {}, now["strategy"]
    if {ss.get("name"), ns["name"]} <= RESHARDABLE:
        return found  # DDP and FSDP2 load each other's checkpoints, at any world size
    if ss.get("name") and ss["name"] != ns["name"]:
        fix = f"strategy={ss['name']}"
        if ss["name"] == "deepspeed" and "zero_stage" in ss:
            fix = f"strategy=deepspeed strategy.zero_stage={ss['zero_stage']}"
        why = ""
        if "deepspeed" in (ss["name"], ns["name"]):
            why = " (DeepSpeed's shards convert to no other engine, nor others' into them)"
        found.append(Difference(f"strategy is {ss['name']} there, {ns['name']} now{why}", fix))
        return found  # the engine's own settings compare only within one engine
    if ns["name"] == "deepspeed":
        if "zero_stage" in ss and ss["zero_stage"] != ns["zero_stage"]:
            found.append(
                Difference(
                    f"strategy.zero_stage is {ss['zero_stage']} there, {ns['zero_stage']} now",
                    f"strategy.zero_stage={ss['zero_stage']}",
                )
            )
        if "precision" in ss and ss["precision"] != ns["precision"]:
            found.append(
                Difference(
                    f"trainer.precision is {ss['precision']} there, {ns['precision']} now",
                    f"trainer.precision={ss['precision']}",
                )
            )
        ws = saved.get("world_size")
        if ws is not None and ws != now["world_size"]:
            found.append(
                Difference(
                    f"world size is {ws} there, {now['world_size']} now (DeepSpeed's shards load "
                    "only at the world size that wrote them)",
                    f"{ws} ranks (torchrun --nproc_per_node x nodes = {ws})",
                )
            )
    return found


def fresh_start_hint(run_dir: Path) -> str:
    return (
        f"to start fresh, use a new run.id (with resume=never), or resume=archive to move "
        f"this run's checkpoints and metrics to {run_dir / ARCHIVE}/<time>/ first"
    )


def refusal(folder: Path, found: list[Difference], run_dir: Path) -> ConfigError:
    what = "; ".join(d.what for d in found)
    fix = " ".join(d.fix for d in found)
    return ConfigError(
        f"{folder} cannot be resumed with these settings: {what}. To resume it, run with "
        f"{fix}; {fresh_start_hint(run_dir)}"
    )


def check_run_files(run_dir: Path) -> None:
    """Refuse a run directory holding something of the wrong type where the launcher
    writes (a folder named metrics.jsonl, a file named checkpoints, ...): the launcher does
    not delete what it did not write, and would fail on it later."""
    wrong = [n for n in RUN_FILES if (run_dir / n).exists() and not (run_dir / n).is_file()]
    wrong += [n for n in RUN_FOLDERS if (run_dir / n).exists() and not (run_dir / n).is_dir()]
    pointer = run_dir / "checkpoints" / checkpoint.LATEST
    if pointer.exists() and not pointer.is_file():
        wrong.append(f"checkpoints/{checkpoint.LATEST}")
    if wrong:
        name = wrong[0]
        kind = "a folder" if (run_dir / name).is_dir() else "not a regular file"
        if name in RUN_FOLDERS:
            kind = "not a folder"
        raise ConfigError(
            f"{run_dir / name} is {kind}, where the launcher writes its own; move it out of "
            f"the run directory, or use another run.id"
        )


def archive(run_dir: Path) -> Path | None:
    """resume=archive: move the run's checkpoints and history to archive/<time>/."""
    present = [n for n in ARCHIVED if (run_dir / n).exists()]
    if not present:
        log.info("resume=archive: %s holds nothing to archive; starting fresh", run_dir)
        return None
    target = run_dir / ARCHIVE / f"{dt.datetime.now():%Y%m%d-%H%M%S}"
    suffix = 0
    while target.exists():
        suffix += 1
        target = target.with_name(f"{target.name.split('.')[0]}.{suffix}")
    target.mkdir(parents=True)
    for name in present:
        (run_dir / name).rename(target / name)
    log.warning("resume=archive: moved %s to %s; starting fresh", ", ".join(present), target)
    return target


@dataclass
class Plan:
    """The checkpoints to try, newest first (every rank tries them in this order)."""

    candidates: list[str] = field(default_factory=list)


def _report(found: checkpoint.Scan, chosen: Path | None) -> None:
    """One log line per thing skipped or ignored (warnings for what a resume skips)."""
    newest = checkpoint.step_of(chosen) if chosen else None
    for path, reason in found.incomplete:
        if newest is None or checkpoint.step_of(path) > newest:
            log.warning("skipping checkpoint %s: %s", path, reason)
        else:
            log.info("ignoring incomplete checkpoint %s: %s", path, reason)
    if found.pointer_problem and chosen is not None:
        log.warning(
            "%s/%s; resuming from the newest complete checkpoint, %s",
            found.folder,
            found.pointer_problem,
            chosen.name,
        )
    for path in found.strays:
        log.info("ignoring %s: not a checkpoint (the launcher leaves it alone)", path)


def plan(resume: str, run_dir: Path, now: dict) -> Plan:
    """Decide what this launch resumes from (rank 0, under the lock), or raise ConfigError
    with the one line that says why it must not start. `now` is this launch's `identity`.
    """
    run_dir = Path(run_dir)
    check_run_files(run_dir)
    if resume == ARCHIVE:
        archive(run_dir)
    own_folder = run_dir / "checkpoints"
    own = checkpoint.scan(own_folder)
    checkpoint.remove_leftovers(own)
    if resume in ("never", ARCHIVE):
        if own.has_checkpoints:
            raise ConfigError(
                f"resume={resume} but {own_folder} already holds checkpoints; use resume=auto "
                f"to continue, or {fresh_start_hint(run_dir).removeprefix('to start fresh, use ')}"
            )
        return Plan()
    if resume == "auto":
        found, source = own, own_folder
    else:
        found, source = _explicit(resume, own_folder, own, run_dir)
    chosen = found.complete[0] if found.complete else None
    _report(found, chosen)
    if chosen is None:
        if resume != "auto":
            raise ConfigError(
                f"resume={resume}: no complete checkpoint there"
                + (f" ({_reasons(found)})" if found.incomplete else "")
            )
        if found.incomplete:
            raise ConfigError(
                f"{source} holds checkpoints but none is complete ({_reasons(found)}); "
                f"{fresh_start_hint(run_dir)}"
            )
        return Plan()
    found_diff = differences(checkpoint.read_meta(chosen) or {}, now)
    if found_diff:
        raise refusal(chosen, found_diff, run_dir)
    usable = [chosen]
    for older in found.complete[1:]:
        diff = differences(checkpoint.read_meta(older) or {}, now)
        if diff:
            log.warning("skipping checkpoint %s as a fallback: %s", older, diff[0].what)
        else:
            usable.append(older)
    return Plan([str(p) for p in usable])


def _reasons(found: checkpoint.Scan) -> str:
    return "; ".join(f"{p.name}: {why}" for p, why in found.incomplete[:3])


def _explicit(resume: str, own_folder: Path, own: checkpoint.Scan, run_dir: Path):
    """resume=<path>: its checkpoints, which may not be another run's into this one's."""
    path = Path(resume).expanduser()
    if checkpoint.parse_step(path.name) is not None:
        folder = path.parent
        reason = checkpoint.incomplete_reason(path) if path.exists() else "it does not exist"
        found = checkpoint.Scan(folder)
        if reason is None:
            found.complete.append(path)
        else:
            found.incomplete.append((path, reason))
    else:
        folder = checkpoint.checkpoints_folder(path)
        found = checkpoint.scan(folder) if folder.resolve() != own_folder.resolve() else own
    if own.has_checkpoints and folder.resolve() != own_folder.resolve():
        raise ConfigError(
            f"resume={resume}: {run_dir} already holds checkpoints of its own, which a run "
            f"started from another checkpoint would mix with; choose a new run.id for it, or "
            f"resume=auto to continue {run_dir.name}"
        )
    return found, folder
