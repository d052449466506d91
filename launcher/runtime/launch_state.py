"""What outlives one job of this process, in one object the front door creates and hands
down (no module-level state elsewhere).

A sweep runs its points as jobs of one process: they share the process group (torch
allows one default group per process) and its CPU control group, one sweep id naming
their run directories, and NCCL's log file, which NCCL opens once per process. The front
door adds up what the jobs leave: their exit codes, their run directories for the sweep
summary, and the last job's config, which says where that summary goes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.runtime.launch_clock import launch_started
from launcher.runtime.nccl_capture import Capture


@dataclass
class LaunchState:
    backend: str | None = None  # the process group's backend, once one exists
    control_group: Any = None  # gloo group for barriers, metric gathers and stop votes
    attempt: str | None = None  # the process group's own name (runtime.process.attempt_name)
    side_groups: dict[str, Any] = field(default_factory=dict)  # see Runtime.side_group
    sweep_id: str | None = None  # chosen by the first point of a sweep
    nccl_capture: Capture | None = None  # where this process's NCCL writes its INFO log
    swept_keys: list[str] = field(default_factory=list)  # the keys a sweep varies
    codes: list[int] = field(default_factory=list)  # each job's exit code, in order
    points: list[Path] = field(default_factory=list)  # sweep points' run directories
    last_cfg: Any = None  # the last job's config (where the sweep summary goes)
    # the jobs' progress lines go to their logs only (a tuner's trials: its own line each)
    quiet_progress: bool = False
    # with quiet_progress, the one logger whose INFO lines still reach the console (the
    # tuner's); the jobs' own start-up and closing lines stay in their logs, warnings show
    console_logger: str | None = None
    # where the next job's wall time counts from (epoch seconds): the launch's start, then
    # the end of each job (launcher.runtime.launch_clock)
    job_started: float = field(default_factory=launch_started)

    def forget_process_group(self) -> None:
        """After the group is destroyed: a later job of this process starts afresh."""
        self.backend = self.control_group = self.sweep_id = self.attempt = None
        self.side_groups.clear()
