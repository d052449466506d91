"""The one training loop, whatever the strategy: accumulate, step, measure, log, checkpoint.

It says when; its parts say how: the checkpoints (launcher.checkpoint.manager), the records
and summary (launcher.observe.recorder), the non-finite policy (nonfinite), the micro-batch
that fits (micro_batch), the eval (evaluate) and the rehearsed faults, fired at their hook
points (launcher.resilience.faults). Nothing here waits for the device except at log, eval
and checkpoint steps: losses and the non-finite flag accumulate as device tensors, and step
times as events (see launcher.observe.metrics).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerAction
from torch.utils.data import DataLoader, Dataset

from launcher.checkpoint.manager import CheckpointManager
from launcher.config.batch import AUTO, BatchPlan
from launcher.config.schema import (
    ExcludeConfig,
    ProfilerConfig,
    TrainConfig,
    TrainerConfig,
    WatchdogConfig,
)
from launcher.data.loader import end_workers, stop_signals_held
from launcher.model.build import LossFunction
from launcher.observe import memory_snapshot
from launcher.observe.metrics import Interval, StepTimer, local_figures, reset_host_peak
from launcher.observe.profiling import build_profiler, step_region
from launcher.observe.recorder import Recorder
from launcher.observe.sinks import write_summary
from launcher.resilience.faults import FaultInjector
from launcher.resilience.stop_vote import StopVote
from launcher.resilience.stragglers import StragglerWatch
from launcher.resilience.watchdog import HangWatchdog
from launcher.runtime.placement import node_name
from launcher.runtime.process import Runtime
from launcher.strategy.base import Strategy
from launcher.train import micro_batch
from launcher.train.evaluate import Evaluator
from launcher.train.nonfinite import NonFinite, Rewound

log = logging.getLogger("launcher")


class Stopped(Exception):
    """A stop was requested (SIGTERM); the checkpoint of `step` is complete."""

    def __init__(self, step: int):
        super().__init__(f"stopped on request after step {step}")
        self.step = step


def lr_at(step: int, tcfg: TrainerConfig) -> float:
    """Linear warm-up to trainer.lr, then cosine decay to lr * min_lr_ratio at
    trainer.lr_decay_steps (default: max_steps), flat after it."""
    if step < tcfg.warmup_steps:
        return tcfg.lr * (step + 1) / tcfg.warmup_steps
    decay_steps = tcfg.lr_decay_steps or tcfg.max_steps
    span = max(decay_steps - tcfg.warmup_steps, 1)
    progress = min((step - tcfg.warmup_steps) / span, 1.0)
    min_lr = tcfg.lr * tcfg.min_lr_ratio
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (tcfg.lr - min_lr)


@dataclass
class LoopConfig:
    """The sections of the checked config the loop reads: its own numbers (`trainer`), how
    to profile and to watch for stragglers. The loss comes from the model, the data as a
    loader, the rehearsed fault as an injector, all built by the job."""

    trainer: TrainerConfig
    profiler: ProfilerConfig
    watchdog: WatchdogConfig
    exclude: ExcludeConfig  # a persistent straggler's host to bad_hosts (exclude.straggler)

    @classmethod
    def of(cls, cfg: TrainConfig) -> LoopConfig:
        return cls(cfg.trainer, cfg.profiler, cfg.watchdog, cfg.exclude)


# open_loader(plan, start_step=..., skip_windows=..., wrap_windows=...): this rank's training
# batches of `plan` in step order from the data window `start_step`, past `skip_windows`
# (launcher.data.build_train_loader with the run's data settings).
OpenLoader = Callable[..., DataLoader]


class TrainLoop:
    """One job's steps: built by the job with its parts, run once (`run`)."""

    def __init__(
        self,
        cfg: LoopConfig,
        rt: Runtime,
        strategy: Strategy,
        loss: LossFunction,
        open_loader: OpenLoader,
        val: Dataset,
        recorder: Recorder,
        checkpoints: CheckpointManager,
        faults: FaultInjector,
    ):
        self.cfg, self.t, self.rt = cfg, cfg.trainer, rt
        self.strategy, self.open_loader = strategy, open_loader
        self.recorder, self.checkpoints, self.faults = recorder, checkpoints, faults
        self.batch = BatchPlan.of(self.t, rt.world_size)
        # the checkpoints' agreements between steps ride on the vote: no gather of their own
        self.stop = StopVote(rt.control_group, riders=[checkpoints])
        self.stragglers = StragglerWatch(cfg.watchdog, announce=rt.is_main)
        if cfg.exclude.straggler:  # each rank's host, on rank 0, which names the straggler
            self.stragglers.keep_off(cfg.exclude.straggler_intervals,
                                     rt.gather_objects(node_name()), rt.run_dir)  # fmt: skip
        self.nonfinite = NonFinite(self.t, rt, checkpoints, recorder)
        self.evaluate = Evaluator(rt, strategy, val, self.t.eval_batches, loss, self.stop.poll)
        self.micro = micro_batch.MicroSteps(rt, strategy, loss, faults, self.t.on_oom == "retry")
        self.watchdog: HangWatchdog | None = None
        self.step = 0  # the last step trained

    def run(self, start_step: int, watchdog: HangWatchdog) -> dict:
        """Train from `start_step` to trainer.max_steps under `watchdog` (started by the
        job for its start-up; closed here when the steps end)."""
        self._begin(start_step, watchdog)
        profiler = build_profiler(self.cfg.profiler, self.rt)
        try:
            with contextlib.ExitStack() as recording:
                if profiler is not None:
                    recording.enter_context(profiler)
                while self.step < self.t.max_steps:
                    self._one_step(profiler)
                ending = recording.pop_all()
            # The end of the run: the profiler's final close writes the last trace (as long
            # as a flush), then the replicas are compared.
            with self._phase("end of run"):
                ending.close()
                self.recorder.compare_replicas(self.strategy.replica_fingerprint())
            self.checkpoints.close_memory(remove=True)
        except Stopped:
            self.checkpoints.close_memory(remove=True)  # the stop's durable checkpoint is whole
            raise
        except torch.OutOfMemoryError as exc:
            raise micro_batch.out_of_memory(exc, self.step + 1, self.rt) from None
        finally:
            self._end(profiler)
        return self.recorder.summary("completed", self.step)

    def _begin(self, start_step: int, watchdog: HangWatchdog) -> None:
        """Before the first step: the micro-batch that fits (auto), the loader at the data
        window the run continues from, the peaks reset, the watchdog's steps begun."""
        if self.checkpoints.data_step is None:
            self.checkpoints.data_step = start_step
        self.timer = StepTimer(self.rt.device)
        self.interval = Interval()
        self.recorder.begin(start_step)
        self.start_step = self.step = start_step
        self.strategy.module.train()
        if self.t.micro_batch_size == AUTO:
            self._search_micro_batch(start_step + 1)
        self._open_batches()
        if self.rt.device.type == "cuda":  # mem/peak_gb is this run's peak, not the process's
            torch.cuda.reset_peak_memory_stats(self.rt.device)
        # and so is mem/host_peak_gb, where Linux allows: after a collection of the build's
        # garbage (what outlives the job was frozen before it: runtime.freeze_what_lasts)
        reset_host_peak()
        self.watchdog = watchdog
        watchdog.on_hang = self._on_hang
        watchdog.begin_steps(start_step)

    def _end(self, profiler) -> None:
        """Whatever happened: the loader's workers ended first (nothing below needs them,
        and after a failed step the vote's drain below raises too), the watchdog closed."""
        self._close_batches()
        self.checkpoints.close_memory(remove=False)  # kept for the restart that resumes from it
        self.watchdog.close()
        snapshots = profiler is not None and self.cfg.profiler.memory_snapshot
        if snapshots and self.rt.device.type == "cuda":
            memory_snapshot.stop_history()
        self.stop.drain()

    @contextlib.contextmanager
    def _phase(self, name: str, **allowance):
        """A phase the hang watchdog times on its own allowance, where a rehearsed fault may
        fire (fault.kind=slow_phase)."""
        with self.watchdog.phase(name, **allowance):
            self.faults.phase(name)
            yield

    def _one_step(self, profiler) -> None:
        """Train the next step and do what comes after it; a rewind goes back instead."""
        lr = lr_at(self.step, self.t)
        try:
            with step_region(profiler, self.step + 1):
                self._train_step(self.step, lr)
        except Rewound as rewound:
            self.step = rewound.step
            return
        self.step += 1
        if profiler is not None:
            self._profiler_step(profiler)
        self._after_step(self.step, lr)
        self.watchdog.step_done(self.step)

    def _profiler_step(self, profiler) -> None:
        """Advance the profiler's schedule. The step that ends a recording writes its trace
        (seconds to minutes for a large one): that is the `profiler flush` phase, with its
        own allowance, not a step that the hang watchdog would time."""
        if profiler.current_action != ProfilerAction.RECORD_AND_SAVE:
            profiler.step()
            return
        with self._phase("profiler flush"):
            profiler.step()

    def _on_hang(self, step: int) -> None:
        """Runs in the watchdog thread just before the process exits with the hang code."""
        if self.rt.is_main:
            write_summary(self.rt.run_dir, self.recorder.summary("failed: hang detected", step))

    # -- a step ------------------------------------------------------------------------
    def _train_step(self, step: int, lr: float) -> None:
        """One optimizer step: accumulate over micro-batches, then step at `lr`."""
        self.timer.start()
        if step == self.start_step:
            self.faults.phase("first step")
        self.faults.before_step(step + 1)
        window = next(self.windows)
        losses = self.micro.accumulate(step + 1, self.batch, self.batches, self.interval)
        while losses is None:  # trainer.on_oom=retry: a rank ran out of memory; all redo it
            self._resize(self.micro.smaller(self.batch, step + 1))
            self.recorder.oom_retries += 1
            self._close_batches()  # its workers end before the new loader's start
            self._open_batches()  # at the same data window: the same sequences
            window = next(self.windows)
            losses = self.micro.accumulate(step + 1, self.batch, self.batches, self.interval)
        self.checkpoints.data_step = window + 1
        self.faults.end_step(step + 1)
        bad_ranks = self.nonfinite.bad_ranks(losses)
        if bad_ranks:
            self.strategy.drop_step()
            self.nonfinite.skip(step + 1, bad_ranks, self.interval)
            if self.t.on_nonfinite == "rewind":
                raise self._rewind(step + 1, bad_ranks)
        else:
            for loss in losses:
                self.interval.add_loss(loss)
            self.interval.grad_norm = self.strategy.step(lr)
        self.timer.stop()
        self.interval.end_step()

    def _search_micro_batch(self, step: int) -> None:
        """trainer.micro_batch_size=auto: the largest micro-batch that fits on every rank."""
        try:
            self._resize(self.micro.fitting(self.batch, step, self.t.seq_len))
        except torch.OutOfMemoryError as exc:
            self.checkpoints.close_memory(remove=False)
            raise micro_batch.out_of_memory(exc, step, self.rt) from None

    def _resize(self, plan: BatchPlan) -> None:
        self.batch = plan
        self.recorder.micro_batch = plan.micro_batch

    def _open_batches(self) -> None:
        """This rank's micro-batches from the data window the next step reads on, past the
        windows a rewind skipped, and the windows' indices in the order they are read."""
        position = self.checkpoints
        self.loader = self.open_loader(
            self.batch,
            start_step=position.data_step,
            skip_windows=frozenset(position.skip_windows),
            wrap_windows=self.faults.wrap_windows,
        )
        self.windows = self.loader.batch_sampler.windows()
        with stop_signals_held():  # workers start deaf to a stop meant for the trainer
            self.batches = iter(self.loader)

    def _close_batches(self) -> None:
        """The loader's workers ended now (launcher.data.loader.end_workers), and the loader
        let go."""
        end_workers(self.loader, self.batches)
        del self.batches, self.loader

    def _rewind(self, step: int, ranks: list[int]) -> Rewound:
        """Restore the newest complete checkpoint and go on from it, past the data window
        that made step `step` bad."""
        folder, window = self.nonfinite.rewind_target(step, ranks)
        self._close_batches()  # its workers end before the new loader's start
        back_to = self.checkpoints.restore(folder, self.batch)
        self.timer.drain()
        self.interval = Interval()
        self._open_batches()
        if self.rt.is_main:
            log.warning(
                "rewound to step %d (%s) after the non-finite step %d; data window %d is "
                "skipped", back_to, folder.name, step, window,
            )  # fmt: skip
        return Rewound(back_to)

    # -- between steps -----------------------------------------------------------------
    def _after_step(self, step: int, lr: float) -> None:
        t = self.t
        last = step == t.max_steps
        self.checkpoints.step_done(step)
        record: dict = {}
        # An interval whose every step was dropped (on_nonfinite=skip) has no loss to log: its
        # time is logged with the next interval's.
        if (step % t.log_interval == 0 or last) and self.interval.loss_sum is not None:
            record.update(self._interval_record(step, lr))
        stopping = False
        if t.eval_interval and (step % t.eval_interval == 0 or last):
            # The eval's allowance is its batches times the measured step time; a stop
            # during it is acted on within a batch, inside torchrun's shutdown window.
            with self._phase("eval", batches=t.eval_batches, step=step):
                evaluated = self.evaluate(step, self.batch)
            stopping = evaluated is None
            record.update(evaluated or {})
        if record:
            self.recorder.log(record)
        if not last and (stopping or self.stop.poll()):
            self._save(step, wait=True)
            raise Stopped(step)
        if self.checkpoints.durable_due(step, last):
            self._save(step, wait=last)
        elif not last and self.checkpoints.memory_due(step):
            self.nonfinite.check(step, self.interval)
            self.checkpoints.save_to_memory(step, self.batch)

    def _interval_record(self, step: int, lr: float) -> dict:
        figures = local_figures(
            self.interval, self.timer.drain(), self.strategy.drain_comm(), self.rt.device
        )
        agg = self.recorder.merge(step, figures)
        if agg.nonfinite_ranks:
            self.nonfinite.stop(step, agg.nonfinite_ranks)
        steps, self.interval = self.interval.steps, Interval()
        stragglers = self.stragglers.update(agg.figures)
        return self.recorder.interval(step, lr, agg, steps, stragglers,
                                      self.strategy.comm_buckets())  # fmt: skip

    def _save(self, step: int, wait: bool) -> None:
        """A durable checkpoint of `step` (see CheckpointManager.save), refused when a rank's
        loss is not finite."""
        self.nonfinite.check(step, self.interval)
        with self._phase("checkpoint", step=step):
            self.checkpoints.save(step, self.batch, wait)
