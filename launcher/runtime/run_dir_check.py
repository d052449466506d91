"""Every path of a run directory, checked before a launch or a tool writes anything there.

docs/run-directory.md lists what a run directory holds; `ENTRIES` is that list, each entry
a file or a folder (per-rank entries expanded for the job's ranks). An entry that exists
in another form than the one the launcher writes (a file where it keeps a folder, a
folder where it writes a file, a symlink to nothing, something it cannot read, a folder
it cannot write on a read-only mount) would fail only once the launch is running, with a
traceback, after it had already rewritten the finished run's summary.json. `problem`
names the first such entry and the fix, in one line, so the launch can stop (exit 2)
before anything is written; an entry that does not exist yet is fine when its folder can
be written (where it will be made).
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from launcher.paths import can_create_in, nearest_existing
from launcher.runtime.disk import NO_SPACE

FOLDER, FILE = "folder", "file"

# (path inside the run directory, form); "{r}" stands for every rank. Parents come before
# their contents: the first problem found is the one that explains the others.
ENTRIES: tuple[tuple[str, str], ...] = (
    ("", FOLDER),
    ("config.yaml", FILE),
    ("env.json", FILE),
    ("burnin.json", FILE),
    ("bad_hosts", FILE),
    ("metrics.jsonl", FILE),
    ("summary.json", FILE),
    ("ranks.jsonl", FILE),
    ("report.png", FILE),
    ("tokenizer", FOLDER),
    ("ds_config.json", FILE),
    ("comm_collectives.json", FILE),
    (".lock", FILE),
    ("logs", FOLDER),
    ("logs/rank{r}.log", FILE),
    ("logs/stacks.rank{r}.txt", FILE),
    ("logs/hang.rank{r}.json", FILE),
    ("logs/hang.declared", FILE),
    ("logs/fault.rank{r}", FILE),
    ("logs/failure.rank{r}.json", FILE),
    ("logs/peer_lost.rank{r}.json", FILE),
    ("logs/fr", FOLDER),
    ("logs/fr/rank_{r}", FILE),
    ("logs/node_codes", FOLDER),
    ("logs/nodes", FOLDER),
    ("checkpoints", FOLDER),
    ("checkpoints/latest", FILE),
    ("checkpoints/superseded", FOLDER),
    ("checkpoints/universal", FOLDER),
    ("checkpoints/unsealed", FOLDER),
    ("archive", FOLDER),
    ("traces", FOLDER),
    ("traces/rank{r}", FOLDER),
    ("analysis", FOLDER),
    ("submit", FOLDER),
    ("wandb", FOLDER),
    ("tb", FOLDER),
    # the tools' own (launcher.runtime.lock.tool_lock): launcher.rehearse, tune, analyze,
    # submit, plan
    ("rehearse", FOLDER),
    ("tune", FOLDER),
    ("plan", FOLDER),
    (".plan.lock", FILE),
    (".rehearse.lock", FILE),
    (".tune.lock", FILE),
    (".analyze.lock", FILE),
    (".submit.lock", FILE),
)

_FIX = "move it out of the run directory (or fix it), or use another run.id"


def paths(world_size: int, entries=ENTRIES) -> list[tuple[str, str]]:
    """The entries with "{r}" expanded for ranks 0..world_size-1."""
    out = []
    for name, form in entries:
        ranks = range(max(world_size, 1)) if "{r}" in name else [None]
        out += [(name.format(r=r) if r is not None else name, form) for r in ranks]
    return out


def problem(run_dir: Path, world_size: int = 1, entries=ENTRIES) -> str | None:
    """The one line (what is wrong with which path, and the fix) for the first entry of
    `run_dir` that is not in the form the launcher writes, or None when all are."""
    run_dir = Path(run_dir)
    if not run_dir.exists() and not run_dir.is_symlink():
        where = nearest_existing(run_dir)
        if where.is_dir() and can_create_in(where):
            return None  # a new run directory: made, with everything in it, by the launch
        return (
            f"{run_dir} would be made in {where}, which is not a writable folder; "
            f"choose a run.root that can be written"
        )
    for name, form in paths(world_size, entries):
        found = entry_problem(run_dir / name if name else run_dir, form)
        if found:
            return found
    return None


def _create_error(folder: Path) -> OSError | None:
    """What creating a file in `folder` raises, if anything: permission bits do not tell
    (root passes os.access on a read-only mount), and a full disk is told apart."""
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".launcher-write-test-")
    except OSError as exc:
        return exc
    os.close(fd)
    os.unlink(name)
    return None


def entry_problem(path: Path, form: str) -> str | None:
    """What is wrong with one entry (None: absent, or in the right form and usable)."""
    if path.is_symlink() and not path.exists():
        return (
            f"{path} is a symlink to {os.readlink(path)}, which does not exist; remove the "
            f"link or create what it points to"
        )
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return None  # absent: made when needed (its folder was checked before it)
    except OSError as exc:  # a parent that is not a folder, an unreadable parent
        return f"{path} cannot be looked at ({exc.strerror}); {_FIX}"
    if form == FOLDER:
        if not stat.S_ISDIR(mode):
            return f"{path} is a file, where the launcher keeps a folder; {_FIX}"
        try:
            os.listdir(path)
        except OSError as exc:
            return f"{path} is a folder the launcher cannot read ({exc.strerror}); {_FIX}"
        error = _create_error(path)
        if error is not None and error.errno in NO_SPACE:
            return (
                f"{path}: no space left on device (not even an empty file can be made "
                f"there); free some space, or point run.root at another file system"
            )
        if error is not None:
            return (
                f"{path} is a folder the launcher cannot write in ({error.strerror}: a "
                f"read-only mount or its permissions); make it writable, or use another "
                f"run.id or run.root"
            )
        return None
    if stat.S_ISDIR(mode):
        return f"{path} is a folder, where the launcher writes a file; {_FIX}"
    if not stat.S_ISREG(mode):
        return f"{path} is not a regular file, where the launcher writes one; {_FIX}"
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        return f"{path} is a file the launcher cannot read ({exc.strerror}); {_FIX}"
    if not os.access(path, os.W_OK):
        return (
            f"{path} is a file the launcher cannot write (a read-only mount or its "
            f"permissions); make it writable, or use another run.id or run.root"
        )
    return None
