"""What a rank keeps of its collectives for later: NCCL's INFO log, staged before the process
group and moved into the run directory after it (`stage_debug_file`, `adopt_debug_file`,
`read_own_log`; the whole way is told in launcher.observe.nccl_log, which parses the log),
and the flight recorder's buffer of recent collectives (`enable_flight_recorder`; the hang
watchdog dumps it)."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("launcher")

STAGING_DIR = ".nccl-logs"
LOGGING_LEVELS = ("INFO", "TRACE")  # the levels that print channel connections
FR_BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"  # the flight recorder's size (recent collectives)
FR_LEGACY_ENV = "TORCH_NCCL_TRACE_BUFFER_SIZE"  # the NCCL-only name older torch reads


@dataclass
class Capture:
    """Where this process's NCCL writes its INFO log, and from where the lines are this
    job's."""

    path: Path  # where this process's NCCL writes its log
    offset: int  # bytes already there when this job's process group was created


def _short_host() -> str:
    """The host name as NCCL writes it in %h: up to the first dot, '%' and '/' as '-'."""
    return socket.gethostname().split(".")[0].replace("%", "-").replace("/", "-")


def expand_debug_file(pattern: str) -> Path:
    """NCCL_DEBUG_FILE with NCCL's %h (host), %p (pid) and %% expanded, as NCCL opens it."""
    expanded = re.sub(
        r"%([hp%])",
        lambda m: {"h": _short_host(), "p": str(os.getpid()), "%": "%"}[m[1]],
        pattern,
    )
    return Path(expanded)


def _literal(path: Path) -> str:
    """`path` as an NCCL_DEBUG_FILE value that NCCL expands to exactly this path."""
    return str(path).replace("%", "%%")


def logs_to_file(backend: str | None) -> bool:
    """Whether this process's NCCL will write an INFO log the launcher can read."""
    level = os.environ.get("NCCL_DEBUG", "").strip().upper()
    return backend == "nccl" and level in LOGGING_LEVELS


def stage_debug_file(
    run_root: str, backend: str | None, rank: int, earlier: Capture | None = None
) -> Capture | None:
    """Before the process group exists: give NCCL's INFO log a file of this process's own;
    None when NCCL will not log to a file the launcher reads.

    A user's NCCL_DEBUG_FILE is kept. The process group, and so this, comes once per
    process (a sweep's points share it); should a process create another one (`earlier`
    is the first one's capture), NCCL keeps appending to the file it opened first, and only
    the lines after its present size are the new group's.
    """
    if not logs_to_file(backend):
        return None
    if not os.environ.get("NCCL_DEBUG_FILE"):
        staging = Path(run_root).expanduser().resolve() / STAGING_DIR
        staging.mkdir(parents=True, exist_ok=True)
        name = f"nccl.rank{rank}.{_short_host()}.{os.getpid()}.log"
        os.environ["NCCL_DEBUG_FILE"] = _literal(staging / name)
    path = expand_debug_file(os.environ["NCCL_DEBUG_FILE"]).absolute()
    # NCCL opens (and truncates) its file once per process: only a file an earlier job of
    # this process already logged to holds lines that are not this job's.
    still_open = earlier is not None and earlier.path == path and path.exists()
    return Capture(path, path.stat().st_size if still_open else 0)


def adopt_debug_file(capture: Capture | None, run_dir: Path) -> Path | None:
    """Once the run directory exists: move a staged NCCL log into `<run_dir>/logs/`
    (`capture` follows it).

    NCCL keeps writing to the renamed file. If NCCL has not opened it yet, pointing the
    variable at the final place is enough (NCCL reads it when it first logs).
    """
    if capture is None:
        return None
    staged = capture.path
    if staged.parent.name == STAGING_DIR:
        final = (run_dir / "logs" / staged.name).absolute()
        try:
            if staged.exists():
                staged.replace(final)
        except OSError as exc:  # e.g. a run directory on another file system
            log.warning("NCCL's log stays at %s: moving it to %s failed: %s", staged, final, exc)
            return staged
        os.environ["NCCL_DEBUG_FILE"] = _literal(final)
        capture.path = final
        with contextlib.suppress(OSError):  # the last rank to move its log removes the folder
            staged.parent.rmdir()
    log.info("NCCL's INFO log goes to %s (one file per rank)", capture.path)
    return capture.path


def read_own_log(capture: Capture | None) -> str | None:
    """What this process's NCCL has logged since this job's process group was created."""
    if capture is None or not capture.path.exists():
        return None
    with open(capture.path, "rb") as f:
        f.seek(capture.offset)
        return f.read().decode("utf-8", errors="replace")


def enable_flight_recorder(entries: int) -> None:
    """Ask the process group (created after this) to keep its last `entries` collectives.

    Only when the user set neither variable: theirs wins. Must run before the group exists.
    """
    if entries > 0 and FR_BUFFER_ENV not in os.environ and FR_LEGACY_ENV not in os.environ:
        os.environ[FR_BUFFER_ENV] = str(entries)
