"""Atomic checkpoints: written under a temporary name, renamed when every rank has written.

Layout under `runs/<id>/checkpoints/`: `step_<n>/` folders and a `latest` file naming the
newest complete one. A folder counts as complete only when its `meta.json` (written last,
by rank 0, after a barrier) lists files that are all present with the recorded sizes, so a
crash mid-save never leaves a "latest" that cannot be loaded.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

LATEST = "latest"
META = "meta.json"
STEP_PREFIX = "step_"


def step_name(step: int) -> str:
    return f"{STEP_PREFIX}{step:08d}"


def step_of(path: Path) -> int:
    return int(path.name[len(STEP_PREFIX) :])


def is_complete(step_dir: Path) -> bool:
    """True when meta.json exists and every file it lists has its recorded size."""
    try:
        meta = json.loads((step_dir / META).read_text())
        return all((step_dir / n).stat().st_size == size for n, size in meta["files"].items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def candidates(path: Path) -> list[Path]:
    """Complete checkpoints reachable from `path`, the one to try first first.

    `path` may be a run directory, its `checkpoints/` folder, or a single `step_<n>` folder.
    The `latest` pointer is honoured first; the others follow newest first, so that an
    unreadable latest falls back to the previous complete one.
    """
    path = Path(path)
    if path.name.startswith(STEP_PREFIX):
        return [path] if is_complete(path) else []
    folder = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    if not folder.is_dir():
        return []
    steps = sorted(
        (p for p in folder.glob(f"{STEP_PREFIX}*") if p.is_dir() and is_complete(p)),
        key=step_of,
        reverse=True,
    )
    pointer = folder / LATEST
    if pointer.is_file():
        named = folder / pointer.read_text().strip()
        if named in steps:
            steps.remove(named)
            steps.insert(0, named)
    return steps


def find_resumable(path: Path) -> Path | None:
    """The checkpoint `resume=<path>` would start from, or None."""
    found = candidates(path)
    return found[0] if found else None


class CheckpointWriter:
    """Saves one checkpoint with the same protocol on every rank.

    All ranks call `save` at the same step. Rank 0 prepares `.tmp-step_<n>`; each rank's
    `write(folder)` puts its files there; after a barrier rank 0 seals it with meta.json,
    renames it into place, moves the `latest` pointer and prunes old ones; a final barrier
    keeps any rank from racing ahead (or exiting) before the checkpoint is complete.
    """

    def __init__(self, folder: Path, *, is_main: bool, barrier: Callable[[], None], keep: int):
        self.folder = folder
        self.is_main = is_main
        self.barrier = barrier
        self.keep = keep

    def save(self, step: int, write: Callable[[Path], None], extra_meta: dict) -> Path:
        final = self.folder / step_name(step)
        tmp = self.folder / f".tmp-{step_name(step)}"
        if self.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self.barrier()
        write(tmp)
        self.barrier()
        if self.is_main:
            self._seal(tmp, final, step, extra_meta)
        self.barrier()
        return final

    def _seal(self, tmp: Path, final: Path, step: int, extra_meta: dict) -> None:
        files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
        for p in tmp.iterdir():
            _fsync(p)
        _atomic_write(
            tmp / META, json.dumps({"step": step, "files": files, **extra_meta}, indent=1)
        )
        if final.exists():  # left by an earlier attempt at the same step; replace it whole
            stale = final.with_name(f".old-{final.name}")
            shutil.rmtree(stale, ignore_errors=True)
            final.rename(stale)
            shutil.rmtree(stale, ignore_errors=True)
        tmp.rename(final)
        _fsync(self.folder)
        _atomic_write(self.folder / LATEST, final.name + "\n")
        self._prune(keep_name=final.name)
        log.info("checkpoint saved: %s", final)

    def _prune(self, keep_name: str) -> None:
        steps = sorted(
            (p for p in self.folder.glob(f"{STEP_PREFIX}*") if p.is_dir()),
            key=step_of,
            reverse=True,
        )
        kept = 0
        for p in steps:
            if p.name == keep_name or (kept < self.keep and is_complete(p)):
                kept += 1
                continue
            shutil.rmtree(p, ignore_errors=True)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
