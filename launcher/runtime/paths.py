"""Files and folders a run writes: whether a folder can be written, asked before anything
is written, and writing a file whole.

Permission bits do not tell (root passes `os.access` on /proc and on read-only mounts), so
the test is to create and remove a temporary file in the folder, or, when the folder does
not exist yet, in the nearest folder above it that does (where it would be made).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def writable_dir_problem(folder: str | Path, label: str, fix: str) -> str | None:
    """The error line (`<label>: ...; <fix>`) when `folder` cannot be written or made."""
    path = Path(folder).expanduser()
    existing = nearest_existing(path)
    if existing.is_dir() and can_create_in(existing):
        return None
    where = f"{path} is" if existing == path else f"it would be made in {existing}, which is"
    return f"{label}: {where} not a writable directory; {fix}"


def creatable_dir_problem(folder: str | Path, label: str, fix: str) -> str | None:
    """Like `writable_dir_problem`, but an existing folder is accepted as it is: a shared
    cache may be read-only once built."""
    return None if Path(folder).expanduser().is_dir() else writable_dir_problem(folder, label, fix)


def nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def can_create_in(folder: Path) -> bool:
    """Try it: permission bits do not tell (root passes os.access on /proc, read-only mounts)."""
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".launcher-write-test-")
    except OSError:
        return False
    os.close(fd)
    os.unlink(name)
    return True


def atomic_write(path: Path, text: str) -> None:
    """Write `path` whole or not at all: a temporary file beside it, flushed to disk, then
    renamed over it, so a reader or a crash never meets half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk leaves neither half a file nor a stray
        raise
