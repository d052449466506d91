"""A full disk under run.root (real launches: 2 CPU ranks, the default DataLoader, through
`python -m launcher.torchrun`, on a small tmpfs mounted for the test).

Filled during training or before the launch: one `error:` line naming the path and the
space, exit 2, no traceback from any rank, no lock, no temporary folder or file left, the
good checkpoints' bytes untouched; after freeing space the run resumes.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from launcher.checkpoint import protocol as checkpoint

from launch import (
    FAST_USER_LOADER,
    checkpointed,
    explain,
    finish,
    start_torchrun,
    torchrun,
    wait_for,
)

ARGS = [
    *FAST_USER_LOADER,
    "trainer.max_steps=400",
    "trainer.checkpoint_interval=4",
    "trainer.eval_interval=0",
]


@pytest.fixture
def small_disk(tmp_path) -> Path:
    where = tmp_path / "disk"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(where)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode:
        pytest.skip(f"needs root to mount a tmpfs: {mounted.stderr.strip()}")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path) -> Path:
    """Write a filler file until the file system is full (as another job's output would)."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        for size in (2**20, 4096, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError:
                continue
    return filler


def digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha1(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def leftovers(run: Path) -> list[str]:
    """What a failed write may leave: temporary files and folders, the lock."""
    return sorted(
        str(p.relative_to(run))
        for p in run.rglob(".*")
        if p.name.startswith((".tmp-", ".lock")) or p.name.endswith(".tmp")
    )


def test_a_disk_filled_during_training_stops_cleanly_and_resumes_after(small_disk, tmp_path):
    output = tmp_path / "out.txt"
    args = [*ARGS, f"run.root={small_disk}", "run.id=full"]
    run = small_disk / "full"
    proc = start_torchrun(args, output)
    try:
        wait_for(checkpointed(small_disk, 4), proc)
        filler = fill(small_disk)
        good = {p.name: digest(p) for p in checkpoint.scan(run / "checkpoints").complete}
    finally:
        out = finish(proc, output)
    assert proc.returncode == 2, out
    errors = [ln for ln in out.splitlines() if "error: " in ln]
    assert len(errors) == 1, out
    assert "no space left on device writing" in errors[0] and str(small_disk) in errors[0]
    assert "free some space" in errors[0]
    assert "Traceback" not in out and "Logging error" not in out, out
    assert leftovers(run) == []
    assert (
        good and {p.name: digest(p) for p in checkpoint.scan(run / "checkpoints").complete} == good
    )
    if (run / "summary.json").exists():  # written where there was room
        assert '"failed: disk full"' in (run / "summary.json").read_text()

    os.unlink(filler)
    again = torchrun([*args, "trainer.max_steps=12"], runner="launcher.torchrun")
    assert again.returncode == 0, explain(again)
    assert f"resumed from step {checkpoint.step_of(Path(max(good)))}" in again.stderr


def test_a_full_disk_at_start_up_is_one_line_and_leaves_nothing(small_disk):
    filler = fill(small_disk)
    args = [*ARGS, "trainer.max_steps=2", f"run.root={small_disk}", "run.id=start"]
    proc = torchrun(args, runner="launcher.torchrun")
    assert proc.returncode == 2, explain(proc)
    errors = [ln for ln in proc.stderr.splitlines() if "error: " in ln]
    assert len(errors) == 1 and "no space left on device" in errors[0], explain(proc)
    assert "Traceback" not in proc.stderr, explain(proc)
    run = small_disk / "start"
    assert not run.exists() or leftovers(run) == []
    assert not run.exists() or not (run / "config.yaml").exists()  # never half a file
    os.unlink(filler)
    again = torchrun(args, runner="launcher.torchrun")
    assert again.returncode == 0, explain(again)
