"""`torchrun -m launcher.train [overrides]`: compose, validate, run. Nothing else.

Every point of the launch (one, or each point of a sweep: `+exp=bucket_sweep`,
`-m key=a,b`) is composed once, with Hydra's compose API and the sweep's points as Hydra's
basic sweeper orders them, and checked before anything starts (a problem is one line and exit
code 2); the checked configs are the jobs' configs, run one after another in this process on
one process group, then rank 0 writes the sweep summary. Hydra itself only answers --help and
its other printing flags.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from launcher.config import ConfigError, friendly_overrides, sweep
from launcher.config.compose import config_groups, default_groups, wrong_form_problem
from launcher.config.schema import register_schema
from launcher.data.loader import reap_workers
from launcher.observe import tensorboard_sink, wandb_sink
from launcher.resilience import exit_codes
from launcher.resilience.preemption import install_stop_handlers, job_ended
from launcher.runtime import placement
from launcher.runtime import process as runtime
from launcher.runtime.args_file import with_args_file
from launcher.runtime.exit_gc import skip_collection_at_exit
from launcher.runtime.launch_state import LaunchState
from launcher.runtime.process_tree import WARM_COMMAND_ENV
from launcher.train.bad_input import check_or_exit, fail_bad_input
from launcher.train.job import run

log = logging.getLogger("launcher")


# Hydra's command-line flags (hydra/_internal/utils.py's parser, rebuilt here: that one is
# private). The printing ones are Hydra's to answer; the rest the front door reads itself.
HYDRA_PRINTS = ("help", "hydra_help", "version", "info", "shell_completion")


class FlagError(argparse.ArgumentParser):
    """A flag launcher.train does not take is one line (fail_bad_input), not argparse's
    usage block: most often an override written with dashes (`--trainer.max_steps=5`)."""

    def error(self, message: str):
        flags = [a for a in message.partition(": ")[2].split() if a.startswith("-")]
        if flags:
            problem = wrong_form_problem(flags[0])
            if problem:
                raise ConfigError(problem)
        raise ConfigError(f"{message}; python -m launcher.train --help lists the flags")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = FlagError(add_help=False)
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--help", "-h", action="store_true")
    parser.add_argument("--hydra-help", action="store_true")
    parser.add_argument("--version", action="store_true")
    parser.add_argument("--cfg", "-c", choices=["job", "hydra", "all"])
    parser.add_argument("--resolve", action="store_true")
    parser.add_argument("--package", "-p")
    parser.add_argument("--run", "-r", action="store_true")
    parser.add_argument("--multirun", "-m", action="store_true")
    parser.add_argument("--shell-completion", "-sc", action="store_true")
    parser.add_argument("--config-path", "-cp")
    parser.add_argument("--config-name", "-cn")
    parser.add_argument("--config-dir", "-cd")
    parser.add_argument("--experimental-rerun")
    parser.add_argument("--info", "-i", const="all", nargs="?")
    return parser.parse_intermixed_args(argv)


def hide_schema_options() -> None:
    """Hydra's --help lists every option of a group, the schemas registered beside the
    option files (`ddp_schema`, ...) too; list only what a user can choose (a schema given as
    an option is refused: launcher.config.compose.refuse_schema_options), each group as it
    is typed: an added one (`exp`) with its +."""
    from hydra._internal.hydra import Hydra  # Hydra builds $APP_CONFIG_GROUPS here (1.3)

    listed = Hydra.format_config_groups

    def choosable(self, predicate, compact=True):
        lines = listed(self, predicate, compact).splitlines()
        if not compact:
            return "\n".join(ln for ln in lines if not ln.strip().endswith("_schema"))
        out = []
        for line in lines:
            group, sep, options = line.partition(": ")
            kept = [o for o in options.split(", ") if not o.endswith("_schema")]
            typed = f"+{group}" if group in config_groups() - default_groups() else group
            out.append(f"{typed}{sep}{', '.join(kept)}" if sep else line)
        return "\n".join(out)

    Hydra.format_config_groups = choosable


def hydra_prints() -> None:
    """--help, --hydra-help, --info, --shell-completion, --cfg hydra|all: Hydra answers
    from the command line as given (the schemas registered first, for the group lists)."""
    hide_schema_options()

    @hydra.main(config_path="pkg://launcher.conf", config_name="train", version_base="1.3")
    def answered(cfg: DictConfig) -> None:  # reached only by --cfg: Hydra prints and returns
        return None

    try:
        answered()
        sys.stdout.flush()
    except BrokenPipeError:  # `--help | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


# What a warm start's fork server composed for its agent's command before forking any rank
# (`compose_ahead`), by the command's arguments: each forked rank finds its own there and
# skips Hydra's composition, which costs a rank 0.3-0.6 CPU-s: 16 ranks on 2 cores waited
# 2.8 s for it at every restart. The ranks still check their configs (a check reads the
# rank's world).
COMPOSED_AHEAD: dict[tuple[str, ...], tuple[argparse.Namespace, sweep.Plan, list]] = {}


def compose_ahead(environ=os.environ) -> None:
    """In a warm start's fork server (launcher.warm_preload): compose the ranks' command (its
    agent's, `WARM_COMMAND_ENV`) as each rank's `train` would and keep it for them, where it
    is this front door's. Nothing is kept where it does not compose, or prints instead of
    training: each rank then does what a cold one does, the one line of a bad input
    included. Like the server's imports, the composition is the server's start's for every
    restart of the launch: a config file edited while the job runs (a --config-dir
    experiment) counts from the next launch."""
    command = shlex.split(environ.get(WARM_COMMAND_ENV, ""))
    if command[:2] != ["-m", "launcher.train"]:
        return
    argv = command[2:]
    try:
        register_schema()
        argv = with_args_file(argv)
        args = parse_args(argv)
        if any(getattr(args, flag) for flag in HYDRA_PRINTS) or args.cfg:
            return
        composed = sweep.compose_points(checked_overrides(args), args.multirun)
    except (Exception, SystemExit):  # noqa: BLE001 - the rank composes it again and says why
        return
    COMPOSED_AHEAD[tuple(argv)] = (args, *composed)


def check_points(overrides: list[str], multirun: bool,
                 composed: tuple | None = None) -> tuple[sweep.Plan, list[DictConfig]]:  # fmt: skip
    """Compose (unless `composed` already) and validate every point before anything starts
    (one line and exit 2): the configs the jobs run, composed once."""
    try:
        plan, configs = composed or sweep.compose_points(overrides, multirun)
    except ConfigError as exc:
        fail_bad_input(exc)
    for cfg in configs:
        check_or_exit(cfg)
    try:
        sweep.check_launch_wide(configs)
    except ConfigError as exc:
        fail_bad_input(exc)
    return plan, configs


def run_point(launch: LaunchState, cfg: DictConfig, point: str | None) -> bool:
    """One job (one point of a sweep), its exit code and run directory recorded in
    `launch`; False when the launch must not go on to another point."""
    try:
        code = run(cfg, launch, point)
    except Exception as exc:
        if not getattr(exc, "launcher_settled", False):  # else said once, traceback in the log
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
    return code != exit_codes.STOPPED  # a stop request ends the sweep; a requeue resumes it


def write_sweep_summary(launch: LaunchState) -> None:
    if placement.env_world()[0] != 0 or not launch.points:
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


def checked_overrides(args: argparse.Namespace) -> list[str]:
    """The overrides as composed: list keys given one value made lists, and a
    --config-dir searched first (an exp/ of the user's own, or tuned.yaml's folder)."""
    for flag, value in (("--config-name", args.config_name), ("--config-path", args.config_path)):
        if value:
            fail_bad_input(ConfigError(
                f"{flag} {value}: the training config is launcher's own train.yaml; put your "
                f"experiment in a folder given with --config-dir and select it with +exp=<name>"
            ))  # fmt: skip
    overrides = friendly_overrides(args.overrides)
    if not args.config_dir:
        return overrides
    where = Path(args.config_dir).expanduser().resolve()
    if not where.is_dir():
        fail_bad_input(ConfigError(f"--config-dir {args.config_dir}: no such directory"))
    return [f"hydra.searchpath=[file://{where}]", *overrides]


def train() -> int:
    """Check the overrides and compose every point once, run each point in this process on
    one process group, then summarise a sweep and leave the process group; returns the exit
    code. Hydra answers --help and the other printing flags."""
    ahead = COMPOSED_AHEAD.get(tuple(sys.argv[1:]))
    if ahead is not None:  # a warm rank: its fork server composed this command
        args, plan, configs = ahead
        plan, configs = check_points([], args.multirun, (plan, configs))
    else:
        register_schema()  # the engines' schemas, before Hydra reads the config module
        try:
            args = parse_args(sys.argv[1:])
        except ConfigError as exc:
            fail_bad_input(exc)
        if any(getattr(args, flag) for flag in HYDRA_PRINTS) or args.cfg in ("hydra", "all"):
            hydra_prints()
            return exit_codes.DONE
        plan, configs = check_points(checked_overrides(args), args.multirun)
    if args.cfg == "job":
        for cfg in configs:
            print(OmegaConf.to_yaml(cfg, resolve=args.resolve), end="")
        return exit_codes.DONE
    launch = LaunchState()
    launch.swept_keys = plan.swept_keys
    ended = False
    try:
        for overrides, cfg in zip(plan.points, configs, strict=True):
            point = sweep.point_label(overrides, plan.swept_keys) if plan.multirun else None
            if not run_point(launch, cfg, point):
                break
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
    skip_collection_at_exit()
    code = exit_codes.CRASH
    try:
        sys.argv[1:] = with_args_file(sys.argv[1:])  # a cluster job's overrides (Slurm)
        code = entry()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        raise
    finally:
        reap_workers()
        job_ended()
        exit_codes.report(code)
    if code:
        sys.exit(code)
