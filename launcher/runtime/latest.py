"""`<run.root>/latest`: a symbolic link to the newest run directory, so that the run just
started is `runs/latest` in every next command (analyze, export, generate, runs)."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

log = logging.getLogger("launcher")

LATEST = "latest"


def point_latest(root: Path, run_id: str) -> None:
    """Make `root/latest` point at `root/run_id` (relative, so the tree can move), replacing
    the link in one rename; a `latest` that is not a link (a run named so) is left alone."""
    link = root / LATEST
    if link.exists() and not link.is_symlink():
        return
    tmp = root / f".{LATEST}.{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    try:
        tmp.symlink_to(run_id, target_is_directory=True)
        os.replace(tmp, link)
    except OSError as exc:  # a file system without links: the run goes on without one
        with contextlib.suppress(OSError):
            tmp.unlink()
        log.info("could not point %s at %s: %s", link, run_id, exc)
