"""One training job from a composed config, and the exit code it ends with.

Checks the config against this machine, joins the job, writes the run directory's files,
builds data, model and strategy, resumes, runs the loop, and always leaves summary.json and
a clean process-group teardown behind, whatever happened.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from launcher import checkpoint, envinfo, exit_codes, nccl_log, resume
from launcher.config import ConfigError
from launcher.data import prepare_data
from launcher.lock import LockHeld, RunLock
from launcher.loop import NonFiniteLoss, OutOfMemory, Stopped, TrainLoop
from launcher.model import build_model, count_params, flops_per_token, peak_flops
from launcher.preflight import preflight, shm_need
from launcher.runtime import (
    Runtime,
    end_job,
    env_world,
    launch_key,
    open_run_dir,
    ranks_per_node,
    start,
    sweep_id,
)
from launcher.sinks import ConsoleSink, JsonlSink, write_summary
from launcher.strategy import build_strategy, ds_universal
from launcher.tensorboard_sink import (  # imports no tensorboardX
    TensorBoardSink,
    code_block,
    tensorboard_enabled,
)
from launcher.wandb_sink import WandbSink, wandb_enabled  # imports no wandb

log = logging.getLogger("launcher")

BAD_INPUT_LINGER_S = 20.0
SECRET_WORDS = ("key", "token", "secret", "password")


def fail_bad_input(exc: ConfigError) -> None:
    """One line on rank 0 (every rank finds the same problem), exit code 2 everywhere.

    The other ranks linger before exiting: torchrun stops every rank as soon as one exits,
    and a rank that got there first would otherwise take rank 0 down before it printed.
    Rank 0's own exit ends the others' wait.
    """
    rank = env_world()[0]
    if rank == 0:
        print(f"error: {exc}", file=sys.stderr)
    else:
        time.sleep(BAD_INPUT_LINGER_S)
    sys.exit(exit_codes.BAD_INPUT)


def check_or_exit(cfg: DictConfig) -> None:
    try:
        preflight(cfg, env_world()[2], ranks_per_node())
    except ConfigError as exc:
        fail_bad_input(exc)


def redacted(cfg: DictConfig) -> dict:
    """The resolved config with values of secret-looking keys masked."""

    def mask(node):
        if isinstance(node, dict):
            return {
                k: "***" if any(w in str(k).lower() for w in SECRET_WORDS) and v else mask(v)
                for k, v in node.items()
            }
        if isinstance(node, list):
            return [mask(v) for v in node]
        return node

    return mask(OmegaConf.to_container(cfg, resolve=True))


def write_run_files(cfg: DictConfig, rt: Runtime) -> None:
    (rt.run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(redacted(cfg))))
    env = envinfo.collect(shm_need(cfg))
    env.update(world_size=rt.world_size, backend=rt.backend, run_id=rt.run_id)
    (rt.run_dir / "env.json").write_text(json.dumps(env, indent=1))


def wandb_sink(cfg: DictConfig, rt: Runtime, point: str | None) -> WandbSink:
    """The run's one W&B run (rank 0 only): config is the redacted config plus env.json.

    A sweep point's run is named by its point and grouped under the sweep's id."""
    env = json.loads((rt.run_dir / "env.json").read_text())
    return WandbSink(
        cfg.logger,
        run_dir=rt.run_dir,
        run_id=rt.run_id,
        config={**redacted(cfg), "env": env},
        group=cfg.logger.group or (sweep_id() if point else None),
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


def decide_on_main(rt: Runtime, decide):
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
            rt.broadcast_object(("crash", f"{type(exc).__name__} on rank 0: {exc}"))
            raise
    kind, value = rt.broadcast_object(outcome)
    if kind == "bad":
        raise ConfigError(value)
    if kind == "crash":
        raise RuntimeError(value)
    return value


def claim_run_dir(rt: Runtime) -> RunLock | None:
    """Take the run directory's lock (rank 0 holds it) before writing anything there, and
    open the per-rank logs; a directory in use by another launch stops this one."""
    taken: list[RunLock] = []

    def take() -> None:
        lock = RunLock(rt.run_dir, launch_key())
        try:
            lock.acquire()
        except LockHeld as exc:
            raise ConfigError(str(exc)) from exc
        taken.append(lock)

    decide_on_main(rt, take)
    open_run_dir(rt)
    return taken[0] if taken else None


def plan_resume(cfg: DictConfig, rt: Runtime, model) -> list[Path]:
    """The checkpoints to try, newest first, decided by rank 0 under the lock (see
    launcher.resume); a checkpoint that does not fit these settings stops the launch."""
    now = resume.identity(cfg, model, rt.world_size)

    def decide() -> list[str]:
        folders = resume.plan(cfg.resume, rt.run_dir, now).candidates
        # A DeepSpeed checkpoint at another world size, stage or engine: converted here.
        return ds_universal.prepare(folders, now)

    return [Path(p) for p in decide_on_main(rt, decide)]


def restore(loop: TrainLoop, rt: Runtime, folders: list[Path]) -> int:
    """Load the newest checkpoint that every rank can read.

    Each rank tries the same checkpoint and all ranks compare notes: one rank's unreadable
    file makes every rank fall back together, with one warning that names the ranks and
    why. A launch that had checkpoints to resume and could load none stops (a fresh start
    would overwrite them).
    """
    failures = []
    for i, folder in enumerate(folders):
        step, bad = try_restore(loop, rt, folder)
        if not bad:
            log.info("resumed from step %d", step)
            return step
        then = "falling back to the previous one" if i + 1 < len(folders) else "none is left"
        (log.warning if rt.is_main else log.info)(
            "checkpoint %s is unreadable (%s); %s", folder, bad, then
        )
        failures.append(f"{folder.name}: {bad}")
    if folders:
        raise ConfigError(
            f"no checkpoint of {folders[0].parent} could be loaded ({' | '.join(failures)}); "
            f"{resume.fresh_start_hint(rt.run_dir)}"
        )
    return 0


def try_restore(loop: TrainLoop, rt: Runtime, folder: Path) -> tuple[int, str]:
    """(step, '') when every rank loaded `folder`, else (0, every rank's problem).

    Two rounds: each rank first checks that the files it will read are whole torch files,
    and only when all are does any rank load (an engine's load may enter collectives,
    where a rank that failed before them would leave the others waiting)."""
    try:
        problem = checkpoint.unreadable(loop.files_to_load(folder))
    except Exception as exc:  # noqa: BLE001 - reported like an unreadable file
        problem = _one_line(exc)
    bad = _agree(rt, problem)
    if bad:
        return 0, bad
    step, problem = 0, None
    try:
        step = loop.restore(folder)
    except Exception as exc:  # noqa: BLE001 - any unreadable file means: try the previous one
        problem = _one_line(exc)
    return step, _agree(rt, problem)


def _agree(rt: Runtime, problem: str | None) -> str:
    """Every rank's problem with a checkpoint, as one text ('' when no rank has one)."""
    return "; ".join(f"rank {r}: {p}" for r, p in enumerate(rt.all_gather_objects(problem)) if p)


def _one_line(exc: Exception, limit: int = 300) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:limit]


