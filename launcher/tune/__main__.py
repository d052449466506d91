"""`torchrun [--standalone --nproc_per_node=N] -m launcher.tune [overrides]`: tune the
experiment the overrides describe, in rounds, inside this one launch (docs/tuning.md).

The overrides are composed and checked as launcher.train would, together with the tuner's
own `tune.*` keys and the trials' settings, so a bad value is one line and exit code 2
before any process group starts. Then the rounds run (launcher.tune.rounds), and rank 0
writes tune/report.{md,json}, tune/tokens_per_s.png and tune/tuned.yaml into the run
directory, also when a stop request ends the tuning early (exit code 143).
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from launcher.config import ConfigError, friendly_overrides, sweep
from launcher.config.sweep import flatten
from launcher.paths import make_run_dir
from launcher.preflight import preflight
from launcher.resilience import exit_codes
from launcher.runtime import placement, run_dir_check
from launcher.runtime import process as runtime
from launcher.runtime.lock import LockHeld, tool_lock
from launcher.train import front_door as train
from launcher.train.bad_input import fail_bad_input
from launcher.tune.report import markdown, report_dict, write_all
from launcher.tune.rounds import Tuner
from launcher.tune.trials import PROFILED_STEPS, TUNE_LOGGER, Trials

log = logging.getLogger(TUNE_LOGGER)

USAGE = """usage: torchrun [--standalone --nproc_per_node=N] -m launcher.tune [overrides...]

Tune the training experiment the overrides describe (the same overrides launcher.train
takes, one experiment, not a sweep): rounds of a profiled run, the analyser's evidence,
timed trials of the changes it points at, keeping what gives more tokens/s than the
incumbent beyond the noise. Writes <run dir>/tune/report.{md,json}, tokens_per_s.png and
tuned.yaml.
Settings: tune.budget_s, tune.trial_steps, tune.repeats, tune.loss_tolerance, ...
(docs/tuning.md, docs/configuration.md)."""


def check(overrides: list[str]) -> DictConfig:
    """Everything a user can get wrong, before anything starts (ConfigError); returns the
    experiment's config, composed once (the composition that finds out it is one point)."""
    plan, points = sweep.compose_points(overrides, multirun=False)
    if len(points) > 1 or plan.swept_keys:
        raise ConfigError(
            f"launcher.tune tunes one experiment, but the overrides sweep "
            f"{', '.join(plan.swept_keys) or 'several points'}; give one value per key "
            "(the tuner chooses the values to try)"
        )
    cfg = points[0]
    preflight(cfg, placement.env_world()[2], placement.ranks_per_node())
    t = cfg.tune
    for key in ("trial_steps", "confirm_steps"):
        if t[key] < t.warmup_steps + PROFILED_STEPS:
            raise ConfigError(
                f"tune.{key}={t[key]} leaves fewer than {PROFILED_STEPS} steps after "
                f"tune.warmup_steps={t.warmup_steps} to time and profile; raise it to at least "
                f"{t.warmup_steps + PROFILED_STEPS}"
            )
    skip_problem(cfg)
    Trials(overrides).config({}, t.trial_steps, t.warmup_steps, profile=True)
    return cfg


def skip_problem(cfg: DictConfig) -> None:
    """tune.skip names config keys (the tuner never changes them); a name that is none,
    a typo among them, would silently let the tuner change the key it meant."""
    keys = list(flatten(OmegaConf.to_container(cfg, resolve=False)))
    for key in cfg.tune.skip:
        if str(key) not in keys:
            near = difflib.get_close_matches(str(key), keys, n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            raise ConfigError(
                f"tune.skip: {key} is not a key of this experiment's config{hint}; name the "
                f"keys the tuner must leave alone as launcher.train takes them, e.g. "
                f"tune.skip=[data.num_workers]"
            )


def tune() -> int:
    """Check, run the rounds, write the report; returns the exit code."""
    args = sys.argv[1:]
    if any(a in ("-h", "--help") for a in args):
        print(USAGE)
        return exit_codes.DONE
    overrides = friendly_overrides(args)
    try:
        cfg = check(overrides)
    except ConfigError as exc:
        fail_bad_input(exc)
    with own_run_dir(cfg):
        tuner = Tuner(cfg, overrides)
        try:
            tuner.run()
        finally:
            run_dir = tuner.trials.run_dir
            if run_dir is not None and placement.env_world()[0] == 0:
                for path in write_all(tuner, run_dir, overrides, cfg.logger):
                    log.info("wrote %s", path)
                print(markdown(report_dict(tuner, run_dir, overrides)))
            runtime.teardown(tuner.trials.launch)
    return exit_codes.STOPPED if tuner.stopped else exit_codes.DONE


@contextlib.contextmanager
def own_run_dir(cfg: DictConfig):
    """Rank 0 holds `<run dir>/.tune.lock` while the tuning runs (with a run.id: a new
    one's directory is its own): a second tuning of the same run.id stops in one line
    rather than run its trials into the first one's and overwrite its report."""
    if cfg.run.id is None or placement.env_world()[0] != 0:
        yield
        return
    run_dir = Path(cfg.run.root).expanduser() / str(cfg.run.id)
    problem = run_dir_check.problem(run_dir, placement.env_world()[2])
    if problem:
        fail_bad_input(ConfigError(problem))
    make_run_dir(run_dir, Path(cfg.run.root).expanduser(), cfg.run.access)
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(tool_lock(run_dir, "tune", "use another run.id"))
        except LockHeld as exc:
            fail_bad_input(ConfigError(str(exc)))
        yield


def main() -> None:
    train.main(tune)


if __name__ == "__main__":
    main()
