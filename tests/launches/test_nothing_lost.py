"""Nothing a user ran is lost to a later launch (real launches: 2 CPU ranks, the default
DataLoader, through `python -m launcher.torchrun`).

A finished run (a copy of the shared long run) relaunched with the same command says so
and rewrites nothing; with another global batch it is refused; with a higher
trainer.max_steps it continues and appends; a finished run without checkpoints is not
started over; a checkpoint whose every rank had written its files before a crash is
resumed after it (FSDP2's asynchronous save seals itself; a save whose seal never ran is
sealed by the relaunch, FSDP2 and DeepSpeed). The decision table itself is in
test_nothing_lost_logic.py, the run directory's forms in test_run_dir_check.py.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from launch import FAST_USER_LOADER, explain, metrics, python_train, summary, torchrun
from reference import copy_run
from reference_runs import LONG

SHORT = [
    *FAST_USER_LOADER,
    "trainer.max_steps=4",
    "trainer.eval_interval=0",
    "trainer.checkpoint_interval=2",
]


def sha(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()


def files(run: Path) -> dict[str, str]:
    """Every file but the logs (which each launch appends to) and the lock."""
    return {
        str(p.relative_to(run)): sha(p)
        for p in sorted(run.rglob("*"))
        if p.is_file() and p.relative_to(run).parts[0] != "logs" and p.name != ".lock"
    }


def test_a_finished_run_relaunched_is_left_alone_and_continues_when_asked(long_run, tmp_path):
    """A copy of the shared long run (tests/reference_runs.py: finished at step 60 with the
    default DataLoader, checkpoints at 40 and 60), relaunched with its own command."""
    args = [*LONG, f"run.root={tmp_path}", "run.id=done"]
    run = copy_run(long_run, tmp_path / "done")
    finished = files(run)
    old_metrics = (run / "metrics.jsonl").read_bytes()

    again = torchrun(args, runner="launcher.torchrun")
    assert again.returncode == 0, explain(again)
    said = [ln for ln in again.stderr.splitlines() if "the run is finished" in ln]
    assert len(said) == 1 and "step 60" in said[0] and "raise trainer.max_steps" in said[0]
    assert "resumed from step" not in again.stderr
    assert files(run) == finished  # summary.json, metrics.jsonl, config, checkpoints: same bytes
    assert not (run / ".lock").exists()

    bigger = torchrun([*args, "trainer.max_steps=62", "trainer.global_batch_size=16"],
                      runner="launcher.torchrun")  # fmt: skip
    assert bigger.returncode == 2, explain(bigger)
    (line,) = [ln for ln in bigger.stderr.splitlines() if "error: " in ln]
    assert "trainer.global_batch_size is 8 there, 16 now" in line
    assert "run with trainer.global_batch_size=8" in line
    assert files(run) == finished

    longer = torchrun([*args, "trainer.max_steps=62"], runner="launcher.torchrun")
    assert longer.returncode == 0, explain(longer)
    assert "resumed from step 60" in longer.stderr
    (changed,) = [ln for ln in longer.stderr.splitlines() if "with changed settings" in ln]
    # The settings this launch changed: trainer.max_steps, and where the copy now lies.
    _, _, listed = changed.partition("continuing from step 60 with changed settings: ")
    moved, root, steps = listed.split("; ")
    assert moved == "run.id: long_run -> done" and steps == "trainer.max_steps: 60 -> 62"
    assert root.startswith("run.root: ") and root.endswith(f" -> {tmp_path}")
    assert (run / "metrics.jsonl").read_bytes().startswith(old_metrics)  # appended to
    records = [r for r in metrics(run) if "loss" in r]
    assert [r["step"] for r in records] == list(range(1, 63))
    tokens = [r["tokens"] for r in records]
    assert tokens == sorted(tokens) and len(set(tokens)) == 62  # never backwards, never stalls
    assert summary(run)["status"] == "completed" and summary(run)["steps"] == 62
    assert summary(run)["loss"] is not None and summary(run)["tokens_per_s"] is not None


def test_a_finished_run_without_checkpoints_is_not_started_over(tmp_path):
    args = [*SHORT, "trainer.checkpoint_interval=0", f"run.root={tmp_path}", "run.id=nockpt"]
    run = tmp_path / "nockpt"
    first = python_train(args)
    assert first.returncode == 0, explain(first)
    finished = files(run)
    assert len(metrics(run)) == 4

    for changed in (["trainer.global_batch_size=16"], ["resume=never"]):
        again = torchrun([*args, *changed], runner="launcher.torchrun")
        assert again.returncode == 2, explain(again)
        errors = [ln for ln in again.stderr.splitlines() if "error: " in ln]
        assert len(errors) == 1, explain(again)
        assert "new run.id" in errors[0] and "resume=archive" in errors[0]
        assert "Traceback" not in again.stderr
        assert files(run) == finished
        assert not (run / ".lock").exists()

    fresh = python_train([*args, "resume=archive"])  # on purpose: the old history moved aside
    assert fresh.returncode == 0, explain(fresh)
    (moved,) = (run / "archive").iterdir()
    assert files(moved) == {k: v for k, v in finished.items() if k in files(moved)}
    assert {"metrics.jsonl", "summary.json", "config.yaml"} <= set(files(moved))


@pytest.mark.parametrize(
    "engine",
    [["strategy=fsdp2", "trainer.async_checkpoint=true"], ["strategy=zero2"]],
    ids=["fsdp2-async", "deepspeed"],
)
def test_a_checkpoint_written_before_a_crash_is_resumed_after_it(tmp_path, engine):
    """Step 2's checkpoint, then rank 1 hangs in step 4 and the watchdog ends the job
    (exit 5) before the next save (the issue's case). FSDP2's asynchronous save sealed
    itself once every rank's files were written (before, it waited for that next save, and
    the relaunch deleted it). Then the same folder as a job killed between the writes and
    the seal leaves it (`.tmp-step_2`: the files, the intent, every rank's marker, no
    meta.json): the relaunch seals it and resumes from it."""
    args = [*SHORT, *engine, f"run.root={tmp_path}", "run.id=crash"]
    run = tmp_path / "crash"
    hang = ["fault.kind=stall", "fault.rank=1", "fault.step=4", "fault.seconds=600",
            "watchdog.min_s=3"]  # fmt: skip
    crashed = torchrun([*args, *hang], runner="launcher.torchrun")
    assert crashed.returncode == 5, explain(crashed)
    step2 = run / "checkpoints" / "step_00000002"
    meta = json.loads((step2 / "meta.json").read_text())  # sealed, by itself
    assert meta["tokens"] > 0 and not list((run / "checkpoints").glob(".tmp-*"))
    before = {name: sha(step2 / name) for name in meta["files"]}

    unsealed = step2.with_name(".tmp-step_00000002")  # as the seal had never run
    step2.rename(unsealed)
    (unsealed / "meta.json").unlink()
    intent = {k: v for k, v in meta.items() if k not in ("files", "write_s")}
    (unsealed / ".intent.json").write_text(json.dumps(intent))
    for rank in (0, 1):
        (unsealed / f".written_rank{rank}").touch()
    (run / "checkpoints" / "latest").unlink()

    again = torchrun(args, runner="launcher.torchrun")
    assert again.returncode == 0, explain(again)
    assert "sealed" in again.stderr and "resumed from step 2" in again.stderr
    assert summary(run)["status"] == "completed" and summary(run)["resumed_from_step"] == 2
    resealed = json.loads((step2 / "meta.json").read_text()) if step2.exists() else None
    assert resealed is None or {n: sha(step2 / n) for n in resealed["files"]} == before
