"""Running out of disk space: tell a full file system from other write failures, and say
in one line where and how much.

A full disk is not a crash: the user frees space (or moves run.root) and relaunches, and
the run resumes from its last complete checkpoint. It shows in more than one way:
OSError with ENOSPC or EDQUOT from Python's own writes, but torch.save's zip writer
reports only a short write ("unexpected pos 6784 vs 6676", "file write failed"), so a
write error while the file system has next to nothing free counts too.

The size and free space of the shared-memory file system (`shm_available_bytes`: the data
loader's sizing, env.json) are read the same way.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from launcher.paths import nearest_existing

NO_SPACE = {errno.ENOSPC, errno.EDQUOT}
# Errors that name another cause than space: a read-only mount, permissions, a path that
# cannot exist (/proc, a file where a folder belongs)
NOT_SPACE = {errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT, errno.ENOTDIR, errno.EISDIR,
             errno.EEXIST}  # fmt: skip
NEARLY_FULL = 16 * 2**20  # bytes free below which a failed write is blamed on the space


def free_bytes(path: Path) -> int | None:
    try:
        return shutil.disk_usage(nearest_existing(Path(path))).free
    except OSError:
        return None


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def is_full(exc: BaseException, path: Path) -> bool:
    """Whether `exc`, raised while writing under `path`, means the disk is full."""
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno in NO_SPACE:
            return True
        if "No space left on device" in str(e) or "Disk quota exceeded" in str(e):
            return True
    if any(isinstance(e, OSError) and e.errno in NOT_SPACE for e in _chain(exc)):
        return False  # a small read-only mount is "read-only", however little is free on it
    free = free_bytes(path)
    return isinstance(exc, (OSError, RuntimeError)) and free is not None and free < NEARLY_FULL


def size_of(path: Path) -> int:
    """Bytes in the files under `path` (a file or a folder); 0 when there is nothing."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def mb(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n / 2**20:.1f} MB" if n >= 2**20 or n == 0 else f"{n / 2**10:.0f} kB"


def no_space_line(what: str, path: Path, needed: int | None) -> str:
    """'no space left on device writing <what> (<path>): it needs about X, Y free there'."""
    need = f"it needs about {mb(needed)}, " if needed else ""
    return (
        f"no space left on device writing {what} ({path}): {need}{mb(free_bytes(path))} free "
        f"there; free some space or point run.root at another file system, then relaunch"
    )


def shm_available_bytes(path: str = "/dev/shm") -> tuple[int, int] | None:
    """(size, free) of the filesystem at `path` in bytes, or None where it does not exist."""
    if not os.path.exists(path):
        return None
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
