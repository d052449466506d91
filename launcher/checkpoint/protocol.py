"""Atomic checkpoints: written under a temporary name, renamed when every rank has written.

Layout under `runs/<id>/checkpoints/`: `step_<n>/` folders and a `latest` file naming the
newest complete one. A folder counts as complete only when its `meta.json` (written last,
by rank 0, after a barrier) lists files that are all present with the recorded sizes, so a
crash mid-save never leaves a "latest" that cannot be loaded.

Reading is defensive: whatever a crash or a person left in the folder (a half-written
checkpoint, a damaged `latest`, stray files and folders, leftover temporary folders) is
reported by `scan` with the reason, never raised.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import re
import secrets
import shutil
import threading
import time
import zipfile
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from launcher.paths import atomic_write
from launcher.runtime import disk

log = logging.getLogger(__name__)

LATEST = "latest"
META = "meta.json"
STEP_PREFIX = "step_"
TMP_PREFIX = ".tmp-"
SUPERSEDED = "superseded"  # complete checkpoints a rewound run reached again, moved aside
UNIVERSAL = "universal"  # DeepSpeed checkpoints converted for another world size or stage
UNSEALED = "unsealed"  # what an interrupted save left and no relaunch could verify, kept
# In a save's temporary folder: what it will be sealed with (rank 0, before any rank
# writes), and each rank's word that its files are written: with both, a save whose
# seal never ran (the job ended first) can be verified and sealed by the next launch.
INTENT = ".intent.json"
WRITTEN = ".written_rank{rank}"
_MARKERS = re.compile(r"\.intent\.json|\.written_rank\d+")
_STEP_NAME = re.compile(r"step_(\d+)")
# What the writer itself leaves for an instant: its temporary folder, the folder it is
# replacing, the pointer's temporary file.
_LEFTOVER = re.compile(r"(\.tmp-step_\d+|\.old-step_\d+|\.latest\.tmp)")


def step_name(step: int) -> str:
    return f"{STEP_PREFIX}{step:08d}"


def parse_step(name: str) -> int | None:
    """The step of a `step_<n>` name, or None for any other name."""
    match = _STEP_NAME.fullmatch(name)
    return int(match.group(1)) if match else None


def step_of(path: Path) -> int:
    step = parse_step(Path(path).name)
    if step is None:
        raise ValueError(f"{path} is not a step_<n> checkpoint folder")
    return step


def new_lineage() -> str:
    """An id for a run's line of checkpoints: new at a fresh start, kept by every resume."""
    return secrets.token_hex(6)


