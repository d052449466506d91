"""What every case reads and does through one object: the experiment, the shrunk overrides,
where the cases' runs go, how a case launches, and the uninterrupted run that the stop,
restart and world-size cases compare with (launched once, by the first case that asks)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from omegaconf import DictConfig

from launcher.rehearse import report
from launcher.rehearse.launches import CaseFailed, Launch, last_step, losses
from launcher.rehearse.shrink import STEPS

FOLDER = "rehearse"


class Rehearsal:
    """What every case reads: the experiment, the shrunk overrides, where runs go, and the
    uninterrupted run the stop, restart and world-size cases compare with."""

    def __init__(self, cfg: DictConfig, user_overrides: list[str], shrunk_overrides: list[str],
                 nproc: int, run_dir: Path):  # fmt: skip
        self.cfg = cfg
        self.user_overrides = user_overrides
        self.overrides = shrunk_overrides
        self.nproc = nproc
        self.run_dir = run_dir
        self.root = run_dir / FOLDER
        self.timeout_s = float(cfg.rehearse.timeout_s)
        self.checkpoint: report.StopCheckpoint | None = None
        self._baseline: dict[int, float] | CaseFailed | None = None

    def case_dir(self, case: str) -> Path:
        return self.root / case

    def launch(self, case: str, leg: str = "", extra=(), nproc: int | None = None,
               torchrun_args: tuple[str, ...] = ()) -> Launch:  # fmt: skip
        console = self.root / "console" / (f"{case}-{leg}.txt" if leg else f"{case}.txt")
        return Launch(self.case_dir(case), [*self.overrides, *extra], nproc or self.nproc,
                      console, self.timeout_s, torchrun_args)  # fmt: skip

    def baseline(self) -> dict[int, float]:
        """The uninterrupted run's losses (launched by the first case that asks)."""
        if self._baseline is None:
            try:
                code = self.launch("baseline").finish()
                got = losses(self.case_dir("baseline"))
                if code or last_step(self.case_dir("baseline")) != STEPS:
                    raise CaseFailed(
                        f"the uninterrupted run (rehearse/baseline) ended with exit {code} "
                        f"after {max(got, default=0)} of {STEPS} steps"
                    )
                self._baseline = got
            except CaseFailed as exc:
                self._baseline = exc
        if isinstance(self._baseline, CaseFailed):
            raise self._baseline
        return self._baseline

    def baseline_checkpoints(self) -> list[int]:
        folder = self.case_dir("baseline") / "checkpoints"
        return sorted(int(p.name[5:]) for p in folder.glob("step_*") if p.name[5:].isdigit())

    @staticmethod
    def kill_pid(pid: int) -> None:
        os.kill(pid, signal.SIGKILL)
