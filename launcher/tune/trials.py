"""One trial: a fresh, short training job of the experiment with some changes, in its own
run directory `tune/trials/<label>/` of the tuning run, on the launch's process group.

Every trial starts from the same weights (the seed) and the same data position (the
step-indexed sampler), checkpoints and evaluation off, and logs every step, so that trials
differ only in the change under test. `resume=archive`: a trial folder that an earlier,
stopped tune of the same run left (its stop checkpoint, its metrics) is moved to the
folder's archive/<time>/ with a warning, and the trial starts fresh. Rank 0 reads the trial's
summary.json and metrics.jsonl and every rank gets the same figures, so that all ranks take
the same decisions afterwards.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from launcher.config import ConfigError, compose
from launcher.preflight import preflight
from launcher.resilience import exit_codes
from launcher.resilience.preemption import stop_requested
from launcher.runtime import placement
from launcher.runtime import process as runtime
from launcher.runtime.launch_state import LaunchState
from launcher.train import job
from launcher.tune.candidates import override_value
from launcher.tune.decision import Trial

TUNE_LOGGER = "launcher.tune"  # its INFO lines alone reach the console during trials
log = logging.getLogger(TUNE_LOGGER)

TRIALS = "tune/trials"
# What makes a trial a measurement: fresh, every step logged, nothing else in the steps.
TRIAL_SETTINGS = (
    "resume=archive",
    "trainer.log_interval=1",
    "trainer.eval_interval=0",
    "trainer.checkpoint_interval=0",
    "logger.mode=disabled",
    "logger.tensorboard=false",
    "run.report=false",  # a trial's picture nobody opens: a second of rank 0's CPU saved
)
NO_PROFILE = ("profiler=off",)
PROFILED_STEPS = 3  # the profiled trial, after its warm-up: 1 step warms the profiler, 2 recorded


def profile_settings(warmup: int) -> list[str]:
    """torch.profiler for the steps after the trial's warm-up: the evidence is about the
    steady state, as the timing is."""
    return [
        "profiler=steps",
        f"profiler.skip_first={warmup}",
        "profiler.wait=0",
        "profiler.warmup=1",
        f"profiler.active={PROFILED_STEPS - 1}",
        "profiler.repeat=1",
    ]


def clock(seconds: float) -> str:
    """m:ss (h:mm:ss from an hour on)."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def one_line(exc: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0].strip()}" if text else type(exc).__name__


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

    def __init__(self, user_overrides: list[str], budget_s: float = float("inf")):
        self.user = list(user_overrides)
        # the process group and run id the trials share; each trial's progress lines go to
        # its logs/rank0.log, the console gets one line per trial (announce)
        self.launch = LaunchState(quiet_progress=True, console_logger=TUNE_LOGGER)
        self.started = time.monotonic()
        self.elapsed_s = 0.0
        self.stopped = False
        self.run_dir: Path | None = None  # the tuning run's directory, once the first job ran
        self.last_cfg: DictConfig | None = None
        self.planned: tuple[str, int, int, float] | None = None  # see plan()
        self.budget_s = budget_s

    def plan(self, what: str, trials: int) -> None:
        """The next `trials` trials are `what` (a round's measurements, the confirmation):
        each one's start then says which of them it is and about how long the rest take."""
        self.planned = (what, trials, 0, time.monotonic())

    def announce(self, label: str) -> None:
        """One line per trial on rank 0: `tune: <what>, trial k of N (label); elapsed, left`."""
        if self.planned is None or placement.env_world()[0] != 0:
            return
        what, total, done, since = self.planned
        self.planned = (what, total, done + 1, since)
        elapsed = time.monotonic() - self.started
        left = ""
        if done:  # the mean trial so far, times the trials still to come (the budget bounds it)
            mean = (time.monotonic() - since) / done
            rest = min((total - done) * mean, max(self.budget_s - elapsed, 0.0))
            left = f", about {clock(rest)} left in it"
        log.info("tune: %s, trial %d of %d (%s); %s elapsed%s", what, min(done + 1, total),
                 total, label, clock(elapsed), left)  # fmt: skip

    def config(
        self, changes: dict[str, Any], steps: int, warmup: int, profile: bool = False
    ) -> DictConfig:
        """The composed, checked config of a trial (ConfigError if the change is refused)."""
        extra = [*as_overrides(changes), f"trainer.max_steps={steps}", *TRIAL_SETTINGS]
        extra += profile_settings(warmup) if profile else NO_PROFILE
        cfg = compose(merged(self.user, extra))
        preflight(cfg, placement.env_world()[2], placement.ranks_per_node())  # normalizes too
        return cfg

    def run(
        self, label: str, changes: dict[str, Any], steps: int, warmup: int, profile=False
    ) -> Trial:
        """Train one trial and return its figures (a refused or failed trial says why).

        A trial that raises (a knob torch cannot run with this model or engine) is a failed
        trial, not the end of the tuning: its job has torn itself down and written its
        summary, and every rank gets rank 0's reading of it, so all ranks reject it alike.
        """
        self.announce(label)
        try:
            cfg = self.config(changes, steps, warmup, profile)
        except ConfigError as exc:
            log.warning("tune: trial %s refused: %s", label, exc)
            return Trial(label, f"refused: {exc}")
        self.last_cfg = cfg
        try:
            code = job.run(cfg, self.launch, f"{TRIALS}/{label}")
        except Exception as exc:  # noqa: BLE001 - any crash rejects the candidate, reason kept
            log.warning("tune: trial %s crashed: %s", label, one_line(exc))
            code = exit_codes.CRASH
        self.run_dir = Path(cfg.run.root).expanduser() / self.launch.sweep_id
        rt = runtime.launch_runtime(self.launch)
        trial_dir = self.run_dir / TRIALS / label
        figures = read_trial(trial_dir, label, code, warmup) if rt.is_main else None
        now = time.monotonic() - self.started
        trial, self.elapsed_s = rt.broadcast_object((figures, now))
        stops = rt.all_gather_objects(stop_requested() or code == exit_codes.STOPPED)
        self.stopped = self.stopped or any(stops)
        return trial


