"""Files and folders a run writes: whether a folder can be written, asked before anything
is written, a run directory made as private as `run.access` says, and writing a file whole.

Permission bits do not tell (root passes `os.access` on /proc and on read-only mounts), so
the test is to create and remove a temporary file in the folder, or, when the folder does
not exist yet, in the nearest folder above it that does (where it would be made).
"""

from __future__ import annotations

import datetime as dt
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


# run.access: who may read a run directory besides its owner. The directory's mode is the
# gate: the files inside keep the modes the umask gives them, and nobody the mode leaves
# out can reach them (a run holds its config, logs and weights; Slurm's output file too).
ACCESS_MODES = {"private": 0o700, "group": 0o750, "world": 0o755}


def make_run_dir(run_dir: Path, root: Path, access: str) -> None:
    """Make `run_dir` (and a sweep's folder above it) under `root` with `access`'s mode;
    an existing one is given that mode (the config says who may read the run). The run
    root itself is left as it is: it may be shared."""
    mode = ACCESS_MODES[access]
    run_dir, root = Path(run_dir), Path(root)
    run_dir.mkdir(parents=True, exist_ok=True)
    below = [run_dir, *run_dir.parents]
    for folder in below[: below.index(root)] if root in below else [run_dir]:
        try:
            if folder.stat().st_mode & 0o777 != mode:
                folder.chmod(mode)
        except PermissionError:
            pass  # another user's folder (a shared sweep): its owner decides


def same_access(files_in: Path, like: Path) -> None:
    """Give the folder `files_in` and every file in it the access of the folder `like` (an
    export is as readable as the run directory it came from): the folder `like`'s mode,
    its files that mode without the execute bits."""
    mode = like.stat().st_mode & 0o777
    for path in Path(files_in).iterdir():
        if path.is_file() and not path.is_symlink():
            path.chmod(mode & 0o666)
    Path(files_in).chmod(mode)


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


def keep_aside(run_dir: Path, path: Path) -> Path:
    """Move `path` (the evidence of a refusal or a failure: a refused burn-in's figures, a
    failed rehearsal) to `run_dir/archive/<time>/`, so that what replaces it overwrites
    nothing; returns where it went. Two in the same second keep both."""
    folder = Path(run_dir) / "archive" / f"{dt.datetime.now():%Y%m%d-%H%M%S}"
    target, n = folder / path.name, 1
    while target.exists() or target.is_symlink():
        n += 1
        target = folder / f"{path.name}.{n}"
    folder.mkdir(parents=True, exist_ok=True)
    path.rename(target)
    return target


def is_mount_point(path: Path) -> bool:
    """Whether `path` is a mount point: another file system's root (os.path.ismount), or a
    bind mount of the same one, which only the kernel's mount table shows."""
    if os.path.ismount(path):
        return True
    try:
        table = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return False
    # the table escapes a space, tab, newline and backslash in a path as octal (\040, ...)
    points = {line.split()[1].encode().decode("unicode_escape") for line in table if line}
    return str(Path(path).resolve()) in points
