"""Failures on purpose (`fault.*` keys), so a platform team can rehearse each one on their
cluster and see what the launcher, torchrun and the scheduler do: the tests use the same
keys. Off by default; docs/faults.md lists the kinds.

Each kind is declared once (launcher.config.fault_kinds' registry; the built-in ones below):
the hook points where it fires (the job and the loop call the injector at those points and
know no kind) and the config rules it needs. The choices of `fault.kind` and its validation
read the registry, so a new kind is one `register(FaultKind(...))`.

With `fault.once=true` a fault fires in one attempt only: the rank leaves
`logs/fault.rank<r>` when it fires, so a restarted or requeued job resumes past it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from signal import SIGSTOP
from typing import TYPE_CHECKING, Any

from launcher.config.fault_kinds import (
    AFTER_STEP,
    AT_ITS_RANK_AND_STEP,
    BEFORE_STEP,
    BURN_IN,
    DATA,
    FORWARD,
    LOSS,
    PHASE,
    FaultKind,
    Hook,
    kinds,
    register,
)
from launcher.config.schema import PHASES
from launcher.resilience import exit_codes, first_failure

if TYPE_CHECKING:
    import torch

    from launcher.data.windows import TokenWindows

log = logging.getLogger("launcher")


class FaultInjector:
    """This rank's configured fault, fired at the hook points the job and the loop call."""

    def __init__(self, cfg, *, rank: int, run_dir: Path):
        self.cfg, self.kind = cfg, kinds()[cfg.kind]
        self.marker = run_dir / "logs" / f"fault.rank{rank}"
        self.armed = bool(self.kind.hooks) and (self.kind.every_rank or rank == cfg.rank)
        if self.armed and cfg.once and not self.kind.lasting(cfg) and self.marker.exists():
            log.info("fault.kind=%s already fired in an earlier attempt; not again", cfg.kind)
            self.armed = False

    def _fire(self, point: str, value: Any = None, **context) -> Any:
        hook = self.kind.hooks.get(point) if self.armed else None
        if hook is None:
            return value
        fired = hook(self, value, **context)
        return value if fired is None else fired

    def fired_at(self, step: int) -> None:
        """A one-off fault fires now: disarmed, its marker left for the attempts after."""
        self.armed = False
        self.marker.write_text(f"{self.cfg.kind} at step {step}\n")
        log.warning("fault.kind=%s: injecting at step %d", self.cfg.kind, step)

    def phase(self, phase: str) -> None:
        """A watched phase (watchdog.PHASES) begins."""
        self._fire(PHASE, phase=phase)

    def burnin_delay(self) -> float:
        """The seconds each of this rank's burn-in matmuls takes more (0: none)."""
        return self._fire(BURN_IN, 0.0)

    def wrap_windows(self, windows: TokenWindows, sampler) -> TokenWindows:
        """The training windows the loader reads (`sampler`: its StepBatchSampler)."""
        return self._fire(DATA, windows, sampler=sampler)

    def before_step(self, step: int) -> None:
        self._fire(BEFORE_STEP, step=step)

    def before_forward(self, step: int, micro_batch: int) -> None:
        self._fire(FORWARD, step=step, micro_batch=micro_batch)

    def poison(self, step: int, loss: torch.Tensor) -> torch.Tensor:
        return self._fire(LOSS, loss, step=step)

    def end_step(self, step: int) -> None:
        self._fire(AFTER_STEP, step=step)


# -- the kinds: each one block, what it rehearses, its hooks and its rules ------------------
def at_step(act: Callable[[FaultInjector, int], None]) -> Hook:
    """A one-off fault that fires on its rank when step `fault.step` starts."""

    def hook(fault: FaultInjector, _, step: int) -> None:
        if step == fault.cfg.step:
            fault.fired_at(step)
            act(fault, step)

    return hook


register(FaultKind("none", rules=()))


# stall: rank `rank` sleeps `seconds` when step `step` starts (a hung rank)
def _stall(fault: FaultInjector, step: int) -> None:
    time.sleep(fault.cfg.seconds)


register(FaultKind("stall", {BEFORE_STEP: at_step(_stall)}))


# sigstop: it stops itself, frozen, as a process stuck in a driver is
def _sigstop(fault: FaultInjector, step: int) -> None:
    os.kill(os.getpid(), SIGSTOP)


register(FaultKind("sigstop", {BEFORE_STEP: at_step(_sigstop)}))


# exit: it exits with `exit_code` (0: it left the job on purpose, see `peer_left`)
def _exit(fault: FaultInjector, step: int) -> None:
    code = fault.cfg.exit_code
    first_failure.record(step, f"exited with code {code} (fault.kind=exit)" if code else ON_PURPOSE)
    exit_codes.report(code, chosen=True)
    logging.shutdown()
    os._exit(code)


register(FaultKind("exit", {BEFORE_STEP: at_step(_exit)}))


# oom: it raises the device's out-of-memory error at `step`; with `micro_batch`, in every
# forward of a larger micro-batch from `step` on (a device that size, in every attempt)
def _oom_at_step(fault: FaultInjector, _, step: int) -> None:
    if fault.cfg.micro_batch is None:  # else a capacity (FORWARD), no one-off event
        at_step(_raise_oom)(fault, None, step)


def _raise_oom(fault: FaultInjector, step: int) -> None:
    raise _device_oom(f"injected by fault.kind=oom at step {step}")


