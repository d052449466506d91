"""One training job from a composed config, and the exit code it ends with.

Checks the config against this machine, joins the job, writes the run directory's files,
builds data, model and strategy, resumes, runs the loop, and always leaves summary.json and
a clean process-group teardown behind, whatever happened.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

from omegaconf import DictConfig, OmegaConf

from launcher import checkpoint, envinfo, exit_codes, nccl_log
from launcher.config import ConfigError
from launcher.data import prepare_data
from launcher.loop import NonFiniteLoss, OutOfMemory, Stopped, TrainLoop
from launcher.model import build_model, count_params, flops_per_token, peak_flops
from launcher.preflight import preflight, shm_need
from launcher.runtime import Runtime, end_job, env_world, ranks_per_node, start, sweep_id
from launcher.sinks import ConsoleSink, JsonlSink
from launcher.strategy import build_strategy
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


def resume_candidates(cfg: DictConfig, rt: Runtime) -> list:
    if cfg.resume == "never":
        if checkpoint.candidates(rt.run_dir):
            raise ConfigError(
                f"resume=never but {rt.run_dir} already holds checkpoints; use resume=auto "
                f"to continue, or a new run.id to start fresh"
            )
        return []
    if cfg.resume == "auto":
        return checkpoint.candidates(rt.run_dir)
    return checkpoint.candidates(os.path.expanduser(cfg.resume))


def restore(loop: TrainLoop, rt: Runtime, folders: list) -> int:
    """Load the newest readable checkpoint; every rank must land on the same step."""
    step = 0
    for folder in folders:
        try:
            step = loop.restore(folder)
            break
        except Exception as exc:  # noqa: BLE001 - any unreadable file means: try the previous one
            log.warning(
                "checkpoint %s is unreadable (%s); falling back to the previous one", folder, exc
            )
    steps = {int(s) for (s,) in rt.all_gather_floats([step])}
    if len(steps) != 1:
        raise RuntimeError(f"ranks restored different checkpoints (steps {sorted(steps)})")
    if step:
        log.info("resumed from step %d", step)
    return step


def already_completed(rt: Runtime) -> bool:
    """Whether this run directory holds a completed run (rank 0 decides for all)."""
    done = False
    if rt.is_main:
        path = rt.run_dir / "summary.json"
        done = path.is_file() and json.loads(path.read_text()).get("status") == "completed"
    return rt.broadcast_object(done)


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
    try:
        if rt.is_main:
            write_run_files(cfg, rt)
        folders = resume_candidates(cfg, rt)
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
        strategy = build_strategy(cfg, rt, model)
        loop = TrainLoop(cfg, rt, strategy, data, sinks, fpt, peak_flops(rt.device))
        start_step = restore(loop, rt, folders)
        if rt.is_main:
            sinks += [
                JsonlSink(rt.run_dir / "metrics.jsonl", start_step),
                ConsoleSink(t.max_steps, start_step),
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
            (rt.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        if strategy is not None:
            strategy.close()
        del strategy, loop
        log.info("run %s ended with code %d", rt.run_id, code)
        end_job(rt)
    return code
