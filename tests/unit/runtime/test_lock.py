"""Every tool that writes into a run directory has an owner (in-process): a second
invocation of launcher.rehearse, tune, analyze or export on the same directory while the
first holds it stops with one line (exit 2) and the first one's files are untouched;
the evidence of a refusal or a failure (a refused burn-in's figures, a failed rehearsal)
is moved to archive/, not overwritten. Also the analyser on wrong-typed run files, and
an export to a read-only file system or a mount point.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from launcher.analyze.__main__ import main as analyze_main
from launcher.analyze.facts import read_facts
from launcher.checkpoint.export import ExportError, export
from launcher.config import ConfigError, compose
from launcher.model.build import build_model
from launcher.plan.__main__ import main as plan_main
from launcher.rehearse.rehearsal import Rehearsal
from launcher.rehearse.runner import rehearse, set_aside_earlier
from launcher.resilience import burnin
from launcher.runtime import disk, lock
from launcher.runtime.lock import LockHeld, tool_lock
from launcher.submit.__main__ import main as submit_main
from launcher.tune.__main__ import main as tune_main

from in_process import restored_logging  # noqa: F401 - a fixture
from launch import FAST
from run_dir_tools import digest, write_lock
from submit_render import SHAPE

pytestmark = pytest.mark.usefixtures("restored_logging")
LIBC = ctypes.CDLL(None, use_errno=True)
MS_RDONLY, MS_REMOUNT, MS_BIND, MNT_DETACH = 1, 32, 4096, 2


def one_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


def test_a_second_holder_of_a_tool_lock_is_refused_naming_the_first(tmp_path):
    with tool_lock(tmp_path, "rehearse"):
        with pytest.raises(LockHeld) as refused, tool_lock(tmp_path, "rehearse"):
            pass
        line = str(refused.value)
        assert "in use by another launcher.rehearse" in line and f"pid {os.getpid()}" in line
        assert "\n" not in line and "use another run.id" in line
        with tool_lock(tmp_path, "analyze"):  # another tool's lock is another lock
            pass
    with tool_lock(tmp_path, "rehearse"):  # released: free again
        pass
    assert not (tmp_path / ".rehearse.lock").exists()


def test_a_dead_holders_tool_lock_is_taken_over(tmp_path, caplog):
    holder = {"host": os.uname().nodename, "pid": 2**22 + 1, "started": None,
              "launch_key": None, "nonce": "n", "since": 0}  # fmt: skip
    (tmp_path / ".tune.lock").write_text(json.dumps(holder))
    with tool_lock(tmp_path, "tune"):
        pass
    assert "took over the lock" in caplog.text


def test_a_second_rehearsal_of_a_run_is_refused_before_it_touches_the_first(tmp_path):
    run = tmp_path / "exp"
    (run / "rehearse" / "baseline").mkdir(parents=True)
    (run / "rehearse" / "report.json").write_text('{"passed": true}')
    before = digest(run)
    held = pytest.raises(ConfigError, match="in use by another launcher.rehearse")
    with tool_lock(run, "rehearse"), held:  # the first rehearsal, running
        rehearse([f"run.root={tmp_path}", "run.id=exp", "rehearse.nproc=2"])
    assert digest(run) == before  # its baseline and report: as they were


@pytest.mark.parametrize(("report", "kept"), [('{"passed": true}', False),
                                              ('{"passed": false}', True), (None, True)],
                         ids=["passed", "failed", "cut short"])  # fmt: skip
def test_an_earlier_rehearsal_that_failed_is_archived_not_replaced(tmp_path, report, kept):
    r = Rehearsal.__new__(Rehearsal)
    r.run_dir, r.root = tmp_path, tmp_path / "rehearse"
    (r.root / "kill").mkdir(parents=True)
    (r.root / "console.txt").write_text("the evidence")
    if report:
        (r.root / "report.json").write_text(report)
    before = digest(r.root)
    note = set_aside_earlier(r)
    assert not r.root.exists()
    archived = list((tmp_path / "archive").glob("*/rehearse"))
    assert bool(archived) == kept, note
    if kept:
        assert digest(archived[0]) == before and str(archived[0]) in note


def test_a_second_tuning_of_a_run_id_is_refused(tmp_path, monkeypatch, capsys):
    run = tmp_path / "t"
    run.mkdir()
    monkeypatch.setattr(sys, "argv", ["launcher.tune", f"run.root={tmp_path}", "run.id=t"])
    with tool_lock(run, "tune"), pytest.raises(SystemExit) as exit_info:
        tune_main()
    assert exit_info.value.code == 2
    assert "in use by another launcher.tune" in one_line(capsys.readouterr().err)


def test_a_second_render_into_a_run_directory_is_refused(tmp_path, capsys):
    """launcher.submit numbers its files in submit/ (job.sbatch, job-2.sbatch...): two
    renders at once would pick the same number and overwrite each other's."""
    run = tmp_path / "runs" / "x"
    run.mkdir(parents=True)
    args = [*FAST, *SHAPE["slurm"], f"run.root={tmp_path / 'runs'}", "run.id=x"]
    with tool_lock(run, "submit"):
        assert submit_main(["slurm", "--dry-run", *args]) == 2
    assert "in use by another launcher.submit" in one_line(capsys.readouterr().err)
    assert not (run / "submit").exists()
    assert submit_main(["slurm", "--dry-run", *args]) == 0  # once the first has ended
    assert (run / "submit" / "job.sbatch").is_file() and not (run / ".submit.lock").exists()


