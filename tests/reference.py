"""Reference runs: launched once per test session, read by many tests, never changed.

Under pytest-xdist every worker is its own process; a reference is built by the first worker
that asks for it, under a file lock in the directory all workers share, and the others wait
and read the same run. A failed build is recorded, so every later user fails with the first
failure's output instead of launching it again. A test that needs to damage, resume or extend
a run works on a copy (`copy_run`, `cut_at`); `changed_references` (checked when the session
ends) names any reference a test changed in place.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from launch import explain

# A resume at another world size reduces in another order (accumulation 2 x 2 ranks, or
# 4 x 1 rank; 1 x 16 or 4 x 4): fp32 rounding, not a different computation. The relative
# tolerance on its losses against the uninterrupted run's (tests/launches/test_fsdp2.py,
# tests/scale/).
REORDERED = 2e-5


def shared_root(tmp_path_factory) -> Path:
    """The folder every xdist worker of this session sees (the session's own without xdist)."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared"
    root.mkdir(exist_ok=True)
    return root


def _manifest(path: Path) -> str:
    files = sorted(p for p in path.rglob("*") if p.is_file())
    return "\n".join(
        f"{p.relative_to(path)} {p.stat().st_size} {p.stat().st_mtime_ns}" for p in files
    )


def reference(root: Path, name: str, launch: Callable[[Path], subprocess.CompletedProcess]) -> Path:
    """`root/name`, built by `launch(path)` the first time any worker asks; the launch's
    output is kept beside it as `name.log`."""
    path, lock = root / name, root / f"{name}.lock"
    ok, failed, log = root / f"{name}.manifest", root / f"{name}.failed", root / f"{name}.log"
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if failed.exists():
            raise AssertionError(f"reference run {name} failed earlier:\n{failed.read_text()}")
        if not ok.exists():
            proc = launch(path)
            log.write_text(proc.stdout + proc.stderr)
            if proc.returncode != 0:
                failed.write_text(explain(proc))
                raise AssertionError(f"reference run {name} failed:\n{explain(proc)}")
            ok.write_text(_manifest(path))
    return path


def launch_log(root: Path, name: str) -> str:
    return (root / f"{name}.log").read_text()


def changed_references(root: Path) -> list[str]:
    """Names of the reference runs whose files differ from when they were built."""
    return [
        m.name.removesuffix(".manifest")
        for m in sorted(root.glob("*.manifest"))
        if _manifest(root / m.name.removesuffix(".manifest")) != m.read_text()
    ]


def copy_run(run_dir: Path, dest: Path) -> Path:
    """A copy of a run directory a test may change."""
    shutil.copytree(run_dir, dest, symlinks=True)
    return dest


def cut_at(run_dir: Path, step: int, dest: Path, older: tuple[int, ...] = ()) -> Path:
    """A run directory holding only `run_dir`'s checkpoint of `step`, as `latest`, and those
    of the `older` steps: what a run stopped right after that checkpoint resumes from."""
    ckpts = dest / "checkpoints"
    for kept in (*older, step):
        name = f"step_{kept:08d}"
        shutil.copytree(run_dir / "checkpoints" / name, ckpts / name)
    (ckpts / "latest").write_text(f"step_{step:08d}\n")
    return dest
