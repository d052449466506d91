"""A run's checkpoints, from the resume decision to the last save: what to resume (planned
on rank 0, agreed by all ranks), the restore of engine, RNG and data position, the saves of
both tiers (durable, memory) and the checkpoint a rewind goes back to. The loop says when;
this module says how, so the loop holds no checkpoint state of its own."""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from launcher.checkpoint import cadence, resume
from launcher.checkpoint import protocol as checkpoint
from launcher.checkpoint.memory import MemoryTier
from launcher.config import ConfigError, TrainConfig
from launcher.config.batch import BatchPlan
from launcher.config.schema import TrainerConfig
from launcher.resilience.decide import decide_on_main
from launcher.resilience.stop_vote import NOTHING
from launcher.runtime.placement import ranks_per_node
from launcher.runtime.process import Runtime

log = logging.getLogger("launcher")


class Engine(Protocol):
    """What the checkpoints need of a strategy (launcher.strategy.base.Strategy)."""

    def save(self, folder: Path, rank: int): ...
    def snapshot(self, rank: int, share) -> Callable[[Path], None]: ...
    def load(self, folder: Path) -> None: ...
    def files_to_load(self, folder: Path) -> list[Path]: ...


def plan_resume(
    cfg: TrainConfig, rt: Runtime, model, tier: MemoryTier | None = None
) -> list[Path] | None:
    """The checkpoints to try, newest first, decided by rank 0 under the lock (see
    launcher.checkpoint.resume); a checkpoint that does not fit these settings stops the launch.
    None when the run is finished (its newest checkpoint is at trainer.max_steps)."""
    now = resume.identity(cfg, model, rt.world_size)
    max_steps = cfg.trainer.max_steps
    # This launch's own memory checkpoint (a restart before the first durable checkpoint)
    continues = bool(tier and cfg.resume == "auto" and tier.find(None, 0).step is not None)

    def decide() -> list[str] | None:
        decided = resume.plan(cfg.resume, rt.run_dir, now, max_steps, continues)
        if decided.finished_at is not None:
            log.info("%s", resume.finished_line(rt.run_dir, decided.finished_at, max_steps))
            return None
        # A DeepSpeed checkpoint at another world size, stage or engine: converted here.
        return resume.prepare(decided.candidates, now)

    folders = decide_on_main(rt, decide)
    return None if folders is None else [Path(p) for p in folders]


def _rng_state(device: torch.device) -> dict:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return {
        "torch": torch.get_rng_state(),
        "cuda": cuda,
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }


def _number(value: float | None) -> float:
    return NOTHING if value is None else value


