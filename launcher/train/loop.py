"""The one training loop, whatever the strategy: accumulate, step, measure, log, checkpoint.

Nothing here waits for the device except at log, eval and checkpoint steps: losses and
the non-finite flag accumulate as device tensors, and step times as events (see metrics).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerAction
from torch.utils.data import DataLoader, Dataset

from launcher.checkpoint import protocol as checkpoint
from launcher.checkpoint.memory import MemoryTier
from launcher.config.batch import AUTO, BatchPlan
from launcher.config.schema import (
    FaultConfig,
    ProfilerConfig,
    TrainConfig,
    TrainerConfig,
    WatchdogConfig,
)
from launcher.data import build_eval_batches
from launcher.data.loader import stop_signals_held
from launcher.model.build import attention_backend, mfu, model_loss
from launcher.observe import memory_snapshot
from launcher.observe.metrics import (
    KIND_STEMS,
    KIND_SUFFIXES,
    Interval,
    StepTimer,
    aggregate,
    local_figures,
    reset_host_peak,
)
from launcher.observe.profiling import build_profiler, step_region, trace_dir
from launcher.observe.sinks import Sink, write_summary
from launcher.resilience.bad_steps import BadSteps
from launcher.resilience.faults import FaultInjector, slow_phase
from launcher.resilience.preemption import StopVote
from launcher.resilience.stragglers import StragglerWatch
from launcher.resilience.watchdog import HangWatchdog
from launcher.runtime.process import Runtime
from launcher.strategy.base import Strategy
from launcher.train import micro_batch

log = logging.getLogger("launcher")


# Communication figures summary.json holds (medians over the steady intervals).
SUMMARY_COMM_KEYS = (
    "comm/allreduce_s",
    "comm/exposed_s",
    "comm/bytes",
    "comm/busbw_gbps",
    "comm/overhead_frac",
    *(stem + suffix for stem in KIND_STEMS.values() for suffix in KIND_SUFFIXES),
)


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or infinite; the run stops without saving a checkpoint."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


class OutOfMemory(RuntimeError):
    """The device ran out of memory; the message names the snapshot written for it."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


