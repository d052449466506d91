"""One training job from a checked config, and the exit code it ends with.

Claims the run directory, builds data, model and strategy in order, resumes, runs the loop,
and always leaves summary.json and a clean process-group teardown behind, whatever happened.
Each part is another package's (checkpoint.manager, train.run_files, observe.recorder,
resilience.faults): the job says in which order they come and how a job that raised ends.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time

import torch
from omegaconf import DictConfig

from launcher.checkpoint import memory, resume
from launcher.checkpoint import protocol as checkpoint
from launcher.checkpoint.manager import CheckpointManager, plan_resume
from launcher.config import ConfigError, TrainConfig, typed
from launcher.config.batch import BatchPlan
from launcher.config.model_shape import millions
from launcher.config.registry import build_strategy, engine
from launcher.data.cache import cache_root
from launcher.data.loader import build_train_loader
from launcher.data.prepare import TokenData, prepare_data
from launcher.data.tokenizer import TOKENIZER_DIR
from launcher.model.build import (
    build_model,
    count_params,
    flops_per_token,
    loss_function,
    mfu,
    peak_flops,
)
from launcher.observe.nccl_transport import transport_recorders
from launcher.observe.recorder import Recorder
from launcher.observe.report import deferred, write_report
from launcher.plan import forecast as plan_forecast
from launcher.resilience import bad_hosts, burnin, exit_codes, first_failure
from launcher.resilience.faults import FaultInjector, peer_left
from launcher.resilience.preemption import stopped_by
from launcher.resilience.watchdog import HangWatchdog
from launcher.runtime import disk
from launcher.runtime.launch_clock import wall_seconds
from launcher.runtime.launch_state import LaunchState
from launcher.runtime.lock import RunLock
from launcher.runtime.placement import node_name, ranks_per_node
from launcher.runtime.process import Runtime, RuntimeConfig, end_job, freeze_what_lasts, start
from launcher.train.loop import LoopConfig, Stopped, TrainLoop
from launcher.train.micro_batch import OutOfMemory
from launcher.train.nonfinite import NonFiniteLoss
from launcher.train.run_files import (
    already_completed,
    claim_run_dir,
    open_rank0_sinks,
    write_summary_if_room,
)

log = logging.getLogger("launcher")


def forecast_of(cfg: TrainConfig, rt: Runtime, vocab_size: int, start_step: int) -> dict | None:
    """The plan's forecast of this run over the steps it has left after `start_step`
    (launcher.plan.forecast.at_start), said in one line: summary.json keeps it beside what
    the run measured. Rank 0's alone, which says and writes both: no other rank reads the
    run directory's earlier figures for it."""
    if not rt.is_main:
        return None
    on_gpu = rt.device.type == "cuda"
    name = torch.cuda.get_device_name(rt.device) if on_gpu else None
    made = plan_forecast.at_start(cfg, rt.world_size, ranks_per_node(), name, vocab_size,
                                  rt.run_dir, start_step)  # fmt: skip
    log.info("%s", plan_forecast.line(made))
    return made


def build_data_and_model(cfg: TrainConfig, rt: Runtime):
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
    except Exception as exc:  # tokenizers reports a full disk in a plain Exception
        cache = cache_root(cfg.data.cache_dir)
        if not disk.is_full(exc, cache):
            raise
        raise ConfigError(disk.no_space_line("the data cache", cache, None)) from exc
    log.info("data: %s", data.description)
    model = build_model(
        cfg.model,
        data.vocab_size,
        eot_id=data.eot_id,
        grad_checkpointing=t.grad_checkpointing,
        device=rt.device,  # made there: no whole copy per rank in the node's host memory
    )
    fpt = flops_per_token(model, t.seq_len)
    log.info("model %s: %s parameters, %.3g FLOPs/token", cfg.model.name,
             millions(count_params(model)), fpt)  # fmt: skip
    return data, model, fpt


def run(cfg: DictConfig, launch: LaunchState, point: str | None = None) -> int:
    """Train once with a composed config that the front door has checked and normalised
    (`check_or_exit`, or launcher.tune's `preflight`); returns the process exit code. The
    job's components read it as the schema's dataclasses (`typed`), converted here once.

    `launch` holds what outlives this job (the process group a sweep's points share).
    `point` names a sweep point: the run goes to `<sweep_id>/<point>/`, and a point a
    requeued sweep already completed is not redone.
    """
    freeze_what_lasts()  # before the job makes anything: its collections then walk its own
    cfg = typed(cfg)
    needs_group = engine(cfg.strategy.name).capabilities.needs_process_group
    rt = start(RuntimeConfig.of(cfg), launch, point, needs_group=needs_group)
    if point is not None and cfg.resume == "auto" and already_completed(rt):
        log.info("sweep point %s already completed in %s; not run again", point, rt.run_dir)
        end_job(rt)
        return exit_codes.DONE
    job = Job(cfg, rt, point)
    code, summary = exit_codes.CRASH, {}
    try:
        summary = job.train()
        code = exit_codes.DONE
    except Exception as exc:
        code, summary = job.ending(exc)
        expected = isinstance(exc, checkpoint.CheckpointNotWritten) or job.peer_left
        if code == exit_codes.CRASH and not expected:
            raise
    finally:
        job.close(summary, code)
    if job.peer_left:  # the process group is broken: no later sweep point can use it
        raise SystemExit(code)
    return code