def error_line(run_dir: Path) -> str | None:
    """The last `error: ...` line rank 0 logged for the trial, without the prefix."""
    try:
        lines = (run_dir / "logs" / "rank0.log").read_text().splitlines()
    except OSError:
        return None
    errors = [line.partition("error: ")[2] for line in lines if "error: " in line]
    return errors[-1] if errors else None


def read_trial(run_dir: Path, label: str, code: int, warmup: int) -> Trial:
    """The trial's figures from metrics.jsonl (one row per step, aggregated over ranks):
    step time p50/p90 and tokens/s as medians over the steps after the first `warmup`
    (start-up, DDP's bucket rebuild and each all-reduce's first use are slow, more so for
    some candidates than others), the mean loss over every step."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError) as exc:  # refused inside the job (bad data): its own line
        why = error_line(run_dir) or str(exc)
        return Trial(label, f"exit {code} ({exit_codes.MEANING.get(code, '?')}): {why}")
    try:  # a trial that failed before its first step has no metrics: its status says why
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in lines]
    except (OSError, ValueError):
        rows = []
    rows = [r for r in rows if r.get("loss") is not None]
    timed = rows[warmup:]

    def median(key: str) -> float | None:
        values = [r[key] for r in timed if r.get(key) is not None]
        return statistics.median(values) if values else None

    status = summary.get("status", "?")
    if code and status == "completed":
        status = f"exit {code} ({exit_codes.MEANING.get(code, '?')})"
    return Trial(
        label,
        status,
        p50_s=median("step_time_s/p50"),
        p90_s=median("step_time_s/p90"),
        tokens_per_s=median("tokens_per_s"),
        mean_loss=statistics.fmean(r["loss"] for r in rows) if rows else None,
        wall_s=summary.get("wall_time_s") or 0.0,
    )
