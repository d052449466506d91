"""One trial: a fresh, short training job of the experiment with some changes, in its own
run directory `tune/trials/<label>/` of the tuning run, on the launch's process group.

Every trial starts from the same weights (the seed) and the same data position (the
step-indexed sampler) with `resume=never`, checkpoints and evaluation off, and logs every
step, so that trials differ only in the change under test. Rank 0 reads the trial's
summary.json and metrics.jsonl and every rank gets the same figures, so that all ranks take
the same decisions afterwards.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from launcher import exit_codes, job, runtime
from launcher.config import ConfigError, compose
from launcher.preemption import stop_requested
from launcher.preflight import preflight
from launcher.tune.candidates import override_value
from launcher.tune.decision import Trial

TRIALS = "tune/trials"
# What makes a trial a measurement: fresh, every step logged, nothing else in the steps.
TRIAL_SETTINGS = (
    "resume=never",
    "trainer.log_interval=1",
    "trainer.eval_interval=0",
    "trainer.checkpoint_interval=0",
    "logger.mode=disabled",
    "logger.tensorboard=false",
)
NO_PROFILE = ("profiler=off",)
# The profiled trial: step 1 (start-up) skipped, step 2 warms the profiler up, 3-4 recorded.
PROFILE = (
    "profiler=steps",
    "profiler.skip_first=1",
    "profiler.wait=0",
    "profiler.warmup=1",
    "profiler.active=2",
    "profiler.repeat=1",
)


def override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def merged(user: list[str], extra: list[str]) -> list[str]:
    """The user's overrides with `extra` on top: a key both give takes extra's value."""
    mine = {override_key(o) for o in extra}
    return [o for o in user if override_key(o) not in mine] + list(extra)


def as_overrides(changes: dict[str, Any]) -> list[str]:
    return [f"{k}={override_value(v)}" for k, v in changes.items()]


class Trials:
    """Runs trials one after another in this process and keeps the launch's clock: the
    elapsed time and a stop request are rank 0's and any rank's, the same on every rank."""

    def __init__(self, user_overrides: list[str]):
        self.user = list(user_overrides)
        self.started = time.monotonic()
        self.elapsed_s = 0.0
        self.stopped = False
        self.run_dir: Path | None = None  # the tuning run's directory, once the first job ran
        self.last_cfg: DictConfig | None = None

    def config(self, changes: dict[str, Any], steps: int, profile: bool = False) -> DictConfig:
        """The composed, checked config of a trial (ConfigError if the change is refused)."""
        extra = [*as_overrides(changes), f"trainer.max_steps={steps}", *TRIAL_SETTINGS]
        cfg = compose(merged(self.user, [*extra, *(PROFILE if profile else NO_PROFILE)]))
        preflight(cfg, runtime.env_world()[2], runtime.ranks_per_node())  # normalizes too
        return cfg

    def run(self, label: str, changes: dict[str, Any], steps: int, profile=False) -> Trial:
        """Train one trial and return its figures (a refused or failed trial says why)."""
        try:
            cfg = self.config(changes, steps, profile)
        except ConfigError as exc:
            return Trial(label, f"refused: {exc}")
        self.last_cfg = cfg
        code = job.run(cfg, f"{TRIALS}/{label}")
        if code is None:
            raise RuntimeError(f"trial {label} did not end cleanly")
        self.run_dir = Path(cfg.run.root).expanduser() / runtime.sweep_id()
        rt = runtime.launch_runtime()
        figures = read_trial(self.run_dir / TRIALS / label, label, code) if rt.is_main else None
        now = time.monotonic() - self.started
        trial, self.elapsed_s = rt.broadcast_object((figures, now))
        stops = rt.all_gather_objects(stop_requested() or code == exit_codes.STOPPED)
        self.stopped = self.stopped or any(stops)
        return trial


def read_trial(run_dir: Path, label: str, code: int) -> Trial:
    """The trial's figures: step time and tokens/s from summary.json (medians over the
    steps after the first), its mean loss over every logged step from metrics.jsonl."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
        losses = [
            r["loss"]
            for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if r.get("loss") is not None
        ]
    except (OSError, ValueError) as exc:
        return Trial(label, f"exit {code}: {exc}")
    status = summary.get("status", "?")
    if code and status == "completed":
        status = f"exit {code} ({exit_codes.MEANING.get(code, '?')})"
    return Trial(
        label,
        status,
        p50_s=summary.get("step_time_s/p50"),
        p90_s=summary.get("step_time_s/p90"),
        tokens_per_s=summary.get("tokens_per_s"),
        mean_loss=statistics.fmean(losses) if losses else None,
        wall_s=summary.get("wall_time_s") or 0.0,
    )
