"""What a non-finite loss does to the run (trainer.on_nonfinite, docs/faults.md): stop with
exit code 3 keeping the last good checkpoint, drop the step on every rank (skip), or go back
to the newest checkpoint past the bad data window (rewind). Every verdict is collective, so
every rank takes the same road."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NoReturn

import torch

from launcher.checkpoint.manager import CheckpointManager
from launcher.config.schema import TrainerConfig
from launcher.observe.metrics import Interval
from launcher.observe.recorder import Recorder
from launcher.runtime.process import Runtime

log = logging.getLogger("launcher")


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or infinite; the run stops without saving a checkpoint."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


class Rewound(Exception):
    """trainer.on_nonfinite=rewind restored checkpoint `step`: the loop goes on from it."""

    def __init__(self, step: int):
        super().__init__(f"rewound to step {step}")
        self.step = step


class NonFinite:
    """The policy's verdicts for one run; its counts are the recorder's."""

    def __init__(
        self, t: TrainerConfig, rt: Runtime, checkpoints: CheckpointManager, recorder: Recorder
    ):
        self.t, self.rt, self.checkpoints, self.recorder = t, rt, checkpoints, recorder

    def check(self, step: int, interval: Interval) -> None:
        """Before a checkpoint: collective, so that every rank refuses together."""
        bad = interval.nonfinite
        flags = self.rt.all_gather_floats([float(bad.item()) if bad is not None else 0.0])
        ranks = [r for r, (flag,) in enumerate(flags) if flag]
        if ranks:
            self.stop(step, ranks)

    def stop(self, step: int, ranks: list[int], why: str = "") -> NoReturn:
        latest = self.checkpoints.last_good()  # an asynchronous save of an earlier step counts
        kept = f"the last good checkpoint {latest} is kept" if latest else "no checkpoint was saved"
        raise NonFiniteLoss(
            f"non-finite loss by step {step} on rank(s) {ranks}{why}: the run stopped and {kept}; "
            "lower trainer.lr, keep trainer.grad_clip > 0, or use trainer.precision=bf16 "
            "rather than fp16",
            step,
        )

    def bad_ranks(self, losses: list[torch.Tensor]) -> list[int]:
        """The ranks whose loss this step is not finite, agreed by all (none asked with
        on_nonfinite=stop): one tiny all-gather and one device sync per step, the policy's
        cost."""
        if self.t.on_nonfinite == "stop":
            return []
        bad = float(not all(torch.isfinite(loss.detach()).item() for loss in losses))
        flags = self.rt.all_gather_floats([bad])
        return [r for r, (flag,) in enumerate(flags) if flag]

    def skip(self, step: int, ranks: list[int], interval: Interval) -> None:
        """Step `step` was dropped on every rank; stop (exit 3) when it is one too many."""
        t, bad_steps = self.t, self.recorder.bad_steps
        interval.dropped += 1
        if bad_steps.record(step):
            self.stop(
                step,
                ranks,
                f" ({bad_steps.in_window()} bad steps within {t.bad_step_window}, more "
                f"than trainer.max_bad_steps={t.max_bad_steps})",
            )
        if self.rt.is_main:
            log.warning(
                "non-finite loss in step %d on rank(s) %s: its update is dropped on every rank "
                "(trainer.on_nonfinite=%s; %d of trainer.max_bad_steps=%d within %d steps)",
                step, ranks, t.on_nonfinite, bad_steps.in_window(), t.max_bad_steps,
                t.bad_step_window,
            )  # fmt: skip

    def rewind_target(self, step: int, ranks: list[int]) -> tuple[Path, int]:
        """(the checkpoint to go back to, the data window that made step `step` bad, which
        is skipped from now on); with no checkpoint yet the run stops."""
        folder = self.checkpoints.rewind_target()
        if folder is None:
            self.stop(step, ranks, " (trainer.on_nonfinite=rewind: no checkpoint yet)")
        window = self.checkpoints.data_step - 1
        self.checkpoints.skip_windows.add(window)
        self.recorder.rewinds += 1
        return folder, window
