"""What a run directory already holds of its run's history, and what a launch that would
start from step 0 there must do with it.

A run directory's history (metrics.jsonl's records, summary.json) belongs to it: a launch
that continues the run appends to it; one that would start over must not overwrite it
without a word. Rank 0 reads this under the run directory's lock, with the checkpoints
(launcher.checkpoint.resume), before anything there is written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from launcher.config import ConfigError


@dataclass
class History:
    """metrics.jsonl's records (how many, the last step) and summary.json's account."""

    records: int = 0
    last_step: int | None = None
    status: str | None = None  # summary.json's "status", None when there is none
    steps: int | None = None  # summary.json's "steps"

    @property
    def empty(self) -> bool:
        return not self.records and self.status is None

    @property
    def completed(self) -> bool:
        return self.status == "completed"

    def describe(self) -> str:
        """'metrics.jsonl (4 records, to step 4), summary.json (completed at step 4)'."""
        parts = []
        if self.records:
            parts.append(f"metrics.jsonl ({self.records} records, to step {self.last_step})")
        if self.status is not None:
            at = f" at step {self.steps}" if self.steps is not None else ""
            parts.append(f"summary.json ({self.status}{at})")
        return ", ".join(parts)


def read(run_dir: Path) -> History:
    """The history in `run_dir`; unreadable lines and an unreadable summary count as what
    they are (records are not counted, a summary is one with status 'unreadable')."""
    found = History()
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        text = metrics.read_bytes().decode("utf-8", errors="replace")
        steps = [s for s in map(record_step, text.splitlines()) if s is not None]
        found.records = len(steps)
        found.last_step = max(steps, default=None)
    summary = run_dir / "summary.json"
    if summary.is_file():
        try:
            data = json.loads(summary.read_text())
            found.status = str(data["status"])
            found.steps = data.get("steps") if isinstance(data.get("steps"), int) else None
        except (OSError, ValueError, KeyError, TypeError):
            found.status = "unreadable"
    return found


def fresh_start_over(history: History, run_dir: Path, resume: str, hint: str) -> None:
    """A launch is about to start from step 0 in `run_dir`, which holds `history` and no
    checkpoint to continue from. Refuse (ConfigError) when that would overwrite a finished
    run or when the user asked for a fresh start (`resume=never`) over one; return when
    the history is an unfinished attempt that a restart redoes (the caller moves it
    aside first, see launcher.checkpoint.resume)."""
    if history.empty:
        return
    if resume == "never":
        raise ConfigError(
            f"resume=never but {run_dir} already holds a run's history "
            f"({history.describe()}), which a fresh start would overwrite; {hint}"
        )
    if history.completed:
        raise ConfigError(
            f"{run_dir} holds a completed run ({history.describe()}) and no checkpoint to "
            f"continue it from (it ran with trainer.checkpoint_interval=0), so this launch "
            f"would start over and overwrite it; {hint}"
        )


def record_step(line: str) -> int | None:
    """The step of a metrics.jsonl line, or None when the line is not a record."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    step = record.get("step") if isinstance(record, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None