def _capacity(fault: FaultInjector, _, step: int, micro_batch: int) -> None:
    capacity = fault.cfg.micro_batch
    if capacity is not None and step >= fault.cfg.step and micro_batch > capacity:
        raise _device_oom(
            f"injected by fault.kind=oom: a micro-batch of {micro_batch} is above "
            f"fault.micro_batch={capacity}"
        )


def _device_oom(message: str) -> Exception:
    """torch's out-of-memory error, torch loaded here: the kinds are declared in processes
    that never load it (plan, submit)."""
    import torch

    return torch.OutOfMemoryError(message)


register(
    FaultKind(
        "oom",
        {BEFORE_STEP: _oom_at_step, FORWARD: _capacity},
        lasting=lambda f: f.micro_batch is not None,
    )
)


# device_error: it raises what a failing GPU says (an uncorrectable ECC error) at `step`:
# a crash whose host goes to bad_hosts (exclude.device_error)
def _device_error(fault: FaultInjector, step: int) -> None:
    raise RuntimeError(
        f"CUDA error: uncorrectable ECC error encountered (injected by fault.kind=device_error "
        f"at step {step})"
    )


register(FaultKind("device_error", {BEFORE_STEP: at_step(_device_error)}))


# loader_error: its DataLoader worker raises reading step `step`'s first micro-batch
def _failing_windows(fault: FaultInjector, windows: TokenWindows, sampler) -> TokenWindows:
    poisoned = sampler.rank_batch(fault.cfg.step - 1)[: sampler.micro_batch]
    return _FailingWindows(windows, poisoned, fault.marker)


register(FaultKind("loader_error", {DATA: _failing_windows}))


# slow: it spends `seconds` more in every step from `step` on (a straggler)
def _slow(fault: FaultInjector, _, step: int) -> None:
    if step >= fault.cfg.step:
        time.sleep(fault.cfg.seconds)


register(FaultKind("slow", {BEFORE_STEP: _slow}))


# slow_data: every rank's data source takes `seconds` for each micro-batch it reads (storage
# with a high latency, such as a busy network file system)
def _slow_windows(fault: FaultInjector, windows: TokenWindows, sampler) -> TokenWindows:
    return _SlowWindows(windows, fault.cfg.seconds)


register(FaultKind("slow_data", {DATA: _slow_windows}, every_rank=True))


# nonfinite: its loss in step `step` is NaN (so are its gradients, and after the all-reduce
# every rank's), as a bad batch or an overflow makes it
def _poison(fault: FaultInjector, loss: torch.Tensor, step: int) -> torch.Tensor | None:
    if step != fault.cfg.step:
        return None
    if not fault.marker.exists():
        fault.marker.write_text(f"nonfinite at step {step}\n")
        log.warning("fault.kind=nonfinite: the loss of step %d is NaN", step)
    return loss * float("nan")


def _disarm_after(fault: FaultInjector, _, step: int) -> None:
    if step == fault.cfg.step:  # it has fired and is not armed for another step
        fault.armed = False


register(FaultKind("nonfinite", {LOSS: _poison, AFTER_STEP: _disarm_after}))


# slow_device: each of its burn-in matmuls takes `seconds` more (the gate's outlier without
# a slow GPU to hand); with `once`, in one attempt's gate (a requeue elsewhere then passes)
def _slow_device(fault: FaultInjector, _) -> float:
    fault.marker.write_text("slow_device in the burn-in gate\n")
    log.warning("fault.kind=slow_device: every burn-in matmul takes %g s more", fault.cfg.seconds)
    return float(fault.cfg.seconds)


register(FaultKind("slow_device", {BURN_IN: _slow_device}))


def phases_named(f, world_size: int, max_steps: int) -> str | None:
    if f.phases and all(p in PHASES for p in f.phases):
        return None
    return (
        f"fault.phases={list(f.phases)}: fault.kind={f.kind} needs phases from {', '.join(PHASES)}"
    )


# slow_phase: every rank spends `seconds` more in each phase named in `phases`, each time it
# comes: a slow but healthy phase the hang watchdog must not kill, or a stalled one past
# the phase's allowance
def _slow_phase(fault: FaultInjector, _, phase: str) -> None:
    if phase in fault.cfg.phases:
        log.warning("fault.kind=slow_phase: %s takes %g s more", phase, fault.cfg.seconds)
        time.sleep(fault.cfg.seconds)


register(
    FaultKind(
        "slow_phase",
        {PHASE: _slow_phase},
        every_rank=True,
        rules=(phases_named, *AT_ITS_RANK_AND_STEP),
        lasting=lambda f: True,
    )
)


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


class _FailingWindows:
    """Windows whose fetch of one exact micro-batch (step S's first on this rank) raises
    in the DataLoader worker, as a corrupt shard or a lost file system would."""

    def __init__(self, windows: TokenWindows, poisoned: list[int], marker: Path):
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


class _SlowWindows:
    """Windows read from high-latency storage: each micro-batch read waits `seconds` (in
    the DataLoader worker when there are workers, which is what hides it)."""

    def __init__(self, windows: TokenWindows, seconds: float):
        self.windows = windows
        self.seconds = seconds

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int):
        return self.windows[index]

    def __getitems__(self, indices: list[int]):
        time.sleep(self.seconds)
        return [self.windows[i] for i in indices]
