"""A full disk under run.root (real launches: 2 CPU ranks, the default DataLoader, through
`python -m launcher.torchrun`, on a small tmpfs mounted for the test).

Filled before the launch, then (space freed, the same command started again) during
training: one `error:` line naming the path and the space, exit 2, no traceback from any
rank, no lock, no temporary folder or file left, the good checkpoints' bytes untouched;
after freeing space the run resumes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.checkpoint import protocol as checkpoint
from launcher.resilience import exit_codes

from launch import (
    FAST_USER_LOADER,
    checkpointed,
    explain,
    finish,
    start_torchrun,
    torchrun,
    wait_for,
)
from run_dir_tools import digest, leftovers

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


def test_a_full_disk_at_start_up_then_in_training_is_one_line_and_resumes_after(
    small_disk, tmp_path
):
    """Full before the launch: one line, exit 2, nothing left (never half a config.yaml).
    Space freed, the same command starts and trains (nothing left behind blocks it); filled
    during training: one line, exit 2, the good checkpoints' bytes; freed, it resumes."""
    args = [*ARGS, f"run.root={small_disk}", "run.id=full"]
    run = small_disk / "full"
    filler = fill(small_disk)
    refused = torchrun(args, runner="launcher.torchrun")
    assert refused.returncode == 2, explain(refused)
    errors = [ln for ln in refused.stderr.splitlines() if "error: " in ln]
    assert len(errors) == 1 and "no space left on device" in errors[0], explain(refused)
    assert "Traceback" not in refused.stderr, explain(refused)
    assert not run.exists() or leftovers(run) == []
    assert not run.exists() or not (run / "config.yaml").exists()  # never half a file
    os.unlink(filler)

    output = tmp_path / "out.txt"
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
    newest = checkpoint.step_of(Path(max(good)))  # how far it got depends on the machine's load
    again = torchrun([*args, f"trainer.max_steps={newest + 2}"], runner="launcher.torchrun")
    assert again.returncode == 0, explain(again)
    assert f"resumed from step {newest}" in again.stderr


# -- a full disk at each kind of write that is not a checkpoint or a start-up file -------
@pytest.fixture
def full_mounts(tmp_path):
    """mount(path, size): a tmpfs at `path` (created), filled at once or by `fill` later."""
    mounted: list[Path] = []

    def mount(path: Path, size: str = "1m") -> Path:
        path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, text=True)  # fmt: skip
        if done.returncode:
            pytest.skip(f"needs root to mount a tmpfs: {done.stderr.strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], check=False)


PROFILED = ["profiler=steps", "profiler.skip_first=1", "profiler.warmup=0", "profiler.active=2"]
WANDB = ["logger=wandb", "logger.mode=offline", "logger.dir={mount}"]
# kind of write: where the full file system is (under the run directory, or given by an
# override) and its size (1 MB; W&B's mid-run row needs the 16 MB a W&B launch asks for, and
# more), the overrides, when it fills ("start": full before the launch; "running": once the
# step-2 checkpoint exists), the exit code, what the one line names
WRITES = [
    ("traces", "run/traces", "1m", PROFILED, "start", exit_codes.STOPPED, "a profiler trace"),
    ("tensorboard", "run/tb", "1m", ["logger=tensorboard"], "running", exit_codes.STOPPED,
     "TensorBoard event files"),
    ("wandb-offline", "wandb", "1m", WANDB, "start", exit_codes.BAD_INPUT, "W&B files"),
    # W&B's service says nothing when the disk fills under it: its free space is checked
    ("wandb-offline-running", "run/wb", "24m", WANDB, "running", exit_codes.STOPPED,
     "W&B files"),
    # data.cache_dir, as the tests set it: through $LAUNCHER_CACHE_DIR, which overrides it
    ("data-cache", "cache", "1m", ["LAUNCHER_CACHE_DIR={mount}"], "start",
     exit_codes.BAD_INPUT, "the data cache"),
]  # fmt: skip
STATUS = {exit_codes.STOPPED: "stopped", exit_codes.BAD_INPUT: None}


@pytest.mark.parametrize(("where", "size", "overrides", "when", "code", "what"),
                         [w[1:] for w in WRITES], ids=[w[0] for w in WRITES])  # fmt: skip
def test_a_full_disk_at_each_kind_of_write_is_one_line(
    tmp_path, full_mounts, monkeypatch, where, size, overrides, when, code, what
):
    """One line on rank 0 naming the path (and the space where known), no traceback from
    any rank, no lock or temporary file left, the checkpoints written before it untouched,
    summary.json where there is room, the documented code: 143 when the stop checkpoint
    fits (the full file system is not the checkpoints'), 2 when the launch cannot start."""
    mount = full_mounts(tmp_path / where, size)
    if when == "start":
        fill(mount)
    run = tmp_path / "run"
    output = tmp_path / "out.txt"
    overrides = [o.format(mount=mount) for o in overrides]
    for name, value in (o.split("=", 1) for o in overrides if o[0].isupper()):
        monkeypatch.setenv(name, value)  # an environment variable, not an override
    args = [*ARGS, "trainer.checkpoint_interval=2", "trainer.keep_checkpoints=1000",
            *(o for o in overrides if o[0].islower()),
            f"run.root={tmp_path}", "run.id=run"]  # fmt: skip
    proc = start_torchrun(args, output)
    good = {}
    try:
        if when == "running":
            wait_for(checkpointed(tmp_path, 2), proc)
            fill(mount)
            good = {p.name: digest(p) for p in checkpoint.scan(run / "checkpoints").complete}
    finally:
        out = finish(proc, output)
    assert proc.returncode == code, out
    lines = [ln for ln in out.splitlines() if "no space left on device writing" in ln]
    assert len(lines) == 1 and "[rank 0]" in lines[0], out
    assert f"writing {what} (" in lines[0] and str(mount) in lines[0], lines[0]
    assert "Traceback" not in out and "Logging error" not in out, out
    assert not run.is_dir() or leftovers(run) == []
    assert [p.name for p in mount.rglob("*") if ".tmp" in p.name] == []
    if good:  # those the stop checkpoint did not rotate out (trainer.keep_checkpoints)
        now = {p.name: digest(p) for p in checkpoint.scan(run / "checkpoints").complete}
        kept = set(good) & set(now)
        assert kept and all(now[k] == good[k] for k in kept), (good, now)
    if STATUS[code]:
        assert '"status": "stopped"' in (run / "summary.json").read_text()
        assert (run / "checkpoints" / "latest").exists()


def test_a_full_disk_under_an_export_is_one_line_and_leaves_nothing(ddp_run, full_mounts, tmp_path):
    out_dir = full_mounts(tmp_path / "disk") / "exported"
    fill(out_dir.parent)
    proc = subprocess.run([sys.executable, "-m", "launcher.export", str(ddp_run), str(out_dir)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == exit_codes.BAD_INPUT, explain(proc)
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: no space left on device writing the export (")
    assert str(out_dir) in line and "it needs about" in line, line
    assert sorted(p.name for p in out_dir.parent.iterdir()) == ["filler"]  # no half an export
