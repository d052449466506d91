"""Every entry of a run directory (docs/run-directory.md) in every wrong form, against a
finished run (in-process).

The forms: a file where the launcher keeps a folder, a folder where it writes a file, a
symlink to nothing, something it cannot read, something it cannot write (a read-only
mount). Each is refused in one line naming the path, and nothing of the finished run
changes; through the train front door, exit 2, the finished run's summary.json kept and no
`.lock` left. Read-only mounts are bind mounts (root, as on the CI machine); "cannot read"
is checked as an unprivileged user, since root reads whatever the mode says.
"""

from __future__ import annotations

import ctypes
import json
import os
import pickle
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from refusals import readable_by_nobody

from launcher import paths
from launcher.checkpoint import protocol as checkpoint
from launcher.runtime import run_dir_check
from launcher.runtime.run_dir_check import FILE, FOLDER
from launcher.train.front_door import main as train_main

from in_process import restored_logging  # noqa: F401 - a fixture
from run_dir_tools import digest

pytestmark = pytest.mark.usefixtures("restored_logging")
NOBODY = 65534
ENTRIES = run_dir_check.paths(world_size=2)
LIBC = ctypes.CDLL(None, use_errno=True)
MS_RDONLY, MS_REMOUNT, MS_BIND, MNT_DETACH = 1, 32, 4096, 2


def read_only_bind(path: Path) -> None:
    """`mount --bind -o ro path path`, in-process (mount(2) twice: bind, then remount ro)."""
    target = os.fsencode(path)
    for flags in (MS_BIND, MS_BIND | MS_REMOUNT | MS_RDONLY):
        if LIBC.mount(target, target, None, flags, None) != 0:
            raise OSError(ctypes.get_errno(), f"mount {path}")


def unmount_all(under: Path) -> None:
    """Detach every mount below `under` (the read-only forms), deepest first."""
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    points = [line.split()[1] for line in mounts if line.split()[1].startswith(str(under))]
    for point in sorted(points, key=len, reverse=True):
        LIBC.umount2(os.fsencode(point), MNT_DETACH)


@pytest.fixture
def base():
    """A folder every user can reach (the unreadable form is looked at as `nobody`)."""
    where = Path(tempfile.mkdtemp(prefix="run-dir-forms-"))
    where.chmod(0o755)
    yield where
    unmount_all(where)
    shutil.rmtree(where, ignore_errors=True)


def finished_run(run: Path) -> Path:
    """A finished 4-step run: its checkpoint, history, logs and lock-free directory."""
    step = run / "checkpoints" / checkpoint.step_name(4)
    step.mkdir(parents=True)
    (step / "model.pt").write_bytes(b"m" * 64)
    meta = {"step": 4, "files": {"model.pt": 64}}
    (step / checkpoint.META).write_text(json.dumps(meta))
    (run / "checkpoints" / checkpoint.LATEST).write_text(step.name + "\n")
    (run / "logs").mkdir()
    for r in (0, 1):
        (run / "logs" / f"rank{r}.log").write_text("an earlier launch\n")
    (run / "config.yaml").write_text("trainer: {max_steps: 4}\n")
    (run / "env.json").write_text("{}")
    (run / "metrics.jsonl").write_text('{"step": 4, "loss": 5.0}\n')
    (run / "summary.json").write_text('{"status": "completed", "steps": 4}')
    return run