def test_a_second_plan_into_a_run_is_refused(tmp_path, capsys):
    """`--out RUN_DIR` writes the run's plan/ under its lock."""
    run = tmp_path / "p"
    run.mkdir()
    (run / "config.yaml").write_text("{}")
    with tool_lock(run, "plan"):
        assert plan_main(["--out", str(run)]) == 2
    assert "in use by another launcher.plan" in one_line(capsys.readouterr().err)
    assert not (run / "plan").exists()
    assert plan_main(["--out", str(run)]) == 0  # once the first has ended
    assert (run / "plan" / "plan.json").is_file() and not (run / ".plan.lock").exists()


def test_tune_skip_names_config_keys(monkeypatch, capsys, tmp_path):
    argv = ["launcher.tune", f"run.root={tmp_path}", "tune.skip=[data.num_worker]"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_info:
        tune_main()
    line = one_line(capsys.readouterr().err)
    assert exit_info.value.code == 2 and "tune.skip: data.num_worker is not a key" in line
    assert "did you mean data.num_workers" in line


def cpu_trace(run: Path) -> Path:
    """One profiled step of rank 0 (what the analyser needs to write a report)."""
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "launcher/step 9", "pid": 1, "tid": 1,
         "ts": 0.0, "dur": 1000.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 1, "ts": 10.0,
         "dur": 900.0},
    ]  # fmt: skip
    folder = run / "traces" / "rank0"
    folder.mkdir(parents=True)
    (folder / "rank0.1.pt.trace.json").write_text(json.dumps({"traceEvents": events}))
    return run


def test_a_second_analysis_of_a_run_is_refused(tmp_path, capsys):
    run = cpu_trace(tmp_path / "run")
    assert analyze_main([str(run), "--no-wandb", "--no-tensorboard"]) == 0
    first = digest(run / "analysis")
    capsys.readouterr()
    with tool_lock(run, "analyze"):
        assert analyze_main([str(run), "--no-wandb", "--no-tensorboard"]) == 2
    assert "in use by another launcher.analyze" in one_line(capsys.readouterr().err)
    assert digest(run / "analysis") == first