class _Rewound(Exception):
    """trainer.on_nonfinite=rewind restored checkpoint `step`: the loop goes on from it."""

    def __init__(self, step: int):
        super().__init__(f"rewound to step {step}")
        self.step = step


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
    to profile, to watch for hangs and to rehearse faults, and which GPT-2 computes the
    loss. The data it reads comes as a loader, built by the job."""

    trainer: TrainerConfig
    profiler: ProfilerConfig
    watchdog: WatchdogConfig
    fault: FaultConfig
    impl: str  # model.impl
    attention: str  # model.attention

    @classmethod
    def of(cls, cfg: TrainConfig) -> LoopConfig:
        m = cfg.model
        return cls(cfg.trainer, cfg.profiler, cfg.watchdog, cfg.fault, m.impl, m.attention)


# open_loader(plan, start_step=..., wrap_windows=...): this rank's training batches of `plan`
# in step order from `start_step` (launcher.data.build_train_loader with the run's data
# settings).
OpenLoader = Callable[..., DataLoader]


class TrainLoop:
    def __init__(
        self,
        cfg: LoopConfig,
        rt: Runtime,
        strategy: Strategy,
        open_loader: OpenLoader,
        val: Dataset,
        sinks: list[Sink],
        flops_per_token: float,
        peak_flops: float | None,
        ckpt_meta: dict | None = None,
        memory: MemoryTier | None = None,
    ):
        self.cfg, self.t, self.rt = cfg, cfg.trainer, rt
        self.impl = cfg.impl
        self.strategy = strategy
        self.open_loader = open_loader
        self.val = val
        self.sinks = sinks
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops
        self.batch = BatchPlan.of(self.t, rt.world_size)
        self.accum = self.batch.accum
        self.tokens_per_step = self.batch.tokens_per_step
        self.records: list[dict] = []
        self.steps_done: int | None = None  # the last step trained, once the steps began
        self.ckpt = checkpoint.CheckpointWriter(
            rt.run_dir / "checkpoints",
            is_main=rt.is_main,
            barrier=rt.barrier,
            keep=self.t.keep_checkpoints,
            meta=ckpt_meta,
            gather=rt.all_gather_objects,
            rank=rt.rank,
            world_size=rt.world_size,
        )
        self.memory = memory  # the memory tier (launcher.checkpoint.memory), when on
        if memory is not None:  # rank 0's lineage, which the durable meta.json records
            memory.follow(rt.broadcast_object(self.ckpt.meta["lineage"]))
        self.stop = StopVote(rt.control_group)
        self.fault = FaultInjector(cfg.fault, rank=rt.rank, run_dir=rt.run_dir)
        self.stragglers = StragglerWatch(cfg.watchdog, announce=rt.is_main)
        self.bad_steps = BadSteps(self.t.max_bad_steps, self.t.bad_step_window)
        # The data window (0-based, one step's sequences) the next step reads: ahead of the
        # step by the windows on_nonfinite=rewind skipped (kept in the checkpoint meta).
        self.data_step: int | None = None
        self.skip_windows: set[int] = set()  # windows a rewind skips when it comes to them
        self.rewinds = 0
        self.oom_retries = 0  # steps redone at a smaller micro-batch (trainer.on_oom=retry)
        self.oom_ranks: list[int] = []  # the ranks that ran out of memory in this step
        self.watchdog: HangWatchdog | None = None
        self.replicas_in_sync: bool | None = None

    # -- checkpoints -------------------------------------------------------------------
    def restore(self, folder: Path) -> int:
        """Load model, optimizer, scaler and RNG state; return the step to continue from.

        The checkpoints this run writes continue the loaded one's lineage (see
        checkpoint.CheckpointWriter)."""
        self.strategy.load(folder)
        self.ckpt.adopt(folder)
        if self.memory is not None:
            self.memory.follow(self.ckpt.meta["lineage"])
        meta = checkpoint.read_meta(folder) or {}
        self._note_world_change(meta)
        step = checkpoint.step_of(folder)
        self.data_step = meta.get("data_step", step)
        rng_file = folder / f"rng_rank{self.rt.rank}.pt"
        if rng_file.exists():
            state = torch.load(rng_file, weights_only=False)
            torch.set_rng_state(state["torch"])
            random.setstate(state["python"])
            np.random.set_state(state["numpy"])
            if state.get("cuda") is not None and torch.cuda.is_available():
                torch.cuda.set_rng_state(state["cuda"], self.rt.device)
        else:
            log.warning(
                "%s has no RNG state for rank %d (written by fewer ranks); this rank keeps its own",
                folder,
                self.rt.rank,
            )
        return step

    def _note_world_change(self, meta: dict) -> None:
        """Say once (rank 0) that the run continues at another world size: the global batch
        and the data order stay; accumulation makes up the difference."""
        old = meta.get("world_size")
        if not self.rt.is_main or old is None or old == self.rt.world_size:
            return
        log.warning(
            "world size changed from %d to %d rank(s) since this checkpoint: gradient "
            "accumulation %s -> %d micro-steps per rank (global batch %d sequences, same data "
            "order)",
            old,
            self.rt.world_size,
            meta.get("accum", "?"),
            self.accum,
            self.batch.global_batch,
        )

    def files_to_load(self, folder: Path) -> list[Path]:
        """What `restore(folder)` reads on this rank."""
        rng_file = folder / f"rng_rank{self.rt.rank}.pt"
        return self.strategy.files_to_load(folder) + ([rng_file] if rng_file.exists() else [])

    def _rng_state(self) -> dict:
        cuda = torch.cuda.get_rng_state(self.rt.device) if self.rt.device.type == "cuda" else None
        return {
            "torch": torch.get_rng_state(),
            "cuda": cuda,
            "python": random.getstate(),
            "numpy": np.random.get_state(),
        }

    def _write_checkpoint(self, folder: Path):
        pending = self.strategy.save(folder, self.rt.rank)  # a future when asynchronous
        torch.save(self._rng_state(), folder / f"rng_rank{self.rt.rank}.pt")
        return pending

    def _progress(self, step: int) -> dict:
        """What meta.json records of the run's progress at `step`, in either tier."""
        return {
            "world_size": self.rt.world_size,
            "accum": self.accum,
            "micro_batch": self.batch.micro_batch,  # what ran (micro_batch_size=auto, retry)
            "tokens": step * self.tokens_per_step,
            "data_step": self.data_step,
        }

    def save(self, step: int, wait: bool = False) -> None:
        """Checkpoint `step`; with trainer.async_checkpoint the files are written while
        training goes on, unless `wait` (a stop, the end of the run)."""
        self._check_finite(step)
        with self.watchdog.phase("checkpoint", step=step):
            slow_phase(self.cfg.fault, "checkpoint")
            self.ckpt.save(step, self._write_checkpoint, self._progress(step))
            if wait:
                self.ckpt.complete()

    def save_to_memory(self, step: int) -> None:
        """A memory-tier checkpoint of `step`: the state is copied now, between two steps,
        and written by the tier's thread while the next step runs (sealed after it)."""
        self._check_finite(step)
        write_state = self.strategy.snapshot(self.rt.rank, self.memory.share)
        rng, rng_file = self._rng_state(), f"rng_rank{self.rt.rank}.pt"

        def write(folder: Path) -> None:
            write_state(folder)
            torch.save(rng, folder / rng_file)

        self.memory.save(step, write, self._progress(step))

    def _check_finite(self, step: int) -> None:
        """Collective check, so that every rank refuses together."""
        bad = self.interval.nonfinite
        flags = self.rt.all_gather_floats([float(bad.item()) if bad is not None else 0.0])
        ranks = [r for r, (flag,) in enumerate(flags) if flag]
        if ranks:
            self._nonfinite(step, ranks)

    def _nonfinite(self, step: int, ranks: list[int], why: str = ""):
        self.ckpt.complete()  # an asynchronous save of an earlier, finite step counts
        latest = checkpoint.find_resumable(self.rt.run_dir)
        kept = f"the last good checkpoint {latest} is kept" if latest else "no checkpoint was saved"
        raise NonFiniteLoss(
            f"non-finite loss by step {step} on rank(s) {ranks}{why}: the run stopped and {kept}; "
            "lower trainer.lr, keep trainer.grad_clip > 0, or use trainer.precision=bf16 "
            "rather than fp16",
            step,
        )

    def _profiler_step(self, profiler) -> None:
        """Advance the profiler's schedule. The step that ends a recording writes its trace
        (seconds to minutes for a large one): that is the `profiler flush` phase, with its
        own allowance, not a step that the hang watchdog would time."""
        if profiler.current_action != ProfilerAction.RECORD_AND_SAVE:
            profiler.step()
            return
        with self.watchdog.phase("profiler flush"):
            slow_phase(self.cfg.fault, "profiler flush")
            profiler.step()

    # -- the loop ----------------------------------------------------------------------
    def run(self, start_step: int, watchdog: HangWatchdog) -> dict:
        """Train from `start_step` to trainer.max_steps under `watchdog` (started by the
        job for its start-up; closed here when the steps end)."""
        t, rt = self.t, self.rt
        if self.data_step is None:
            self.data_step = start_step
        timer = StepTimer(rt.device)
        self.interval = Interval()
        self.start_time = time.perf_counter()
        self.start_step = start_step
        self.strategy.module.train()
        if self.t.micro_batch_size == AUTO:
            self._search_micro_batch(start_step + 1)
        self._open_batches()
        on_gpu = rt.device.type == "cuda"
        if on_gpu:  # mem/peak_gb is this run's peak, not the process's
            torch.cuda.reset_peak_memory_stats(rt.device)
        # and so is mem/host_peak_gb, where Linux allows: after a collection of the build's
        # garbage (what outlives the job was frozen before it: runtime.freeze_what_lasts)
        reset_host_peak()
        step = self.steps_done = start_step
        profiler = build_profiler(self.cfg.profiler, rt)
        self.watchdog = watchdog
        watchdog.on_hang = self._on_hang
        watchdog.begin_steps(start_step)
        try:
            with contextlib.ExitStack() as recording:
                if profiler is not None:
                    recording.enter_context(profiler)
                while step < t.max_steps:
                    try:
                        with step_region(profiler, step + 1):
                            self._train_step(step, timer)
                    except _Rewound as rewound:
                        step = rewound.step
                        continue
                    step += 1
                    self.steps_done = step
                    if profiler is not None:
                        self._profiler_step(profiler)
                    self._after_step(step, lr_at(step - 1, t), timer)
                    self.watchdog.step_done(step)
                ending = recording.pop_all()
            # The end of the run: the profiler's final close writes the last trace (as long
            # as a flush), then the replicas are compared.
            with self.watchdog.phase("end of run"):
                slow_phase(self.cfg.fault, "end of run")
                ending.close()
                self.replicas_in_sync = self._replicas_agree()
            self._close_memory(remove=True)
        except Stopped:
            self._close_memory(remove=True)  # the stop's durable checkpoint is complete
            raise
        except torch.OutOfMemoryError as exc:
            raise self._out_of_memory(exc, step + 1) from None
        finally:
            self._close_memory(remove=False)  # kept for the restart that resumes from it
            self.watchdog.close()
            if profiler is not None and self.cfg.profiler.memory_snapshot and on_gpu:
                memory_snapshot.stop_history()
            self.stop.drain()
            del self.batches, self.loader
        return self.summary("completed", step)

    def _close_memory(self, remove: bool) -> None:
        if self.memory is not None:
            self.memory.close(remove)
            self.memory = None

    def _on_hang(self, step: int) -> None:
        """Runs in the watchdog thread just before the process exits with the hang code."""
        if self.rt.is_main:
            write_summary(self.rt.run_dir, self.summary("failed: hang detected", step))

    def _out_of_memory(self, exc: torch.OutOfMemoryError, step: int) -> OutOfMemory:
        """Write a memory snapshot of the full device, then the one line that says where."""
        path = memory_snapshot.dump(trace_dir(self.rt) / f"oom_memory_snapshot.step{step}.pickle")
        where = (
            f"memory snapshot: {path} (open at https://pytorch.org/memory_viz)"
            if path
            else ("no memory snapshot could be written")
        )
        first = str(exc).splitlines()[0] if str(exc) else "out of memory"
        return OutOfMemory(
            f"CUDA out of memory on rank {self.rt.rank} in step {step} ({first}); {where}; "
            "lower the memory per step: trainer.grad_checkpointing=true, or a smaller "
            "trainer.micro_batch_size (trainer.global_batch_size stays: accumulation makes "
            "up the rest)",
            step,
        )

    def _search_micro_batch(self, step: int) -> None:
        """trainer.micro_batch_size=auto: the largest micro-batch that fits on every rank."""
        try:
            self._resize(micro_batch.search(self.batch, self.rt, self._trial))
        except torch.OutOfMemoryError as exc:
            self._close_memory(remove=False)
            raise self._out_of_memory(exc, step) from None

    def _trial(self, micro: int) -> None:
        """One forward and backward of `micro` sequences, nothing kept: no gradient, no
        random number drawn (dropout's), so the run is the one launched at the size chosen."""
        x = torch.zeros((micro, self.t.seq_len), dtype=torch.long, device=self.rt.device)
        on_gpu = [self.rt.device] if self.rt.device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=on_gpu), self.strategy.micro_step(False):
                with self.strategy.autocast(), attention_backend(self.cfg.attention):
                    self.fault.before_forward(self.start_step + 1, micro)
                    loss = model_loss(self.strategy.module, self.impl, x, x)
                self.strategy.backward(loss)
        finally:
            self.strategy.zero_grad()

    def _resize(self, plan: BatchPlan) -> None:
        self.batch, self.accum = plan, plan.accum

    def _open_batches(self) -> None:
        """This rank's micro-batches from data window `data_step` on."""
        self.loader = self.open_loader(
            self.batch, start_step=self.data_step, wrap_windows=self.fault.wrap_windows
        )
        with stop_signals_held():  # workers start deaf to a stop meant for the trainer
            self.batches = iter(self.loader)

    def _train_step(self, step: int, timer: StepTimer) -> None:
        """One optimizer step: accumulate over micro-batches, then step at this step's lr."""
        timer.start()
        if step == self.start_step:
            slow_phase(self.cfg.fault, "first step")
        self.fault.before_step(step + 1)
        while self.data_step in self.skip_windows:  # read past it, as the sampler can't
            for _ in range(self.accum):
                next(self.batches)
            self.data_step += 1
        losses = self._accumulate(step)
        while losses is None:  # trainer.on_oom=retry: a rank ran out of memory; all redo it
            self._retry_smaller(step + 1)
            losses = self._accumulate(step)
        self.data_step += 1
        self.fault.end_step(step + 1)
        bad_ranks = self._bad_ranks(losses) if self.t.on_nonfinite != "stop" else []
        if bad_ranks:
            self.strategy.drop_step()
            self._skip(step + 1, bad_ranks)
            if self.t.on_nonfinite == "rewind":
                raise self._rewind(step + 1, bad_ranks, timer)
        else:
            for loss in losses:
                self.interval.add_loss(loss)
            self.interval.grad_norm = self.strategy.step(lr_at(step, self.t))
        timer.stop()
        self.interval.end_step()

    def _accumulate(self, step: int) -> list[torch.Tensor] | None:
        """Forward and backward of this step's micro-batches, gradients accumulated; the
        losses, or None when a rank ran out of memory before the gradients were synchronised
        (trainer.on_oom=retry). Every rank votes once, before the last micro-step's backward
        (where DDP synchronises): a rank that ran out earlier votes at once, so all ranks
        meet at that vote. An out-of-memory after it (that synchronising backward, half done
        on some ranks) is not retried: it stops the run as with on_oom=stop."""
        rt, module, retry = self.rt, self.strategy.module, self.t.on_oom == "retry"
        losses, voted = [], not retry
        try:
            for micro in range(self.accum):
                waited = time.perf_counter()
                x, y = next(self.batches)
                self.interval.add_data_wait(time.perf_counter() - waited)
                x = x.to(rt.device, non_blocking=True)
                y = y.to(rt.device, non_blocking=True)
                last = micro == self.accum - 1
                with self.strategy.micro_step(last):
                    with self.strategy.autocast(), attention_backend(self.cfg.attention):
                        self.fault.before_forward(step + 1, self.batch.micro_batch)
                        loss = model_loss(module, self.impl, x, y) / self.accum
                    loss = self.fault.poison(step + 1, loss)
                    if last and not voted:
                        self.oom_ranks, voted = micro_batch.ranks_out_of_memory(rt, False), True
                        if self.oom_ranks:
                            return None
                    self.strategy.backward(loss)
                losses.append(loss)
        except torch.OutOfMemoryError:
            if voted:
                raise
            self.oom_ranks = micro_batch.ranks_out_of_memory(rt, True)
            return None
        return losses

    def _retry_smaller(self, step: int) -> None:
        """Redo step `step` from its start at the next smaller micro-batch: its gradients
        thrown away, its loader reopened at the same data window (the same sequences)."""
        self.strategy.zero_grad()
        micro_batch.free_device_memory(self.rt.device)
        self._resize(micro_batch.halved(self.batch, step, self.oom_ranks, self.rt))
        self.oom_retries += 1
        del self.batches, self.loader  # its workers end before the new loader's start
        self._open_batches()

    def _micro_batch_figures(self) -> dict:
        """`micro_batch` and `oom/retries` where the micro-batch can change in-process."""
        if self.t.on_oom != "retry" and self.t.micro_batch_size != AUTO:
            return {}
        return {"micro_batch": self.batch.micro_batch, "oom/retries": self.oom_retries}

    def _bad_ranks(self, losses: list[torch.Tensor]) -> list[int]:
        """The ranks whose loss this step is not finite, agreed by all (trainer.on_nonfinite=
        skip): one tiny all-gather and one device sync per step, the policy's cost."""
        bad = float(not all(torch.isfinite(loss.detach()).item() for loss in losses))
        flags = self.rt.all_gather_floats([bad])
        return [r for r, (flag,) in enumerate(flags) if flag]

    def _skip(self, step: int, ranks: list[int]) -> None:
        """Step `step` was dropped on every rank; stop (exit 3) when it is one too many."""
        t = self.t
        self.interval.dropped += 1
        if self.bad_steps.record(step):
            self._nonfinite(
                step,
                ranks,
                f" ({self.bad_steps.in_window()} bad steps within {t.bad_step_window}, more "
                f"than trainer.max_bad_steps={t.max_bad_steps})",
            )
        if self.rt.is_main:
            log.warning(
                "non-finite loss in step %d on rank(s) %s: its update is dropped on every rank "
                "(trainer.on_nonfinite=%s; %d of trainer.max_bad_steps=%d within %d steps)",
                step, ranks, t.on_nonfinite, self.bad_steps.in_window(), t.max_bad_steps,
                t.bad_step_window,
            )  # fmt: skip

    def _rewind(self, step: int, ranks: list[int], timer: StepTimer) -> _Rewound:
        """Restore the newest complete checkpoint and go on from it, past the data window
        that made step `step` bad."""
        self.ckpt.complete()
        folder = checkpoint.find_resumable(self.rt.run_dir)
        if self.memory is not None:  # the memory tier first, when it holds a newer step
            self.memory.complete()
            after = checkpoint.step_of(folder) if folder else -1
            folder = self.memory.newest_common(self.memory.lineage, after) or folder
        if folder is None:
            self._nonfinite(step, ranks, " (trainer.on_nonfinite=rewind: no checkpoint yet)")
        window = self.data_step - 1
        self.skip_windows.add(window)
        del self.batches, self.loader  # its workers end before the new loader's start
        back_to = self.restore(folder)
        self.rewinds += 1
        timer.drain()
        self.interval = Interval()
        self._open_batches()
        if self.rt.is_main:
            log.warning(
                "rewound to step %d (%s) after the non-finite step %d; data window %d is "
                "skipped", back_to, folder.name, step, window,
            )  # fmt: skip
        return _Rewound(back_to)

    def _bad_step_counts(self) -> dict:
        """`bad_steps/skipped` (and `bad_steps/rewinds`) unless on_nonfinite=stop."""
        policy = self.t.on_nonfinite
        if policy == "stop":
            return {}
        counts = {"bad_steps/skipped": self.bad_steps.skipped}
        if policy == "rewind":
            counts["bad_steps/rewinds"] = self.rewinds
        return counts

    def _after_step(self, step: int, lr: float, timer: StepTimer) -> None:
        t = self.t
        last = step == t.max_steps
        if self.memory is not None:
            self.memory.complete()  # the memory checkpoint of the step before, if one
        record: dict = {}
        # An interval whose every step was dropped (on_nonfinite=skip) has no loss to log: its
        # time is logged with the next interval's.
        if (step % t.log_interval == 0 or last) and self.interval.loss_sum is not None:
            record.update(self._log_metrics(step, lr, timer))
        stopping = False
        if t.eval_interval and (step % t.eval_interval == 0 or last):
            evaluated = self._evaluate(step)
            stopping = evaluated is None
            record.update(evaluated or {})
        if record:
            self.records.append(record)
            for sink in self.sinks:
                sink.log(record)
        if not last and (stopping or self.stop.poll()):
            self.save(step, wait=True)
            raise Stopped(step)
        if t.checkpoint_interval and (step % t.checkpoint_interval == 0 or last):
            self.save(step, wait=last)
        elif self.memory is not None and not last and self.memory.due(step):
            self.save_to_memory(step)

    def _log_metrics(self, step: int, lr: float, timer: StepTimer) -> dict:
        figures = local_figures(
            self.interval, timer.drain(), self.strategy.drain_comm(), self.rt.device
        )
        # Rank 0 merges every rank's samples and logs the per-rank figures (ranks.jsonl); the
        # others need only the merged figures (the non-finite verdict, the straggler's streak).
        per_rank = self.rt.gather_objects(figures)
        merged = aggregate(per_rank, self.rt.world_size) if per_rank is not None else None
        if merged is not None:
            for sink in self.sinks:
                sink.log_ranks(step, merged.per_rank)
            merged = dataclasses.replace(merged, per_rank={})
        agg = self.rt.broadcast_object(merged)
        if agg.nonfinite_ranks:
            self._nonfinite(step, agg.nonfinite_ranks)
        n = self.interval.steps
        tokens_per_s = self.tokens_per_step * n / agg.slowest_interval_s
        self.interval = Interval()
        return {
            "step": step,
            "loss": agg.loss,
            "lr": lr,
            "tokens": step * self.tokens_per_step,
            "tokens_per_s": tokens_per_s,
            "mfu": mfu(tokens_per_s, self.flops_per_token, self.peak_flops, self.rt.world_size),
            **agg.figures,
            **self.stragglers.update(agg.figures),
            "comm/buckets": self.strategy.comm_buckets(),
            **self._bad_step_counts(),
            **self._micro_batch_figures(),
            "elapsed_s": time.perf_counter() - self.start_time,
            "eta_s": (self.t.max_steps - step) * agg.step_time_p50,
        }

    def _replicas_agree(self) -> bool | None:
        """Whether every rank ended with bit-identical parameters (a DDP invariant that a
        broken comm hook or a rank-local update would violate)."""
        mine = self.strategy.replica_fingerprint()
        if mine is None:
            return None
        agree = all(theirs == mine for theirs in self.rt.all_gather_floats(mine))
        if not agree:
            log.error("model replicas differ across ranks at the end of training")
        return agree

    @torch.no_grad()
    def _evaluate(self, step: int) -> dict | None:
        """The eval figures after `step`, or None when the ranks agreed to stop during it.

        The eval's hang allowance is its number of batches times the measured step time
        (x watchdog.step_multiple), so a long eval is not a hang; the stop vote is polled
        between batches (every rank evaluates the same number), so a stop signal during a long
        eval is acted on within a batch, well inside torchrun's shutdown window."""
        with self.watchdog.phase("eval", batches=self.t.eval_batches, step=step):
            slow_phase(self.cfg.fault, "eval")
            return self._eval_batches(step)

    def _eval_batches(self, step: int) -> dict | None:
        started = time.perf_counter()
        module = self.strategy.module
        module.eval()
        # eval_batches global batches of held-out windows, split over the ranks: the same
        # sequences whatever the world size, so eval losses compare across runs.
        batches = build_eval_batches(
            self.val,
            micro_batch=self.batch.micro_batch,
            num_batches=self.t.eval_batches * self.accum,
            rank=self.rt.rank,
            world_size=self.rt.world_size,
        )
        total = torch.zeros((), device=self.rt.device)
        for done, (x, y) in enumerate(batches, 1):
            x, y = x.to(self.rt.device), y.to(self.rt.device)
            with self.strategy.autocast(), attention_backend(self.cfg.attention):
                total += model_loss(module, self.impl, x, y)
            if done < len(batches) and self.stop.poll():
                module.train()
                if self.rt.is_main:
                    log.warning(
                        "stop requested during the eval after step %d: eval cut short after "
                        "%d of %d batches (not logged); checkpointing step %d",
                        step, done, len(batches), step,
                    )  # fmt: skip
                return None
        module.train()
        per_rank = self.rt.all_gather_floats([total.item() / len(batches)])
        loss = sum(v for (v,) in per_rank) / len(per_rank)
        return {
            "step": step,
            "eval/loss": loss,
            "eval/ppl": math.exp(min(loss, 50.0)),
            "eval/time_s": time.perf_counter() - started,
        }

    # -- the end -----------------------------------------------------------------------
    def summary(self, status: str, step: int) -> dict:
        """End-of-run figures: medians over logged intervals (the first one, which holds
        start-up and compilation, is left out when there are others)."""
        logged = [r for r in self.records if "loss" in r]
        steady = logged[1:] if len(logged) > 1 else logged
        evals = [r for r in self.records if "eval/loss" in r]

        def median(key):
            values = [r[key] for r in steady if r.get(key) is not None]
            return float(np.median(values)) if values else None

        return {
            "status": status,
            "run_id": self.rt.run_id,
            "world_size": self.rt.world_size,
            "steps": step,
            "resumed_from_step": self.start_step or None,
            "tokens": step * self.tokens_per_step,
            "loss": logged[-1]["loss"] if logged else None,
            "eval/loss": evals[-1]["eval/loss"] if evals else None,
            "eval/ppl": evals[-1]["eval/ppl"] if evals else None,
            "tokens_per_s": median("tokens_per_s"),
            "mfu": median("mfu"),
            "step_time_s/p50": median("step_time_s/p50"),
            "step_time_s/p90": median("step_time_s/p90"),
            "step_time_s/max": max((r["step_time_s/max"] for r in steady), default=None),
            "data_wait_s": median("data_wait_s"),
            **{key: median(key) for key in SUMMARY_COMM_KEYS},
            "mem/peak_gb": max(
                (r["mem/peak_gb"] for r in steady if r["mem/peak_gb"]), default=None
            ),
            "mem/host_peak_gb": max((r["mem/host_peak_gb"] for r in steady), default=None),
            "comm/buckets": logged[-1]["comm/buckets"] if logged else None,
            "replicas_in_sync": self.replicas_in_sync,
            **self._bad_step_counts(),
            **self._micro_batch_figures(),
            "flops_per_token": self.flops_per_token,
            "wall_time_s": time.perf_counter() - self.start_time,
        }