def make(path: Path, form: str) -> None:
    """`path` present in its right form (created when the finished run has none)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if form == FOLDER:
        path.mkdir(exist_ok=True)
    elif not path.exists():
        path.write_text("x")


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def wrong_form(path: Path, form: str, how: str) -> None:
    """Put `path` in the wrong form `how`."""
    if how == "other form":
        remove(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir() if form == FILE else path.write_text("not a folder")
    elif how == "dangling symlink":
        remove(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(path.parent / "nowhere")
    elif how == "unreadable":
        make(path, form)
        path.chmod(0)
    elif how == "read-only":
        make(path, form)
        read_only_bind(path)


def as_nobody(run: Path) -> str | None:
    """`problem(run)` seen by an unprivileged user (a child process), so that a mode of 0
    means what it means to every user but root. The tree is opened to that user first."""
    for folder, dirs, files in os.walk(run):
        for name in [*dirs, *files]:
            p = Path(folder) / name
            if not p.is_symlink() and p.stat().st_mode & 0o777:
                p.chmod(0o777)
    run.chmod(run.stat().st_mode | 0o777 if run.stat().st_mode & 0o777 else 0)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, look, report, exit
        os.close(read)
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        with os.fdopen(write, "wb") as out:
            pickle.dump(run_dir_check.problem(run, 2), out)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as got:
        found = pickle.load(got)
    os.waitpid(pid, 0)
    return found


def needs_root(how: str) -> None:
    if how in ("read-only", "unreadable") and os.geteuid() != 0:
        pytest.skip(f"needs root for the {how} form (a bind mount, an unprivileged child)")


FORMS = ["other form", "dangling symlink", "unreadable", "read-only"]
CASES = [(name, form, how) for name, form in ENTRIES for how in FORMS]


@pytest.mark.parametrize(
    ("name", "form", "how"), CASES, ids=[f"{n or '.'}-{h}" for n, _, h in CASES]
)
def test_every_entry_in_every_wrong_form_is_refused_in_one_line(base, name, form, how):
    needs_root(how)
    run = finished_run(base / "run")
    path = run / name if name else run
    wrong_form(path, form, how)
    before = digest(run) if how != "unreadable" else None
    found = as_nobody(run) if how == "unreadable" else run_dir_check.problem(run, 2)
    assert found is not None and "\n" not in found
    assert found.startswith(f"{path} "), found
    if before is not None:
        assert digest(run) == before  # the finished run, byte for byte
    assert not (run / ".lock").exists() or name == ".lock"


def test_a_finished_run_in_the_right_forms_passes(base):
    run = finished_run(base / "run")
    for name, form in ENTRIES:
        make(run / name, form)
    assert run_dir_check.problem(run, 2) is None
    assert as_nobody(run) is None  # every entry opened to that user: readable and writable


def test_a_new_run_directory_where_nothing_can_be_made_is_refused(base):
    (base / "root").write_text("a file where run.root should be")
    found = run_dir_check.problem(base / "root" / "run", 1)
    assert found and "not a writable folder" in found and "run.root" in found


# Through the front door: what the issue met, and a few more; each the same one line.
FRONT_DOOR = [
    ("logs", "other form", []),
    ("archive", "other form", ["resume=archive"]),
    ("logs/rank0.log", "other form", []),
    ("", "other form", []),
    ("", "dangling symlink", []),
    ("checkpoints", "read-only", []),
    ("checkpoints/superseded", "other form", ["resume=checkpoints/step_00000004"]),
    ("summary.json", "dangling symlink", []),
    ("metrics.jsonl", "read-only", []),
]


@pytest.mark.parametrize(("name", "how", "extra"), FRONT_DOOR,
                         ids=[f"{n or '.'}-{h}" for n, h, _ in FRONT_DOOR])  # fmt: skip
def test_a_launch_refuses_before_writing_anything(base, monkeypatch, capsys, name, how, extra):
    needs_root(how)
    run = finished_run(base / "run")
    form = dict(ENTRIES).get(name, FOLDER)
    path = run / name if name else run
    wrong_form(path, form, how)
    before = digest(run)
    extra = [e.replace("checkpoints/", f"{run}/checkpoints/") for e in extra]
    args = [f"run.root={base}", "run.id=run", "trainer.max_steps=8", *extra]
    monkeypatch.setattr(sys, "argv", ["launcher.train", *args])
    with pytest.raises(SystemExit) as exit_info:
        train_main()
    lines = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in lines if "error" in line.lower() or "Traceback" in line]
    assert exit_info.value.code == 2, lines
    assert len(errors) == 1 and f"{path} " in errors[0], lines
    assert digest(run) == before  # summary.json, metrics, logs: the finished run's bytes
    assert not (run / ".lock").exists()


@pytest.mark.parametrize(("access", "mode"), [("private", 0o700), ("group", 0o750),
                                              ("world", 0o755)])  # fmt: skip
def test_a_run_directory_is_made_as_private_as_run_access_says(base, access, mode):
    """run.access: the run directory (and a sweep's folder above a point) gets its mode; the
    run root, which others may share, keeps its own; an existing run directory is given the
    mode the config says (a resumed run's access follows its config)."""
    root = base / "runs"
    root.mkdir(mode=0o755)
    paths.make_run_dir(root / "sweep" / "point", root, access)
    assert (root / "sweep" / "point").stat().st_mode & 0o777 == mode
    assert (root / "sweep").stat().st_mode & 0o777 == mode
    assert root.stat().st_mode & 0o777 == 0o755
    (root / "old").mkdir(mode=0o777)
    paths.make_run_dir(root / "old", root, access)
    assert (root / "old").stat().st_mode & 0o777 == mode


def test_a_private_run_directory_is_closed_to_other_users(base):
    """What the mode means to another user: nothing under a private run directory can be
    read, however its files' own modes read (summary.json stays 0644)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to look as another user")
    root = base / "runs"
    root.mkdir(mode=0o755)
    paths.make_run_dir(root / "r", root, "private")
    (root / "r" / "summary.json").write_text("{}")
    (root / "r" / "summary.json").chmod(0o644)
    assert not readable_by_nobody(root / "r" / "summary.json")


def test_an_export_is_as_readable_as_its_run_directory(base):
    """safetensors writes its file for its owner alone: the export's folder and files take
    the run directory's access instead (0750 -> files 0640)."""
    run, out = base / "run", base / "out"
    run.mkdir(mode=0o750)
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"w")
    (out / "model.safetensors").chmod(0o600)
    (out / "config.json").write_text("{}")
    paths.same_access(out, run)
    assert out.stat().st_mode & 0o777 == 0o750
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == {
        "model.safetensors": 0o640,
        "config.json": 0o640,
    }