WRONG_TYPES = [("config.yaml", "- a\n- list\n"), ("summary.json", "[1, 2]"),
               ("env.json", '"a string"'), ("summary.json", "{not json"),
               ("env.json", '{"devices": "none", "world_size": "two"}'),
               ("config.yaml", "trainer: [1]\nmodel: 3\n")]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "text"), WRONG_TYPES, ids=[f"{n}-{t[:8]}" for n, t in WRONG_TYPES]
)
def test_the_analyser_on_wrong_typed_run_files_says_what_it_skipped(tmp_path, capsys, name, text):
    run = cpu_trace(tmp_path / "run")
    (run / name).write_text(text)
    assert analyze_main([str(run), "--no-wandb", "--no-tensorboard"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    facts = read_facts(run)
    if facts.skipped:  # a whole file it could not use: named, on stderr and in the report
        assert f"warning: skipped {run / name}" in err
        report = json.loads((run / "analysis" / "report.json").read_text())
        assert report["skipped"] == facts.skipped
    assert facts.world_size is None or isinstance(facts.world_size, int)


def test_a_refused_burnin_verdict_is_archived_before_the_next(tmp_path):
    refused = {"verdict": "refused", "bad_hosts": ["node7"], "ranks": [{"matmul_s": 9.0}]}
    (tmp_path / burnin.REPORT).write_text(json.dumps(refused))
    burnin.keep_earlier_verdict(tmp_path)
    (kept,) = (tmp_path / "archive").glob(f"*/{burnin.REPORT}")
    assert json.loads(kept.read_text()) == refused
    (tmp_path / burnin.REPORT).write_text('{"verdict": "pass"}')
    burnin.keep_earlier_verdict(tmp_path)  # a pass is replaced, not archived
    assert len(list((tmp_path / "archive").rglob(burnin.REPORT))) == 1


def tiny_checkpoint(run: Path) -> Path:
    """A DDP checkpoint of the tiny native GPT-2 (weights only: what an export reads)."""
    cfg = compose([])
    step = run / "checkpoints" / "step_00000001"
    step.mkdir(parents=True)
    torch.save(build_model(cfg.model, 512, eot_id=0).state_dict(), step / "model.pt")
    model = {"name": cfg.model.name, "impl": "native", "n_head": cfg.model.n_head}
    meta = {"step": 1, "files": {"model.pt": (step / "model.pt").stat().st_size}, "model": model}
    (step / "meta.json").write_text(json.dumps(meta))
    return run


def test_a_second_export_to_one_out_dir_is_refused(tmp_path):
    run, out = tiny_checkpoint(tmp_path / "run"), tmp_path / "hf"
    held = pytest.raises(ExportError, match="in use by another launcher.export")
    with tool_lock(tmp_path, "export", name=".hf.export.lock"), held:
        export(run, out)
    assert not out.exists()
    export(run, out)  # once the first has ended
    assert (out / "config.json").is_file() and not (tmp_path / ".hf.export.lock").exists()


def read_only_bind(path: Path) -> None:
    target = os.fsencode(path)
    for flags in (MS_BIND, MS_BIND | MS_REMOUNT | MS_RDONLY):
        if LIBC.mount(target, target, None, flags, None) != 0:
            raise OSError(ctypes.get_errno(), f"mount {path}")


@pytest.fixture
def mounted(tmp_path):
    points: list[Path] = []
    yield points
    for point in reversed(points):
        LIBC.umount2(os.fsencode(point), MNT_DETACH)


def test_an_export_to_a_read_only_file_system_or_a_mount_point_is_one_line(tmp_path, mounted):
    if os.geteuid() != 0:
        pytest.skip("needs root for a read-only bind mount")
    ro = tmp_path / "ro"
    ro.mkdir()
    read_only_bind(ro)
    mounted.append(ro)
    with pytest.raises(ExportError) as refused:
        export(tmp_path / "run", ro / "hf")
    assert "not a writable directory" in str(refused.value) and "no space" not in str(refused.value)
    point = tmp_path / "mnt"
    point.mkdir()
    LIBC.mount(os.fsencode(point), os.fsencode(point), None, MS_BIND, None)
    mounted.append(point)
    with pytest.raises(ExportError, match="is a mount point"):
        export(tmp_path / "run", point)


def test_a_read_only_error_is_not_a_full_disk(tmp_path):
    """However little is free where it happened, EROFS and EACCES say what they say."""
    for code in (30, 13):  # EROFS, EACCES
        assert not disk.is_full(OSError(code, os.strerror(code)), tmp_path)


def test_a_new_generation_cannot_write_before_the_old_one_ends(tmp_path, monkeypatch, caplog):
    """A JobSet restart, or a pod recreated, starts a new generation of the same launch on
    another host while the old one may still write its stop checkpoint: the new rank 0
    waits for the old one's lock (its heartbeat still beats) and takes the run directory
    only once the old one released it; nothing of the new generation is written before."""
    monkeypatch.setattr(lock, "WAIT_POLL_S", 0.02)
    held = write_lock(tmp_path, host="old-pod", launch_key="jobset-1")
    ended = threading.Event()

    def old_generation():  # writes its stop checkpoint for a second, beating, then ends
        until = time.monotonic() + 1.0
        while time.monotonic() < until:
            os.utime(held)
            time.sleep(0.05)
        (tmp_path / "stop-checkpoint-written").touch()
        ended.set()
        held.unlink()

    old = threading.Thread(target=old_generation)
    old.start()
    new = lock.RunLock(tmp_path, "jobset-1")
    with caplog.at_level(logging.WARNING):
        new.acquire()
    try:
        assert ended.is_set() and (tmp_path / "stop-checkpoint-written").exists()
        assert json.loads(held.read_text())["nonce"] == new.me.nonce
        (line,) = [r.getMessage() for r in caplog.records]
        assert "waiting for the earlier attempt of this launch (pid" in line
        assert "on old-pod, launch jobset-1" in line
    finally:
        new.release()
        old.join()