def already_completed(rt: Runtime) -> bool:
    """Whether this run directory holds a completed run (rank 0 decides for all)."""
    done = False
    if rt.is_main:
        try:
            done = json.loads((rt.run_dir / "summary.json").read_text())["status"] == "completed"
        except (OSError, ValueError, KeyError, TypeError):
            done = False  # no summary, or an unreadable one: the point runs (and resumes)
    return rt.broadcast_object(done)


def build_data_and_model(cfg: DictConfig, rt: Runtime):
    """The token data (prepared once per node) and the model; FLOPs per token for MFU."""
    t = cfg.trainer
    try:
        data = prepare_data(
            cfg.data,
            seq_len=t.seq_len,
            seed=t.seed,
            is_builder=rt.local_rank == 0,
            wait=rt.barrier,
        )
    except (ValueError, FileNotFoundError) as exc:  # worded for the user by launcher.data
        raise ConfigError(str(exc)) from exc
    log.info("data: %s", data.description)
    model = build_model(
        cfg.model, data.vocab_size, eot_id=data.eot_id, grad_checkpointing=t.grad_checkpointing
    )
    fpt = flops_per_token(model, t.seq_len)
    log.info(
        "model %s: %.2fM parameters, %.3g FLOPs/token",
        cfg.model.name,
        count_params(model) / 1e6,
        fpt,
    )
    return data, model, fpt


def run(cfg: DictConfig, point: str | None = None) -> int:
    """Train once with a composed config; returns the process exit code.

    `point` names a sweep point (see launcher.sweep): the run goes to
    `<sweep_id>/<point>/`, and a point a requeued sweep already completed is not redone.
    """
    check_or_exit(cfg)  # normalizes too; train.py has already checked every point
    rt = start(cfg, point)
    strategy = loop = None
    sinks = nccl_log.transport_recorders(rt)  # before rank 0's sinks: env.json, then metrics
    summary: dict = {}
    code = 0
    if point is not None and cfg.resume == "auto" and already_completed(rt):
        log.info("sweep point %s already completed in %s; not run again", point, rt.run_dir)
        end_job(rt)
        return 0
    lock = None
    try:
        lock = claim_run_dir(rt)  # nothing in the run directory is written before this
        data, model, fpt = build_data_and_model(cfg, rt)
        folders = plan_resume(cfg, rt, model)
        strategy = build_strategy(cfg, rt, model)
        loop = TrainLoop(
            cfg,
            rt,
            strategy,
            data,
            sinks,
            fpt,
            peak_flops(rt.device),
            ckpt_meta=resume.identity(cfg, model, rt.world_size),
        )
        start_step = restore(loop, rt, folders)
        if rt.is_main:
            write_run_files(cfg, rt)
            sinks += [
                JsonlSink(rt.run_dir / "metrics.jsonl", start_step),
                ConsoleSink(cfg.trainer.max_steps, start_step),
            ]
            if wandb_enabled(cfg.logger):
                sinks.append(wandb_sink(cfg, rt, point))
            if tensorboard_enabled(cfg.logger):
                sinks.append(tensorboard_sink(rt, start_step))
        summary = loop.run(start_step)
    except ConfigError as exc:
        (log.error if rt.is_main else log.info)("error: %s", exc)
        code = exit_codes.BAD_INPUT
    except Stopped as stop:
        summary = loop.summary("stopped", stop.step)
        code = exit_codes.STOPPED
    except NonFiniteLoss as exc:
        (log.error if rt.is_main else log.info)("%s", exc)  # every rank stops; one says why
        summary = loop.summary("failed: non-finite loss", exc.step)
        code = exit_codes.NONFINITE
    except OutOfMemory as exc:  # only the ranks that ran out say so, each with its snapshot
        log.error("error: %s", exc)
        summary = loop.summary("failed: out of memory", exc.step)
        code = exit_codes.OOM
    except Exception as exc:
        summary = {"status": f"failed: {type(exc).__name__}: {exc}", "run_id": rt.run_id}
        code = exit_codes.CRASH
        raise
    finally:
        for sink in sinks:
            sink.close(summary)
        if rt.is_main and summary:
            write_summary(rt.run_dir, summary)
        if strategy is not None:
            strategy.close()
        del strategy, loop
        log.info("run %s ended with code %d", rt.run_id, code)
        if lock is not None:
            lock.release()
        end_job(rt)
    return code
