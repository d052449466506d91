"""The resume decision: which checkpoints a launch may start from, or why it must not start.

Rank 0 decides, holding the run directory's lock, before anything in the directory is
written; the other ranks receive the decision. The rules (docs/checkpoints.md):
 - a checkpoint that cannot be resumed with the current settings (model shape, strategy,
   ZeRO stage and precision, world size where the strategy cannot reshard) stops the
   launch with one line: what differs, the overrides that resume it, how to start fresh.
   DDP and FSDP2 checkpoints resume at any world size, and each engine resumes the other's;
   DeepSpeed's at the precision and (but for ZeRO-1 <-> ZeRO-2) the stage that wrote them,
   at another world size, and into DDP or FSDP2, through DeepSpeed's universal conversion
   (launcher.strategy.deepspeed.universal); no other engine's into DeepSpeed;
 - what a crash or a person left behind (an incomplete checkpoint, a damaged `latest`,
   stray entries) is skipped with one warning each; a file or folder of the wrong type
   where the launcher writes stops the launch with one line;
 - `resume=never` and `resume=<path>` never start over a run directory's checkpoints or
   history (metrics.jsonl, summary.json); `resume=archive` moves them aside first;
 - a run whose newest checkpoint is at or past `trainer.max_steps` (and readable) is
   finished: the launch says so and ends (exit 0) without writing anything; a higher
   max_steps continues it;
 - `resume=auto` with no checkpoint to continue from refuses to start over a completed
   run's history (launcher.runtime.run_history), and moves an unfinished attempt's (a crash
   before the first checkpoint, which a restart redoes) to archive/<time>/ with a warning.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from launcher.checkpoint import protocol as checkpoint
from launcher.config import ConfigError
from launcher.config.batch import BatchPlan
from launcher.config.registry import engine, engines, format_of
from launcher.runtime import run_dir_check, run_history

log = logging.getLogger("launcher")

MODEL_KEYS = ("n_layer", "n_head", "n_embd", "n_positions", "vocab_size")
ARCHIVE = "archive"
# What resume=archive moves into archive/<time>/: whatever a fresh start would overwrite.
ARCHIVED = ("checkpoints", "metrics.jsonl", "summary.json", "config.yaml", "env.json",
            "ds_config.json", "comm_collectives.json")  # fmt: skip


def identity(cfg, model, world_size: int) -> dict:
    """What a checkpoint must share with a launch to be resumed by it (goes in meta.json)."""
    mc = getattr(model, "config", None)
    shape = {k: int(getattr(mc, k, None) or getattr(cfg.model, k, None) or 0) for k in MODEL_KEYS}
    strategy = {"name": str(cfg.strategy.name), **engine(cfg.strategy.name).resume.identity(cfg)}
    return {
        "model": {"name": str(cfg.model.name), "impl": str(cfg.model.impl), **shape},
        "strategy": strategy,
        "world_size": int(world_size),
        "batch": {"global_batch": BatchPlan.of(cfg.trainer, world_size).global_batch,
                  "seq_len": int(cfg.trainer.seq_len)},
    }  # fmt: skip


def _batch_of(saved: dict) -> dict:
    """The checkpoint's global batch and sequence length; for one written before meta.json
    recorded them, the tokens per step its `tokens` and `step` imply."""
    if isinstance(saved.get("batch"), dict):
        return saved["batch"]
    step, tokens = saved.get("step"), saved.get("tokens")
    if isinstance(step, int) and step > 0 and isinstance(tokens, int):
        return {"tokens_per_step": tokens // step}
    return {}


def _batch_differences(saved: dict, now: dict) -> list[Difference]:
    """The data position (which samples were read) and `tokens` count in steps of the
    checkpoint's batch: another global batch would skip or reread samples and make
    `tokens` jump, another sequence length would cut the data into other windows (and
    `tokens` go backwards). Both keep the checkpoint from being resumed as it is."""
    sb, nb = _batch_of(saved), now.get("batch")
    if not nb:
        return []
    if not sb:  # neither meta.json nor its run's config.yaml (read_meta_with_batch) says
        what = (
            "it records neither its global batch nor its tokens, so where its data "
            "stopped cannot be proven (another batch would skip or reread samples)"
        )
        fix = (
            "the trainer.global_batch_size and trainer.seq_len it was trained with, "
            'after adding them to its meta.json as "batch": {"global_batch": G, "seq_len": L}'
        )
        return [Difference(what, fix)]  # fmt: skip
    if "tokens_per_step" in sb:
        now_tps = nb["global_batch"] * nb["seq_len"]
        if sb["tokens_per_step"] == now_tps:
            return []
        what = (f"{sb['tokens_per_step']} tokens per step there (global batch x seq_len), "
                f"{now_tps} now")  # fmt: skip
        return [Difference(what, "the trainer.global_batch_size and trainer.seq_len it had")]
    found = []
    why = {
        "global_batch": ("trainer.global_batch_size", "its data position is counted in its "
                         "steps: another batch would skip or reread samples"),
        "seq_len": ("trainer.seq_len", "its data is cut into windows of that length"),
    }  # fmt: skip
    for key, (name, because) in why.items():
        if key in sb and sb[key] != nb[key]:
            found.append(Difference(f"{name} is {sb[key]} there, {nb[key]} now ({because})",
                                    f"{name}={sb[key]}"))  # fmt: skip
    return found


def read_meta_with_batch(step_dir: Path) -> dict:
    """The checkpoint's meta.json; when it records neither its batch nor its tokens (written
    before it did), the batch its run's config.yaml names, which the launch that wrote
    the checkpoint wrote (a launch with another batch was refused before replacing it)."""
    meta = checkpoint.read_meta(step_dir) or {}
    if _batch_of(meta):
        return meta
    try:
        trainer = (yaml.safe_load((step_dir.parent.parent / "config.yaml").read_text()) or {})[
            "trainer"
        ]
        batch = {"global_batch": trainer["global_batch_size"], "seq_len": trainer["seq_len"]}
    except (OSError, ValueError, yaml.YAMLError, KeyError, TypeError):
        return meta
    if all(isinstance(v, int) and not isinstance(v, bool) for v in batch.values()):
        return {**meta, "batch": batch}
    return meta


@dataclass
class Difference:
    what: str  # "model.n_layer is 2 there, 4 now"
    fix: str  # "model.n_layer=2"


def differences(saved: dict, now: dict) -> list[Difference]:
    """What keeps a checkpoint with meta `saved` from being resumed by a launch `now`.

    Keys a checkpoint does not record (one written before they were) are not compared.
    """
    found: list[Difference] = _batch_differences(saved, now)
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
    # Checkpoints from before model.impl existed were all written by GPT2LMHeadModel.
    saved_impl, now_impl = sm.get("impl", "hf"), nm.get("impl", "hf")
    if sm and saved_impl != now_impl:
        what = (
            f"model.impl is {saved_impl} there, {now_impl} now (the two lay their weights out "
            "differently; python -m launcher.export converts finished runs)"
        )
        found.append(Difference(what, f"model.impl={saved_impl}"))
    return found + _engine_differences(saved.get("strategy") or {}, now["strategy"])


def _engine_differences(ss: dict, ns: dict) -> list[Difference]:
    """What the engines say of a checkpoint's strategy `ss` and a launch's `ns`: within one
    engine, its own rules (DeepSpeed's stage and precision); across two, whether the launch's
    engine reads the checkpoint's format (launcher.config.registry)."""
    now = engine(ns["name"])
    if not ss.get("name") or ss["name"] == ns["name"]:
        return [Difference(what, fix) for what, fix in now.resume.own_differences(ss, ns)]
    there = engines().get(ss["name"])
    if there is None:
        why = "an engine this installation does not have"
    else:
        why = now.resume.refuses_other_formats or there.resume.unreadable_by_others(ss)
    if not why:
        return []  # the launch's engine reads the other's format, at any world size
    fix = there.overrides_to_resume(ss) if there else f"strategy={ss['name']}"
    return [Difference(f"strategy is {ss['name']} there, {ns['name']} now ({why})", fix)]


def prepare(candidates: list[str], now: dict) -> list[str]:
    """The checkpoints to try, newest first, once each format that must be converted before
    another world size or engine loads it has done so (DeepSpeed's universal conversion; rank
    0, under the lock): its reader's `prepare` may also leave fallbacks out."""
    found = {format_of(Path(c)) for c in candidates} - {None}
    for fmt in sorted(found, key=lambda f: f.name):
        reader = fmt.module()
        if hasattr(reader, "prepare"):
            candidates = reader.prepare(candidates, now)
    return candidates


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


def check_run_files(run_dir: Path, world_size: int = 1) -> None:
    """Refuse a run directory holding something in another form than the launcher writes
    (a folder named metrics.jsonl, a file named checkpoints, a dangling symlink, a
    read-only checkpoints/...: launcher.runtime.run_dir_check): the launcher does not
    delete what it did not write, and would fail on it later."""
    problem = run_dir_check.problem(run_dir, world_size)
    if problem:
        raise ConfigError(problem)


def archive(run_dir: Path, why: str = "resume=archive") -> Path | None:
    """Move the run's checkpoints and history to archive/<time>/ (resume=archive, or `why`)."""
    present = [n for n in ARCHIVED if (run_dir / n).exists()]
    if not present:
        log.info("%s: %s holds nothing to archive; starting fresh", why, run_dir)
        return None
    target = run_dir / ARCHIVE / f"{dt.datetime.now():%Y%m%d-%H%M%S}"
    suffix = 0
    while target.exists():
        suffix += 1
        target = target.with_name(f"{target.name.split('.')[0]}.{suffix}")
    target.mkdir(parents=True)
    for name in present:
        (run_dir / name).rename(target / name)
    log.warning("%s: moved %s to %s; starting fresh", why, ", ".join(present), target)
    return target


@dataclass
class Plan:
    """The checkpoints to try, newest first (every rank tries them in this order)."""

    candidates: list[str] = field(default_factory=list)
    finished_at: int | None = None  # the run's own newest step, when >= trainer.max_steps


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


def plan(
    resume: str, run_dir: Path, now: dict, max_steps: int | None = None, continues: bool = False
) -> Plan:
    """Decide what this launch resumes from (rank 0, under the lock), or raise ConfigError
    with the one line that says why it must not start. `now` is this launch's `identity`;
    `max_steps` (trainer.max_steps) tells a finished run from one to continue; `continues`:
    the memory tier holds this launch's own step (launcher.checkpoint.memory), so a run
    without a durable checkpoint keeps its history for the restart that resumes from it.
    """
    run_dir = Path(run_dir)
    check_run_files(run_dir)
    if resume == ARCHIVE:
        archive(run_dir)
    own_folder = run_dir / "checkpoints"
    own = checkpoint.scan(own_folder)
    if checkpoint.recover_leftovers(own):  # a save the job ended before it sealed
        own = checkpoint.scan(own_folder)
    if resume in ("never", ARCHIVE):
        if own.has_checkpoints:
            raise ConfigError(
                f"resume={resume} but {own_folder} already holds checkpoints; use resume=auto "
                f"to continue, or {fresh_start_hint(run_dir).removeprefix('to start fresh, use ')}"
            )
        _start_over(run_dir, resume)
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
        if not continues:
            _start_over(run_dir, resume)
        return Plan()
    found_diff = differences(read_meta_with_batch(chosen), now)
    if found_diff:
        raise refusal(chosen, found_diff, run_dir)
    usable = [chosen]
    for older in found.complete[1:]:
        diff = differences(read_meta_with_batch(older), now)
        if diff:
            log.warning("skipping checkpoint %s as a fallback: %s", older, diff[0].what)
        else:
            usable.append(older)
    newest = checkpoint.step_of(chosen)
    # Finished only if that checkpoint can be read: a damaged last checkpoint is resumed
    # like any other (every rank falls back to the previous one and redoes the steps). The
    # files are opened only when the step says finished, not on every resume.
    finished = (
        resume == "auto"
        and max_steps is not None
        and newest >= max_steps
        and checkpoint.unreadable(sorted(chosen.glob("*.pt"))) is None
    )
    return Plan([str(p) for p in usable], newest if finished else None)


def _start_over(run_dir: Path, resume: str) -> None:
    """Before a start from step 0: refuse over a finished run's history, or over any with
    resume=never; move an unfinished attempt's aside (see launcher.runtime.run_history)."""
    history = run_history.read(run_dir)
    run_history.fresh_start_over(history, run_dir, resume, fresh_start_hint(run_dir))
    if not history.empty:
        archive(run_dir, f"{run_dir} holds an unfinished attempt ({history.describe()}) and no "
                         "checkpoint to continue it from")  # fmt: skip


def finished_line(run_dir: Path, step: int, max_steps: int) -> str:
    """What a launch of a finished run says (and then ends, exit 0, writing nothing)."""
    return (
        f"{run_dir} already holds step {step} (trainer.max_steps={max_steps}): the run is "
        f"finished, nothing was trained or rewritten; to train it further, raise "
        f"trainer.max_steps; {fresh_start_hint(run_dir)}"
    )


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