def read_meta(step_dir: Path) -> dict | None:
    """The checkpoint's meta.json as a dict, or None when it cannot be read as one."""
    try:
        meta = json.loads((step_dir / META).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def incomplete_reason(step_dir: Path) -> str | None:
    """Why `step_dir` is not a complete checkpoint, or None when it is one.

    Complete: a folder whose meta.json lists files (name -> size) that all exist as files
    of exactly that size.
    """
    if not step_dir.is_dir():
        return "not a folder"
    if not (step_dir / META).exists():
        return f"no {META} (the save did not finish)"
    meta = read_meta(step_dir)
    files = meta.get("files") if meta else None
    if not isinstance(files, dict) or not files:
        return f"{META} is unreadable"
    for name, size in files.items():
        path = step_dir / str(name)
        if not path.is_file():
            return f"{name} is {'not a file' if path.exists() else 'missing'}"
        actual = path.stat().st_size
        if actual != size:
            return f"{name} has {actual} bytes, {META} says {size}"
    return None


def is_complete(step_dir: Path) -> bool:
    """True when meta.json exists and every file it lists has its recorded size."""
    return incomplete_reason(step_dir) is None


def unreadable(paths: list[Path]) -> str | None:
    """The first of `paths` that is not a readable torch file (torch.save writes zip
    archives: their index is read, not the whole file), or None."""
    for path in paths:
        try:
            zipfile.ZipFile(path).close()
        except FileNotFoundError:
            return f"{path.name} is missing"
        except (OSError, zipfile.BadZipFile) as exc:
            return f"{path.name} is not a readable torch file ({exc})"
    return None


@dataclass
class Scan:
    """What a checkpoints folder holds, as the resume decision needs it."""

    folder: Path
    complete: list[Path] = field(default_factory=list)  # newest first
    incomplete: list[tuple[Path, str]] = field(default_factory=list)  # newest first
    leftovers: list[Path] = field(default_factory=list)  # interrupted saves' temporaries
    strays: list[Path] = field(default_factory=list)  # anything else
    pointer_problem: str | None = None  # what is wrong with `latest`, if anything

    @property
    def has_checkpoints(self) -> bool:
        """Whether any step_<n> entry is there, complete or not."""
        return bool(self.complete or self.incomplete)


def checkpoints_folder(path: Path) -> Path:
    """`path/checkpoints` for a run directory, else `path` itself."""
    path = Path(path)
    return path / "checkpoints" if (path / "checkpoints").is_dir() else path


def scan(folder: Path) -> Scan:
    """Sort the entries of a checkpoints folder; never raises for what it finds there.

    Complete checkpoints are ordered by step, newest first: the step number, not the
    `latest` pointer, decides, so a crash between a folder's rename and the pointer's
    update loses nothing, and a damaged pointer costs nothing. The pointer is checked and
    a problem with it reported (it is rewritten at the next save).
    """
    result = Scan(folder)
    try:
        entries = sorted(folder.iterdir()) if folder.is_dir() else []
    except OSError:
        entries = []
    steps = []
    for entry in entries:
        step = parse_step(entry.name)
        if step is not None:
            steps.append((step, entry))
        elif _LEFTOVER.fullmatch(entry.name):
            result.leftovers.append(entry)
        elif entry.name not in (LATEST, SUPERSEDED, UNIVERSAL, UNSEALED):
            result.strays.append(entry)
    for _, entry in sorted(steps, key=lambda s: s[0], reverse=True):
        reason = incomplete_reason(entry)
        if reason is None:
            result.complete.append(entry)
        else:
            result.incomplete.append((entry, reason))
    result.pointer_problem = _pointer_problem(folder, result)
    return result


def _pointer_problem(folder: Path, found: Scan) -> str | None:
    pointer = folder / LATEST
    if not pointer.exists() and not pointer.is_symlink():
        return f"{LATEST} is missing" if found.complete else None
    if not pointer.is_file():
        return None  # a wrong type is refused by the run-directory check, not skipped
    try:
        name = pointer.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return f"{LATEST} is unreadable"
    if parse_step(name) is None:
        return f"{LATEST} holds {name[:40]!r}, not a step_<n> name"
    if not (folder / name).exists():
        return f"{LATEST} names {name}, which does not exist"
    return None


def candidates(path: Path) -> list[Path]:
    """Complete checkpoints reachable from `path`, newest first.

    `path` may be a run directory, its `checkpoints/` folder, or a single `step_<n>` folder.
    """
    path = Path(path)
    if parse_step(path.name) is not None:
        return [path] if is_complete(path) else []
    return scan(checkpoints_folder(path)).complete


def find_resumable(path: Path) -> Path | None:
    """The checkpoint `resume=<path>` would start from, or None."""
    found = candidates(path)
    return found[0] if found else None


def remove_leftovers(found: Scan) -> None:
    """Delete what interrupted saves left behind, one log line each (the memory tier's
    own folders: node-local copies whose durable checkpoints are elsewhere).

    Only safe while this launch holds the run directory's lock: another launch's save in
    progress looks the same.
    """
    for path in found.leftovers:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        log.info("removed %s, left by an interrupted checkpoint save", path)


def recover_leftovers(found: Scan) -> bool:
    """What interrupted saves left in a run's checkpoints folder: a temporary folder whose
    every rank had written its files (an asynchronous save whose job ended before its seal,
    a crash between the writes and the seal) is verified and sealed as the checkpoint it
    was to be; any other folder is moved to `unsealed/`, never deleted; a temporary
    pointer is deleted. One log line each; True when a checkpoint was sealed.

    Only while this launch holds the run directory's lock: another launch's save in
    progress looks the same.
    """
    sealed = False
    for path in found.leftovers:
        if not path.is_dir() or path.is_symlink():
            path.unlink(missing_ok=True)
            log.info("removed %s, left by an interrupted checkpoint save", path)
            continue
        why = unsealed_problem(path)
        if why is None:
            try:
                final = seal_folder(path, found.folder)
            except OSError as exc:
                why = f"it could not be sealed ({type(exc).__name__}: {exc})"
            else:
                sealed = True
                log.warning(
                    "sealed %s as %s: every rank had written its files, the job ended before "
                    "its seal", path, final.name,
                )  # fmt: skip
                continue
        aside = _free_name(found.folder / UNSEALED / f"{path.name.lstrip('.')}-{_now()}")
        aside.parent.mkdir(exist_ok=True)
        path.rename(aside)
        log.warning("moved %s to %s: %s; it is not used (remove it by hand)", path, aside, why)
    return sealed


def unsealed_problem(tmp: Path) -> str | None:
    """Why a save's temporary folder cannot be sealed as it is, or None: its intent says
    what it holds, every rank of that save said its files are written, and the format's
    own completeness check (DCP's `.metadata` against its shards) passes."""
    if parse_step(tmp.name.removeprefix(TMP_PREFIX)) is None:
        return "it is what a replaced checkpoint left"
    try:
        intent = json.loads((tmp / INTENT).read_text())
        ranks = int(intent["world_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return f"it has no readable {INTENT} (a save from before they were written)"
    missing = [r for r in range(ranks) if not (tmp / WRITTEN.format(rank=r)).exists()]
    if missing:
        return f"rank(s) {missing} had not finished writing their files"
    from launcher.config.registry import format_of  # the engines' formats, when needed

    fmt = format_of(tmp)
    check = getattr(fmt.module(), "incomplete", None) if fmt else None
    return check(tmp) if check else None


def seal_folder(tmp: Path, folder: Path) -> Path:
    """Seal a verified temporary folder with the meta.json its intent names, as the save
    would have: renamed to its step's name (a complete checkpoint already there is kept,
    under superseded/), `latest` moved when it is the newest."""
    intent = json.loads((tmp / INTENT).read_text())
    step = parse_step(tmp.name.removeprefix(TMP_PREFIX))
    final = folder / step_name(step)
    _seal_files(tmp, final, step, {k: v for k, v in intent.items() if k != "step"})
    newest = max((step_of(p) for p in scan(folder).complete), default=step)
    if newest == step:
        atomic_write(folder / LATEST, final.name + "\n")
    return final


def _seal_files(tmp: Path, final: Path, step: int, meta: dict) -> None:
    """The seal itself: the markers dropped, the files flushed, meta.json (every file
    with its size) written last, the folder renamed into place."""
    for marker in tmp.iterdir():
        if _MARKERS.fullmatch(marker.name):
            marker.unlink()
    files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir())
             if p.is_file() and p.name != META}  # fmt: skip
    for p in tmp.iterdir():
        _fsync(p)
    atomic_write(tmp / META, json.dumps({"step": step, "files": files, **meta}, indent=1))
    if final.exists() or final.is_symlink():
        _move_aside(final)
    tmp.rename(final)
    _fsync(final.parent)


def _now() -> str:
    return f"{dt.datetime.now():%Y%m%d-%H%M%S}"


def _move_aside(final: Path) -> None:
    """Something already has this step's name: a complete checkpoint (the run was rewound
    past it, or could not read it) is kept under superseded/; anything else (an
    incomplete folder, a stray file) under unsealed/. Nothing is deleted."""
    kept = SUPERSEDED if final.is_dir() and is_complete(final) else UNSEALED
    aside = _free_name(final.parent / kept / f"{final.name}-{_now()}")
    aside.parent.mkdir(exist_ok=True)
    final.rename(aside)
    log.warning("moved the earlier %s to %s before replacing it", final.name, aside)


def _free_name(path: Path) -> Path:
    """`path`, or `path-2`, `path-3`...: the same step moved twice within a second keeps
    both."""
    candidate, n = path, 1
    while candidate.exists() or candidate.is_symlink():
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


class CheckpointNotWritten(Exception):
    """Some rank could not write its part of a checkpoint, or rank 0 could not seal it:
    every rank raises this together (no rank is left waiting in a barrier), the
    temporary folder is removed, and the complete checkpoints are untouched."""

    def __init__(self, message: str, step: int, disk_full: bool):
        super().__init__(message)
        self.step, self.disk_full = step, disk_full


def write_problem(exc: Exception, where: Path) -> tuple[str, bool]:
    """(one line, whether the disk is full) for a failed checkpoint write."""
    text = " ".join(str(exc).split())[:200] or type(exc).__name__
    return f"{type(exc).__name__}: {text}", disk.is_full(exc, where)


class CheckpointWriter:
    """Saves one checkpoint with the same protocol on every rank.

    All ranks call `save` at the same step. Rank 0 prepares `.tmp-step_<n>`; each rank's
    `write(folder)` puts its files there; after a barrier rank 0 seals it with meta.json,
    renames it into place, moves the `latest` pointer and prunes old ones; a final barrier
    keeps any rank from racing ahead (or exiting) before the checkpoint is complete.

    `meta` goes into every meta.json: what the resume check compares (model shape,
    strategy, world size) and the run's `lineage`, new at a fresh start and taken over from
    the checkpoint a run resumes (`adopt`). Pruning deletes only complete checkpoints of
    this lineage that are older than the one just written, beyond the newest `keep`. A
    complete checkpoint already at the step being written (a run rewound past it, or one
    that some rank could not read) is moved to `superseded/`, not replaced.
    """

    def __init__(
        self,
        folder: Path,
        *,
        is_main: bool,
        barrier: Callable[[], None],
        keep: int,
        meta: dict | None = None,
        gather: Callable[[object], list] | None = None,
        rank: int | None = None,
        world_size: int = 1,
    ):
        self.folder = folder
        self.is_main = is_main
        self.barrier = barrier
        # Every rank's object, in rank order (Runtime.all_gather_objects); without one, a
        # barrier that carries only this rank's own (one process, or a test's threads).
        self.gather = gather or (lambda obj: (barrier(), [obj])[1])
        self.keep = keep
        self.meta = dict(meta or {})
        self.fresh_lineage = self.meta.setdefault("lineage", new_lineage())
        self.prunable = {self.fresh_lineage}
        self._pending: tuple | None = None
        # A run's durable checkpoints (`rank` given) leave an intent and each rank's
        # written-marker in the temporary folder, so that an asynchronous save is sealed
        # by rank 0's _Sealer as soon as every rank's files are written, and a save whose
        # seal never ran can be verified and sealed by the next launch (recover_leftovers).
        self.rank, self.world_size = rank, world_size

    def adopt(self, folder: Path) -> None:
        """Continue the lineage of the checkpoint this run resumed from."""
        lineage = (read_meta(folder) or {}).get("lineage")
        self.meta["lineage"] = lineage or self.fresh_lineage
        # A checkpoint written before lineages were recorded: such ones are this run's too.
        self.prunable = {lineage} if lineage else {self.fresh_lineage, None}

    def save(self, step: int, write: Callable[[Path], object], extra_meta: dict) -> Path:
        """Write one checkpoint. When `write` returns a future (an asynchronous save whose
        files are still being written), the checkpoint is sealed, and so counts, only in
        `complete()`: at the next save, or when the run stops or ends."""
        self.complete()
        started = time.monotonic()
        final = self.folder / step_name(step)
        tmp = self.folder / f"{TMP_PREFIX}{step_name(step)}"
        problem = None
        if self.is_main:
            try:
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
            except OSError as exc:  # a folder that cannot be made: /proc, a file, read-only
                problem = write_problem(exc, tmp)  # told with the writes' problems below
        self.barrier()
        meta = {**self.meta, **extra_meta}
        pending = None
        if problem is None:  # else no folder: the other ranks' writes fail too, all agree
            try:
                pending = self._write(tmp, step, meta, write)
            except Exception as exc:  # noqa: BLE001 - every rank learns of it, below
                problem = write_problem(exc, tmp)
        self.agree(problem, step)  # every rank wrote (or started writing) its files
        sealer = None
        if pending is not None and self.is_main and self.rank is not None:
            sealer = _Sealer(self, tmp, final, step, meta)
            sealer.start()
        self._pending = (tmp, final, step, meta, pending, started, sealer)
        if pending is None:
            self.complete()
        return final

    def _write(self, tmp: Path, step: int, meta: dict, write) -> Future | None:
        """This rank's files (rank 0's intent first); the future of an asynchronous write."""
        if self.is_main and self.rank is not None:
            intent = {**meta, "step": step, "world_size": self.world_size}
            atomic_write(tmp / INTENT, json.dumps(intent, indent=1))
        pending = write(tmp)
        if not isinstance(pending, Future):
            self._mark_written(tmp)
            return None
        pending.add_done_callback(lambda done: done.exception() or self._mark_written(tmp))
        return pending

    def _mark_written(self, tmp: Path) -> None:
        """This rank's word that its files of the save in `tmp` are written."""
        if self.rank is not None:
            with contextlib.suppress(OSError):  # no marker: the save is not sealed early
                (tmp / WRITTEN.format(rank=self.rank)).touch()

    def complete(self) -> None:
        """Wait for this rank's files of the save in progress, then seal it once every rank
        has written (nothing to do when no save is in progress)."""
        if self._pending is None:
            return
        tmp, final, step, meta, pending, started, sealer = self._pending
        self._pending = None
        if pending is not None:
            problem = None
            try:
                pending.result()
            except Exception as exc:  # noqa: BLE001 - every rank learns of it, below
                problem = write_problem(exc, tmp)
            self.agree(problem, step)  # every rank's files are written
        else:
            # How long a synchronous save took, the slowest rank's files included (the
            # agreement in `save` waits for it): what a stop must be given time for
            # (launcher.submit).
            meta["write_s"] = round(time.monotonic() - started, 3)
        problem = None
        if self.is_main and not (sealer is not None and sealer.finish()):
            try:
                self._seal(tmp, final, step, meta)
            except Exception as exc:  # noqa: BLE001 - every rank learns of it, below
                problem = write_problem(exc, tmp)
        self.agree(problem, step)  # the checkpoint is complete, or none is

    def agree(self, problem: tuple[str, bool] | None, step: int) -> None:
        """Compare notes (a barrier that carries each rank's problem with the save of
        `step`): when any rank had one, rank 0 measures the space, removes the temporary
        folder, and every rank raises CheckpointNotWritten with the same line."""
        everyone = self.gather(problem)
        problems = [(r, p) for r, p in enumerate(everyone) if p]
        if not problems:
            return
        tmp = self.folder / f"{TMP_PREFIX}{step_name(step)}"
        full = any(p[1] for _, p in problems)
        line = ""
        if self.is_main:
            # the newest complete one other than this step's (a folder written alone is
            # sealed before the ranks agree, and goes with the failed save)
            older = (p for p in scan(self.folder).complete if step_of(p) != step)
            newest = next(older, None)
            kept = f"; the last complete checkpoint, {newest.name}, is kept" if newest else ""
            if full:
                needed = disk.size_of(newest) if newest else disk.size_of(tmp)
                line = disk.no_space_line(f"checkpoint {step_name(step)}", self.folder, needed)
            else:
                why = "; ".join(f"rank {r}: {p[0]}" for r, p in problems)
                line = f"checkpoint {step_name(step)} could not be written ({why})"
            line += kept
            shutil.rmtree(tmp, ignore_errors=True)
        (line,) = self.gather(line)[:1]
        raise CheckpointNotWritten(line, step, full)

    def write_alone(self, step: int, write: Callable[[Path], object], extra_meta: dict) -> Path:
        """Write and seal a checkpoint of a folder no other rank writes (the memory tier's,
        from its writing thread) without a word to any rank and pruning nothing: the caller
        agrees (`agree`), then prunes (`prune`), so that a step some rank failed to write
        never costs any rank the step before it. Raises what the write raised."""
        final = self.folder / step_name(step)
        tmp = self.folder / f"{TMP_PREFIX}{step_name(step)}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        write(tmp)
        _seal_files(tmp, final, step, {**self.meta, **extra_meta})
        atomic_write(self.folder / LATEST, final.name + "\n")
        return final

    def _seal(self, tmp: Path, final: Path, step: int, extra_meta: dict) -> None:
        _seal_files(tmp, final, step, extra_meta)
        atomic_write(self.folder / LATEST, final.name + "\n")
        self.prune(step)
        log.info("checkpoint saved: %s", final)

    def prune(self, newest: int) -> None:
        """Remove this run's complete checkpoints older than the `keep` newest up to
        `newest` (never one past it, nor another run's)."""
        kept = 0
        for path in scan(self.folder).complete:  # newest first
            step = step_of(path)
            if step > newest:
                continue  # never prune ahead of the run: not older than a newer complete one
            meta = read_meta(path) or {}
            if meta.get("lineage") not in self.prunable:
                continue  # another run's checkpoint: not ours to delete
            kept += 1
            if kept > self.keep:
                shutil.rmtree(path, ignore_errors=True)
                shutil.rmtree(self.folder / UNIVERSAL / path.name, ignore_errors=True)


class _Sealer(threading.Thread):
    """Rank 0's seal of an asynchronous save as soon as every rank's files are written
    (each rank's marker in the folder), not at the run's next save, stop or end: a job
    that ends in between (a hang, a crash) keeps the checkpoint. `finish` stops it and
    says whether it sealed; the writer's `complete` seals otherwise, as before."""

    POLL_S = 0.1

    def __init__(self, writer: CheckpointWriter, tmp: Path, final: Path, step: int, meta: dict):
        super().__init__(name=f"seal-{final.name}", daemon=True)
        self.writer, self.tmp, self.final, self.step, self.meta = writer, tmp, final, step, meta
        self.markers = {WRITTEN.format(rank=r) for r in range(writer.world_size)}
        self.stopped = threading.Event()
        self.sealed = False

    def run(self) -> None:
        while not self.stopped.wait(self.POLL_S):
            try:
                if not self.markers <= set(os.listdir(self.tmp)):
                    continue
                self.writer._seal(self.tmp, self.final, self.step, self.meta)
                self.sealed = True
            except Exception as exc:  # noqa: BLE001 - the writer's complete() seals, or says why
                log.info("the early seal of %s did not happen (%s)", self.final.name, exc)
            return

    def finish(self) -> bool:
        self.stopped.set()
        self.join()
        return self.sealed


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