# How a job that raised ends: exit code, summary.json's status, and which ranks say why
# ("main": rank 0, as every rank stops for the same reason; "own": each rank that raised).
ENDINGS: dict[type, tuple[int, str, str | None]] = {
    Stopped: (exit_codes.STOPPED, "stopped", None),
    NonFiniteLoss: (exit_codes.NONFINITE, "failed: non-finite loss", "main"),
    OutOfMemory: (exit_codes.OOM, "failed: out of memory", "own"),
}


class Job:
    """One training job's parts, built in order, and torn down whatever happened."""

    def __init__(self, cfg: TrainConfig, rt: Runtime, point: str | None):
        self.cfg, self.rt, self.point = cfg, rt, point
        self.sinks = transport_recorders(rt)  # before rank 0's sinks: env.json, then metrics
        self.lock: RunLock | None = None
        self.strategy = self.loop = self.recorder = None
        self.gate: dict | None = None  # the burn-in gate's report, when it ran
        self.forecast: dict | None = None  # launcher.plan's, printed at the start
        self.watchdog: HangWatchdog | None = None
        # Whether this launch decided to train here (the resume decision): only then is
        # the run directory's summary.json its own to replace. A failure before (a crash
        # in start-up, a refusal) leaves a finished run's summary.json as it was.
        self.owns_history = False
        self.started = time.time()  # a fault marker since then is this launch's
        self.peer_left = False  # a peer left on purpose (fault.kind=exit): say so, no traceback

    def train(self) -> dict:
        """Claim the run directory, build, resume, run the loop; the end-of-run summary."""
        cfg, rt = self.cfg, self.rt
        self.lock = claim_run_dir(rt, cfg.run)  # nothing in the run directory is written before
        exit_codes.report_start(rt.run_dir, rt.launch.attempt)  # this node's heartbeat: its ranks
        first_failure.watch(rt.run_dir, rt.rank)
        self.watchdog = HangWatchdog(  # start-up, then the loop's phases (on_hang: the loop's)
            cfg.watchdog,
            rank=rt.rank,
            run_dir=rt.run_dir,
            start_step=0,
            on_hang=self._hang_in_start_up,
            async_writes=cfg.trainer.async_checkpoint,
            record_culprits=cfg.exclude.hang,
        )
        faults = FaultInjector(cfg.fault, rank=rt.rank, run_dir=rt.run_dir)
        faults.phase("start-up")
        self.gate = burnin.gate(cfg.burnin, faults, rt, record=cfg.exclude.burnin)
        data, model, fpt = build_data_and_model(cfg, rt)
        tier = memory.open_tier(cfg, rt, model)
        folders = plan_resume(cfg, rt, model, tier)
        if folders is None:
            return {}  # finished already: nothing is trained, summary.json stays as it is
        self.owns_history = True
        self.strategy = build_strategy(cfg.strategy, cfg.trainer, rt, model)
        identity = resume.identity(cfg, model, rt.world_size)
        checkpoints = CheckpointManager(rt, self.strategy, cfg.trainer, identity, tier)
        batch = BatchPlan.of(cfg.trainer, rt.world_size)
        peak = peak_flops(rt.device)
        self.recorder = Recorder(rt, cfg.trainer, self.sinks, batch.tokens_per_step, fpt,
                                 lambda tps: mfu(tps, fpt, peak, rt.world_size),
                                 batch.micro_batch)  # fmt: skip
        self.loop = TrainLoop(LoopConfig.of(cfg), rt, self.strategy, loss_function(cfg.model),
                              loader_opener(cfg, rt, data), data.val, self.recorder, checkpoints,
                              faults)  # fmt: skip
        start_step = checkpoints.resume(folders, cfg.resume == "auto", batch)
        self.forecast = forecast_of(cfg, rt, data.vocab_size, start_step)
        if rt.is_main and data.save_tokenizer is not None:  # for launcher.generate and export
            data.save_tokenizer(rt.run_dir / TOKENIZER_DIR)  # once the run is this launch's
        self.sinks += open_rank0_sinks(cfg, rt, self.point, start_step, self.gate)
        summary = self.loop.run(start_step, self.watchdog)
        if self.gate is not None:
            summary["burnin/seconds"] = self.gate["seconds"]
        return summary

    def ending(self, exc: Exception) -> tuple[int, dict]:
        """The exit code and summary of a job that raised `exc` (CRASH: re-raise it)."""
        rt = self.rt
        if isinstance(exc, ConfigError):  # every rank found it; rank 0 prints the one line
            (log.error if rt.is_main else log.info)("error: %s", exc)
            return exit_codes.BAD_INPUT, {}
        if isinstance(exc, burnin.BadNode):  # every rank raised it, before any step
            (log.error if rt.is_main else log.info)("%s", exc)
            refused = {"status": "refused: bad node", "run_id": rt.run_id}
            return exit_codes.BAD_NODE, {**refused, "burnin/seconds": exc.seconds}
        if isinstance(exc, checkpoint.CheckpointNotWritten):  # every rank raised it together
            (log.error if rt.is_main else log.info)("error: %s", exc)
            if exc.disk_full:  # a retry fails the same way until someone frees space
                return exit_codes.BAD_INPUT, self.recorder.summary("failed: disk full", exc.step)
            return exit_codes.CRASH, self.recorder.summary(f"failed: {exc}", exc.step)
        for kind, (code, status, who) in ENDINGS.items():
            if isinstance(exc, kind):
                if who == "own":
                    log.error("error: %s", exc)
                elif who == "main":
                    (log.error if rt.is_main else log.info)("%s", exc)
                return code, self.recorder.summary(status, exc.step)
        # A peer that left on purpose (fault.kind=exit) broke the process group: no later
        # sweep point can use it. What the job says is the first failure's (_crashed).
        self.peer_left = peer_left(rt.run_dir, rt.rank, self.started) is not None
        return exit_codes.CRASH, self._crashed(exc)

    def _crashed(self, exc: Exception) -> dict:
        """summary.json of a crash: the first failing rank of the job, its step and line
        (launcher.resilience.first_failure), said once; the loop's figures so far."""
        done = self.watchdog.step if self.watchdog is not None else None
        failing = done + 1 if self.loop is not None and done is not None else None
        failed = first_failure.settle(exc, failing, self.rt.is_main)
        if self.cfg.exclude.device_error and bad_hosts.is_device_error(exc):
            at = f" at step {failing}" if failing is not None else ""
            why = f"device error: rank {self.rt.rank}{at}: {first_failure.one_line(exc)}"
            bad_hosts.record(self.rt.run_dir, {node_name(): why})
        with contextlib.suppress(AttributeError):  # an exception type without a __dict__
            exc.launcher_settled = True  # the front door logs no traceback on the terminal
        ran = self.recorder is not None and self.recorder.start_time is not None  # steps began
        figures = self.recorder.summary(failed["status"], done) if ran else {}
        return {**figures, **failed, "run_id": self.rt.run_id}

    def _hang_in_start_up(self, step: int) -> None:
        """Before the loop takes the watchdog over: rank 0's summary.json says so, as the
        loop's does for a hang in a later phase."""
        if self.rt.is_main and self.may_write_summary():
            status = {"status": "failed: hang detected", "run_id": self.rt.run_id}
            write_summary_if_room(self.rt.run_dir, status)

    def may_write_summary(self) -> bool:
        """summary.json is this launch's to write once it decided to train here, or when
        there is none yet (a fresh directory's failure at start-up is recorded)."""
        summary = self.rt.run_dir / "summary.json"
        return self.owns_history or not (summary.exists() or summary.is_symlink())

    def close(self, summary: dict, code: int) -> None:
        """Close the sinks (with the summary), write summary.json, drop the engine, release
        the lock, end the job's logging; the process group stays for the next job."""
        rt = self.rt
        try:
            if self.watchdog is not None:
                self.watchdog.close()  # the loop has, unless the job ended before it
            if summary:  # the plan's forecast beside what the run measured, in every sink
                summary = {**summary, "exit_code": code, "forecast": self.forecast}
            later = deferred(code, stopped_by()) if self.cfg.run.report else None
            drawn = rt.is_main and summary and self.cfg.run.report and not later
            images = write_report(rt.run_dir, summary) if drawn else {}
            if summary:  # to the last write: the closing block, W&B, TensorBoard, summary.json
                summary["wall_time_s"] = wall_seconds(rt.launch.job_started)
            for sink in self.sinks:
                sink.log_images(images)
                sink.close(summary)
            if rt.is_main and summary and self.may_write_summary():
                write_summary_if_room(rt.run_dir, summary)
            if self.strategy is not None:
                self.strategy.close()
            self.strategy = self.loop = self.recorder = None
            log.info("run %s ended with code %d", rt.run_id, code, extra=first_failure.FILE_ONLY)
        finally:
            first_failure.forget()
            if self.lock is not None:
                self.lock.release()
            if self.watchdog is not None:  # it holds the loop (on_hang), the loop the model
                self.watchdog.retire()
                self.watchdog = None
            end_job(rt)


def loader_opener(cfg: TrainConfig, rt: Runtime, data: TokenData):
    """This rank's training loader with the run's data settings, opened by the loop with its
    batch plan (its micro-batch may change in-process: trainer.on_oom=retry) at the step it
    starts from (see launcher.data.build_train_loader)."""
    d = cfg.data
    return functools.partial(
        build_train_loader,
        data.train,
        rank=rt.rank,
        seed=cfg.trainer.seed,
        num_workers=d.num_workers,
        pin_memory=d.pin_memory and rt.device.type == "cuda",
        persistent_workers=d.persistent_workers,
        prefetch_factor=d.prefetch_factor,
    )