class CheckpointManager:
    """This rank's side of the run's checkpoints, and the data position they record: the
    data window (0-based, one step's sequences) the next step reads, ahead of the step by
    the windows trainer.on_nonfinite=rewind skipped (`skip_windows`, which the loader skips).
    """

    def __init__(
        self,
        rt: Runtime,
        engine: Engine,
        trainer: TrainerConfig,
        identity: dict,
        memory: MemoryTier | None = None,
    ):
        self.rt, self.engine = rt, engine
        self.writer = checkpoint.CheckpointWriter(
            rt.run_dir / "checkpoints",
            is_main=rt.is_main,
            barrier=rt.barrier,
            keep=trainer.keep_checkpoints,
            meta=identity,
            gather=rt.all_gather_objects,
            rank=rt.rank,
            world_size=rt.world_size,
        )
        self.memory = memory  # the memory tier (launcher.checkpoint.memory), when on
        if memory is not None:  # rank 0's lineage, which the durable meta.json records
            memory.follow(rt.broadcast_object(self.writer.meta["lineage"]))
        # When each tier saves (launcher.checkpoint.cadence): its interval, or auto from what
        # its saves cost the loop (the clock of the steps' ends)
        self.clock = cadence.LoopClock()
        mtbf = cadence.mtbf_s(trainer.mtbf_h, max(1, rt.world_size // ranks_per_node()))
        # While the memory tier is on, a durable checkpoint is what the failures it cannot
        # recover from fall back to: those alone decide the durable interval.
        durable_mtbf = mtbf if memory is None else cadence.memory_loss_mtbf_s(
            trainer.memory_loss_mtbf_h, mtbf)  # fmt: skip
        self.durable_every = self._cadence("trainer.checkpoint_interval",
                                           trainer.checkpoint_interval, durable_mtbf)  # fmt: skip
        self.memory_every = self._cadence(
            "trainer.memory_checkpoint_interval",
            trainer.memory_checkpoint_interval if memory is None or
            trainer.memory_checkpoint_interval == cadence.AUTO else memory.every, mtbf,
        )  # fmt: skip
        self.data_step: int | None = None
        self.skip_windows: set[int] = set()  # windows a rewind skips when it comes to them
        self.rng_file = f"rng_rank{rt.rank}.pt"

    # -- what rides on the stop vote (launcher.resilience.stop_vote.Rider) ---------------
    # Each tier's auto interval: a save's measured cost and the loop's pace (`Young.note`);
    # then the memory tier's newest sealed step, failed write and ward copy (MemoryTier.payload).
    width = 2 * 2 + MemoryTier.WIDTH

    def payload(self) -> list[float]:
        """This rank's numbers for the next vote: no gather of their own between steps."""
        row = []
        for every in (self.durable_every, self.memory_every):
            note = every.note()
            row += [NOTHING, NOTHING] if note is None else [note[0], _number(note[1])]
        return row + (self.memory.payload() if self.memory is not None
                      else [NOTHING] * MemoryTier.WIDTH)  # fmt: skip

    def arrived(self, rows: list[list[float]]) -> None:
        """Every rank's `payload` of a vote: the intervals follow the slowest rank's cost
        (the same steps settle on every rank, so all bring a note or none), the memory
        tier agrees on what every rank sealed."""
        for i, every in enumerate((self.durable_every, self.memory_every)):
            notes = [(row[2 * i], row[2 * i + 1]) for row in rows]
            if not any(math.isnan(cost) for cost, _ in notes):
                every.agree([(cost, None if math.isnan(pace) else pace) for cost, pace in notes])
        if self.memory is not None:
            self.memory.arrived([row[4:] for row in rows])

    def _cadence(self, key: str, every, mtbf: tuple[float, str]):
        if every != cadence.AUTO:
            return cadence.Fixed(every or 0)
        return cadence.Young(key, self.rt, mtbf, self.clock)

    # -- resume ------------------------------------------------------------------------
    def resume(self, folders: list[Path], auto: bool, batch: BatchPlan) -> int:
        """Restore the newest checkpoint every rank can read: the memory tier's when it is
        newer than the durable ones (resume=auto, see `newer_in_memory`), else the durable
        ones, newest first. Returns the step to continue from (0: a fresh start)."""
        newer = self.newer_in_memory(folders) if auto else None
        start_step, restored = self._restore_first([newer, *folders] if newer else folders, batch)
        self._recall_cadence(restored)
        self.clock.begin()
        for every in (self.durable_every, self.memory_every):
            every.begin(start_step)
            if self.rt.is_main and (line := every.opening_line()):
                log.info("%s", line)
        if self.memory is not None:
            held = newer if newer and start_step == checkpoint.step_of(newer) else None
            self.memory.keep_only(held)
        return start_step

    def _recall_cadence(self, restored: Path | None) -> None:
        """Each auto interval as the run measured it before this restart (the restored
        checkpoint's meta.json, agreed on every rank before it was written); not across a
        change of world size, where a save costs another time."""
        meta = (checkpoint.read_meta(restored) or {}) if restored is not None else {}
        if meta.get("world_size") != self.rt.world_size:
            return
        carried = meta.get("cadence") or {}
        for name, every in (("durable", self.durable_every), ("memory", self.memory_every)):
            if isinstance(carried.get(name), dict):
                every.recall(carried[name])

    def newer_in_memory(self, folders: list[Path]) -> Path | None:
        """This rank's memory checkpoint of the newest step every rank holds, when it is newer
        than the newest durable one and of the run's lineage: what a torchrun restart
        resumes from, losing at most trainer.memory_checkpoint_interval steps."""
        if self.memory is None:
            return None
        newest = folders[0] if folders else None
        lineage = (checkpoint.read_meta(newest) or {}).get("lineage") if newest else None
        after = checkpoint.step_of(newest) if newest else 0
        found = self.memory.newest_common(lineage, after)
        if found is not None and self.rt.is_main:
            than = f"the durable {newest.name}" if newest else "any durable checkpoint (none yet)"
            log.info("memory tier: step %d is newer than %s; resuming from it",
                     checkpoint.step_of(found), than)  # fmt: skip
        return found

    def _restore_first(self, folders: list[Path], batch: BatchPlan) -> tuple[int, Path | None]:
        """Each rank tries the same checkpoint and all ranks compare notes: one rank's
        unreadable file makes every rank fall back together, with one warning that names the
        ranks and why. A launch that had checkpoints to resume and could load none stops (a
        fresh start would overwrite them). Returns the step and the checkpoint restored."""
        failures = []
        for i, folder in enumerate(folders):
            step, bad = self._try_restore(folder, batch)
            if not bad:
                log.info("resumed from step %d", step)
                return step, folder
            then = "falling back to the previous one" if i + 1 < len(folders) else "none is left"
            (log.warning if self.rt.is_main else log.info)(
                "checkpoint %s is unreadable (%s); %s", folder, bad, then
            )
            failures.append(f"{folder.name}: {bad}")
        if folders:
            raise ConfigError(
                f"no checkpoint of {folders[0].parent} could be loaded ({' | '.join(failures)}); "
                f"{resume.fresh_start_hint(self.rt.run_dir)}"
            )
        return 0, None

    def _try_restore(self, folder: Path, batch: BatchPlan) -> tuple[int, str]:
        """(step, '') when every rank loaded `folder`, else (0, every rank's problem).

        Two rounds: each rank first checks that the files it will read are whole torch
        files, and only when all are does any rank load (an engine's load may enter
        collectives, where a rank that failed before them would leave the others waiting)."""
        try:
            problem = checkpoint.unreadable(self.files_to_load(folder))
        except Exception as exc:  # noqa: BLE001 - reported like an unreadable file
            problem = _one_line(exc)
        bad = self._agree(problem)
        if bad:
            return 0, bad
        step, problem = 0, None
        try:
            step = self.restore(folder, batch)
        except Exception as exc:  # noqa: BLE001 - any unreadable file means: try the previous one
            problem = _one_line(exc)
        return step, self._agree(problem)

    def _agree(self, problem: str | None) -> str:
        """Every rank's problem with a checkpoint, as one text ('' when no rank has one)."""
        everyone = self.rt.all_gather_objects(problem)
        return "; ".join(f"rank {r}: {p}" for r, p in enumerate(everyone) if p)

    def files_to_load(self, folder: Path) -> list[Path]:
        """What `restore(folder)` reads on this rank."""
        rng_file = folder / self.rng_file
        return self.engine.files_to_load(folder) + ([rng_file] if rng_file.exists() else [])

    def restore(self, folder: Path, batch: BatchPlan) -> int:
        """Load model, optimizer, scaler, RNG state and data position; return the step to
        continue from. The checkpoints this run writes continue the loaded one's lineage
        (see checkpoint.CheckpointWriter)."""
        self.engine.load(folder)
        self.writer.adopt(folder)
        if self.memory is not None:
            self.memory.follow(self.writer.meta["lineage"])
        meta = checkpoint.read_meta(folder) or {}
        self._note_world_change(meta, batch)
        step = checkpoint.step_of(folder)
        self.data_step = meta.get("data_step", step)
        rng_file = folder / self.rng_file
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

    def _note_world_change(self, meta: dict, batch: BatchPlan) -> None:
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
            batch.accum,
            batch.global_batch,
        )

    # -- saves -------------------------------------------------------------------------
    def _progress(self, step: int, batch: BatchPlan) -> dict:
        """What meta.json records of the run's progress at `step`, in either tier."""
        return {
            "world_size": self.rt.world_size,
            "accum": batch.accum,
            "micro_batch": batch.micro_batch,  # what ran (micro_batch_size=auto, retry)
            "tokens": step * batch.tokens_per_step,
            "data_step": self.data_step,
            # what each auto interval measured so far, for a restart (`_recall_cadence`)
            "cadence": {
                name: state
                for name, every in (("durable", self.durable_every), ("memory", self.memory_every))
                if (state := every.state())
            },
        }

    def durable_due(self, step: int, last: bool) -> bool:
        """Whether a durable checkpoint of `step` is due (the last step's whenever the
        checkpoints are on)."""
        return bool(self.durable_every.every) and (last or self.durable_every.due(step))

    def save(self, step: int, batch: BatchPlan, wait: bool = False) -> None:
        """A durable checkpoint of `step`; with trainer.async_checkpoint the files are written
        while training goes on, unless `wait` (a stop, the end of the run)."""

        def write(folder: Path):
            pending = self.engine.save(folder, self.rt.rank)  # a future when asynchronous
            torch.save(_rng_state(self.rt.device), folder / self.rng_file)
            return pending

        started = time.perf_counter()
        self.writer.save(step, write, self._progress(step, batch))
        if wait:
            self.writer.complete()
        else:  # what the save cost the loop, which an auto interval follows
            self._saved(self.durable_every, step, started)

    def memory_due(self, step: int) -> bool:
        """Whether the memory tier checkpoints `step` (never when it is off)."""
        return self.memory is not None and self.memory.on and self.memory_every.due(step)

    def save_to_memory(self, step: int, batch: BatchPlan) -> None:
        """A memory-tier checkpoint of `step`: the state is copied now, between two steps,
        and written by the tier's thread while the next step runs (sealed after it)."""
        started = time.perf_counter()
        write_state = self.engine.snapshot(self.rt.rank, self.memory.share)
        rng = _rng_state(self.rt.device)

        def write(folder: Path) -> None:
            write_state(folder)
            torch.save(rng, folder / self.rng_file)

        self.memory.save(step, write, self._progress(step, batch))
        self._saved(self.memory_every, step, started)

    def _saved(self, every, step: int, started: float) -> None:
        """A save of `step` (begun at `started`) under `every`: the loop's clock leaves its
        iterations out of the pace, and an auto interval knows its cost two steps on."""
        self.clock.touch(step)
        every.saved(step, time.perf_counter() - started)

    def step_done(self, step: int) -> None:
        """Between two steps (`step` has ended): an auto interval whose save's cost is now
        known keeps it for the next vote (`payload`)."""
        self.clock.tick(step)
        for every in (self.durable_every, self.memory_every):
            every.settle(step)

    def last_good(self) -> Path | None:
        """The newest complete durable checkpoint, once an asynchronous save of an earlier
        step has counted (the one a failed run keeps)."""
        self.writer.complete()
        return checkpoint.find_resumable(self.rt.run_dir)

    def rewind_target(self) -> Path | None:
        """The newest complete checkpoint of either tier: the memory tier's when it holds a
        newer step than the durable ones (trainer.on_nonfinite=rewind goes back to it)."""
        folder = self.last_good()
        if self.memory is not None:
            after = checkpoint.step_of(folder) if folder else -1
            folder = self.memory.newest_common(self.memory.lineage, after) or folder
        return folder

    def close_memory(self, remove: bool) -> None:
        """End the memory tier: its checkpoints removed (`remove`: the run ended, or stopped
        with a complete durable one) or kept for the restart that resumes from them."""
        if self.memory is not None:
            self.memory.close(remove)
            self.memory = None


def _one_line(exc: Exception, limit: int = 300) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:limit]
