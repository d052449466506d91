"""`torchrun -m launcher.train [overrides]`: compose, validate, run. Nothing else.

Hydra's own error output spans several lines; so before Hydra starts, the overrides are
composed and checked once here, for every point of a sweep, and a problem becomes one line
and exit code 2. A sweep (`+exp=bucket_sweep`, `-m key=a,b`) runs its points one after
another in this process, on one process group, then rank 0 writes the sweep summary.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path

import hydra
from hydra._internal.utils import get_args_parser
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from launcher.config import ConfigError, friendly_overrides, sweep
from launcher.config.schema import register_schema
from launcher.data.loader import reap_workers
from launcher.observe import tensorboard_sink, wandb_sink
from launcher.resilience import exit_codes
from launcher.resilience.preemption import install_stop_handlers
from launcher.runtime import process as runtime
from launcher.runtime.launch_state import LaunchState
from launcher.train.job import check_or_exit, fail_bad_input, run

log = logging.getLogger("launcher")


def hydra_entry(launch: LaunchState):
    """The function `@hydra.main` runs once per job (once per point of a sweep), recording
    each job's exit code and run directory in `launch`."""

    register_schema()  # the engines' schemas, before Hydra reads the config module

    @hydra.main(config_path="pkg://launcher.conf", config_name="train", version_base="1.3")
    def run_job(cfg: DictConfig) -> None:
        hc = HydraConfig.get()
        point = None
        if hc.mode == RunMode.MULTIRUN:
            # A stop request ends the sweep; a requeue resumes it.
            if exit_codes.STOPPED in launch.codes:
                return
            point = sweep.point_label(list(hc.overrides.task), launch.swept_keys)
        try:
            code = run(cfg, launch, point)
        except Exception:
            log.exception("the run failed")
            code = None
        if code is None:
            # The ranks may disagree about where they are: end the process (torchrun then
            # stops the others) rather than start the next sweep point out of step. Raised
            # outside the `except`, so that no traceback keeps the run's model, DDP reducer
            # and loader workers alive while the process group is torn down.
            raise SystemExit(exit_codes.CRASH)
        launch.codes.append(code)
        launch.last_cfg = cfg
        if point is not None:
            launch.points.append(Path(cfg.run.root).expanduser() / launch.sweep_id / point)

    return run_job


def check_points(overrides: list[str], multirun: bool) -> sweep.Plan:
    """Compose and validate every point before anything starts (one line and exit 2)."""
    try:
        plan, configs = sweep.compose_points(overrides, multirun)
    except ConfigError as exc:
        fail_bad_input(exc)
    for cfg in configs:
        check_or_exit(cfg)
    try:
        sweep.check_launch_wide(configs)
    except ConfigError as exc:
        fail_bad_input(exc)
    return plan


def write_sweep_summary(launch: LaunchState) -> None:
    if runtime.env_world()[0] != 0 or not launch.points:
        return
    dirs = launch.points
    sweep_id = launch.sweep_id
    title = f"sweep {sweep_id}"
    rows, paths = sweep.summarize(dirs, dirs[0].parent, title=title)
    log.info("sweep summary:\n%s", sweep.markdown_table(rows, title))
    for path in paths:
        log.info("wrote %s", path)
    root = Path(launch.last_cfg.run.root).expanduser()
    for sink in (wandb_sink, tensorboard_sink):  # each imports its package only when enabled
        sink.log_sweep_summary(launch.last_cfg.logger, root, sweep_id, rows, paths[-1])


def train() -> int:
    """Check the overrides, hand over to Hydra (which also handles --help and -m), then
    summarise a sweep and leave the process group; returns the exit code."""
    args = get_args_parser().parse_args(sys.argv[1:])
    friendly = dict(zip(args.overrides, friendly_overrides(args.overrides), strict=True))
    sys.argv[1:] = [friendly.get(a, a) for a in sys.argv[1:]]  # what Hydra will compose
    args.overrides = [friendly[o] for o in args.overrides]
    launch = LaunchState()
    if not (args.help or args.hydra_help or args.cfg or args.info or args.shell_completion):
        checked = args.overrides
        if args.config_dir:  # Hydra searches it first (e.g. exp/ of the user's own, or tuned)
            where = Path(args.config_dir).expanduser().resolve()
            if not where.is_dir():
                fail_bad_input(ConfigError(f"--config-dir {args.config_dir}: no such directory"))
            checked = [f"hydra.searchpath=[file://{where}]", *checked]
        launch.swept_keys = check_points(checked, args.multirun).swept_keys
    ended = False
    try:
        hydra_entry(launch)()
        write_sweep_summary(launch)
        ended = True
    finally:
        # Every job that returned has been collected after (end_job); one that raised may
        # have left its DDP reducer to the collector.
        runtime.teardown(launch, collect=not ended)
    return next((c for c in launch.codes if c), exit_codes.DONE)


def main(entry: Callable[[], int] = train) -> None:
    """Train (or run another front door's `entry`, launcher.tune's), and leave the exit
    code where `launcher.torchrun` reads it, however it ends."""
    install_stop_handlers()  # before anything slow: a stop while starting up is kept
    runtime.skip_collection_at_exit()
    code = exit_codes.CRASH
    try:
        code = entry()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        raise
    finally:
        reap_workers()
        exit_codes.report(code)
    if code:
        sys.exit(code)
