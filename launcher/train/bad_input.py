"""How a front door ends on bad input: the problem in one line on rank 0, exit code 2 on every
rank, before any process group, worker or file of the run exists."""

from __future__ import annotations

import sys
import time

from omegaconf import DictConfig

from launcher.config import ConfigError
from launcher.preflight import preflight
from launcher.resilience import exit_codes
from launcher.resilience.preemption import end_quietly, stop_requested
from launcher.runtime.placement import env_world, ranks_per_node

BAD_INPUT_LINGER_S = 20.0
STOP_POLL_S = 0.05  # how often a lingering rank looks for torchrun's SIGTERM


def fail_bad_input(exc: ConfigError) -> None:
    """One line on rank 0 (every rank finds the same problem), exit code 2 everywhere.

    The other ranks linger before exiting: torchrun stops every rank as soon as one exits,
    and a rank that got there first would otherwise take rank 0 down before it printed.
    Rank 0's exit ends the others' wait: torchrun then sends them SIGTERM, which the stop
    handler (installed first, see launcher.resilience.preemption) records instead of ending the
    process, so the wait watches for that request; BAD_INPUT_LINGER_S bounds it where no
    launcher stops the others.
    """
    rank = env_world()[0]
    if rank == 0:
        print(f"error: {exc}", file=sys.stderr)
    else:
        end_quietly()
        deadline = time.monotonic() + BAD_INPUT_LINGER_S
        while not stop_requested() and time.monotonic() < deadline:
            time.sleep(STOP_POLL_S)
    sys.exit(exit_codes.BAD_INPUT)


def check_or_exit(cfg: DictConfig) -> None:
    try:
        preflight(cfg, env_world()[2], ranks_per_node())
    except ConfigError as exc:
        fail_bad_input(exc)
