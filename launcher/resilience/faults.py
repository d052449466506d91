"""Failures on purpose (`fault.*` keys), so a platform team can rehearse each one on their
cluster and see what the launcher, torchrun and the scheduler do: the tests use the same
keys. Off by default; docs/faults.md lists the kinds.

With `fault.once=true` a fault fires in one attempt only: the rank leaves
`logs/fault.rank<r>` when it fires, so a restarted or requeued job resumes past it.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import torch
from omegaconf import DictConfig
from torch.utils.data import Dataset

from launcher.data.loader import StepBatchSampler
from launcher.resilience import exit_codes, first_failure

log = logging.getLogger("launcher")


def peer_left(run_dir: Path, rank: int, since: float) -> str | None:
    """Which other rank left this job on purpose (`fault.kind=exit`, its marker written
    since `since`), as words for the one line a rank whose collectives then failed prints
    instead of a traceback; None when none did."""
    for marker in sorted((run_dir / "logs").glob("fault.rank*")):
        other = marker.name.removeprefix("fault.rank")
        try:
            fired = marker.stat().st_mtime >= since and marker.read_text().startswith("exit ")
        except OSError:
            continue
        if fired and other != str(rank):
            return f"rank {other} left the job on purpose (fault.kind=exit, {marker})"
    return None


ON_PURPOSE = "left the job on purpose (fault.kind=exit with exit code 0)"


class InjectedFault(RuntimeError):
    """Raised by `fault.kind=loader_error` inside a DataLoader worker."""


class FaultInjector:
    """Fires the configured fault on its rank when its step starts (1-based steps)."""

    def __init__(self, cfg: DictConfig, *, rank: int, run_dir: Path):
        self.cfg = cfg
        self.marker = run_dir / "logs" / f"fault.rank{rank}"
        self.armed = cfg.kind == "slow_data" or (cfg.kind != "none" and rank == cfg.rank)
        # kind=oom with micro_batch: a device's size, not an event; it holds in every attempt
        self.capacity = cfg.micro_batch if cfg.kind == "oom" else None
        if self.armed and cfg.once and self.capacity is None and self.marker.exists():
            log.info("fault.kind=%s already fired in an earlier attempt; not again", cfg.kind)
            self.armed = False

    def before_step(self, step: int) -> None:
        """Called inside the timed step, before its first micro-batch."""
        if not self.armed:
            return
        kind, cfg = self.cfg.kind, self.cfg
        if kind == "slow":
            if step >= cfg.step:
                time.sleep(cfg.seconds)
            return
        if (
            step != cfg.step
            or self.capacity is not None
            or kind
            in (
                "loader_error",
                "slow_data",
                "nonfinite",
                "slow_device",
                "slow_phase",
            )
        ):
            return  # those fire in the loader, in the loss (`poison`), the burn-in gate or a phase
        self.armed = False
        self.marker.write_text(f"{kind} at step {step}\n")
        log.warning("fault.kind=%s: injecting at step %d", kind, step)
        if kind == "stall":
            time.sleep(cfg.seconds)
        elif kind == "sigstop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif kind == "exit":
            first_failure.record(step, f"exited with code {cfg.exit_code} (fault.kind=exit)"
                                 if cfg.exit_code else ON_PURPOSE)  # fmt: skip
            exit_codes.report(cfg.exit_code, chosen=True)
            logging.shutdown()
            os._exit(cfg.exit_code)
        elif kind == "oom":
            raise torch.OutOfMemoryError(f"injected by fault.kind=oom at step {step}")

    def before_forward(self, step: int, micro_batch: int) -> None:
        """With `kind=oom` and `micro_batch`: from step `fault.step` on, a forward of more
        sequences than that raises the device's out-of-memory error, as a device too small
        for them would (memory that fragmentation or a longer input took, mid-run)."""
        capacity = self.capacity
        if self.armed and capacity is not None and step >= self.cfg.step and micro_batch > capacity:
            raise torch.OutOfMemoryError(
                f"injected by fault.kind=oom: a micro-batch of {micro_batch} is above "
                f"fault.micro_batch={capacity}"
            )

    def poison(self, step: int, loss: torch.Tensor) -> torch.Tensor:
        """With `kind=nonfinite`, step `step`'s loss on the fault's rank becomes NaN (so do
        its gradients, and after the all-reduce every rank's), as a bad batch or an
        overflow makes it; every other loss passes through unchanged."""
        if not (self.armed and self.cfg.kind == "nonfinite" and step == self.cfg.step):
            return loss
        if not self.marker.exists():
            self.marker.write_text(f"nonfinite at step {step}\n")
            log.warning("fault.kind=nonfinite: the loss of step %d is NaN", step)
        return loss * float("nan")

    def end_step(self, step: int) -> None:
        """After step `step`: a loss fault has fired and is not armed for another step."""
        if self.armed and self.cfg.kind == "nonfinite" and step == self.cfg.step:
            self.armed = False

    def wrap_windows(self, windows: Dataset, sampler: StepBatchSampler) -> Dataset:
        """With `kind=loader_error`, the dataset whose worker fails on the fault's step;
        with `kind=slow_data`, one whose every micro-batch read takes `seconds`."""
        if self.armed and self.cfg.kind == "slow_data":
            return _SlowWindows(windows, self.cfg.seconds)
        if not (self.armed and self.cfg.kind == "loader_error"):
            return windows
        poisoned = sampler.rank_batch(self.cfg.step - 1)[: sampler.micro_batch]
        return _FailingWindows(windows, poisoned, self.marker)


def device_delay(cfg: DictConfig, *, rank: int, run_dir: Path) -> float:
    """With `kind=slow_device`, the seconds each of this rank's burn-in matmuls takes more
    (0 elsewhere): the gate's outlier, without a slow GPU to hand. It fires in the gate of
    one attempt only with `once` (a requeued job on other nodes then passes)."""
    if cfg.kind != "slow_device" or rank != cfg.rank:
        return 0.0
    marker = run_dir / "logs" / f"fault.rank{rank}"
    if cfg.once and marker.exists():
        log.info("fault.kind=slow_device already fired in an earlier attempt; not again")
        return 0.0
    marker.write_text("slow_device in the burn-in gate\n")
    log.warning("fault.kind=slow_device: every burn-in matmul takes %g s more", cfg.seconds)
    return float(cfg.seconds)


def slow_phase(cfg: DictConfig, phase: str) -> None:
    """With `kind=slow_phase`, every rank spends `seconds` more in each phase named in
    `fault.phases` (watchdog.PHASES), each time it comes: a slow but healthy job (a long
    eval, a slow checkpoint or trace write, a slow first compile or data preparation),
    which the hang watchdog must not kill, or a stalled one when `seconds` is past the
    phase's allowance."""
    if cfg.kind == "slow_phase" and phase in cfg.phases:
        log.warning("fault.kind=slow_phase: %s takes %g s more", phase, cfg.seconds)
        time.sleep(cfg.seconds)


class _FailingWindows(Dataset):
    """Windows whose fetch of one exact micro-batch (step S's first on this rank) raises
    in the DataLoader worker, as a corrupt shard or a lost file system would."""

    def __init__(self, windows: Dataset, poisoned: list[int], marker: Path):
        self.windows = windows
        self.poisoned = poisoned
        self.marker = marker

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int):
        return self.windows[index]

    def __getitems__(self, indices: list[int]):
        if list(indices) == self.poisoned:
            self.marker.write_text("loader_error\n")
            raise InjectedFault(f"fault.kind=loader_error: reading micro-batch {indices}")
        return [self.windows[i] for i in indices]


class _SlowWindows(Dataset):
    """Windows read from high-latency storage: each micro-batch read waits `seconds` (in
    the DataLoader worker when there are workers, which is what hides it)."""

    def __init__(self, windows: Dataset, seconds: float):
        self.windows = windows
        self.seconds = seconds

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int):
        return self.windows[index]

    def __getitems__(self, indices: list[int]):
        time.sleep(self.seconds)
        return [self.windows[i] for i in indices]
