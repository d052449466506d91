"""`python -m launcher.rehearse [overrides]` (or `torchrun ... -m launcher.rehearse`):
rehearse the experiment the overrides describe through every fault path, shrunk to
minutes (docs/rehearse.md). Exit 0 only when every row of the verdict table passed; 2 on
bad input (one line, nothing started)."""

from __future__ import annotations

import signal
import sys

from launcher.config import ConfigError, friendly_overrides
from launcher.rehearse.runner import rehearse
from launcher.resilience import exit_codes

USAGE = """usage: python -m launcher.rehearse [overrides...]
       torchrun --standalone --nproc_per_node=N -m launcher.rehearse [overrides...]

Rehearse the training experiment the overrides describe (the same overrides launcher.train
and launcher.submit take) through its fault paths: stop, killed rank, hung rank, world-size
change, slow rank, bad input and, with cluster=slurm|k8s, the rendered job's checks. Keeps
the strategy, loader, precision, checkpoint, logger and cluster settings; shrinks the model,
steps and data. Writes <run dir>/rehearse/report.{md,json}; exit 0 only if every row passes.
Settings: rehearse.only=[...], rehearse.skip=[...], rehearse.nproc, rehearse.timeout_s
(docs/rehearse.md)."""


def _interrupted(signum, frame) -> None:
    """A stop signal (Ctrl-C, the scheduler's, torchrun's) ends the rehearsal: the case
    running is killed with its launch, not left behind in its own session. The first one
    only: a second Ctrl-C while the launches are being stopped changes nothing (no
    KeyboardInterrupt traceback from the clean-up)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt


def main() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupted)
    args = sys.argv[1:]
    if any(a in ("-h", "--help") for a in args):
        print(USAGE)
        sys.exit(exit_codes.DONE)
    try:
        code = rehearse(friendly_overrides(args))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = exit_codes.BAD_INPUT
    except KeyboardInterrupt:
        code = exit_codes.STOPPED
    exit_codes.report(code)
    sys.exit(code)


if __name__ == "__main__":
    main()
