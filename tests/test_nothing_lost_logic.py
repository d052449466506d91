"""A run directory's history belongs to it (in-process): every run-directory state x every
`resume` setting x a max_steps at, above and below the run's step, against the resume
decision. Each case either continues, says the run is finished, starts fresh in an empty
directory, moves an unfinished attempt aside (byte for byte), or refuses in one line
without touching a byte. What needs real ranks is in test_nothing_lost.py.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
from pathlib import Path

import pytest

from launcher import checkpoint, preemption, resume, run_history, torchrun
from launcher.config import ConfigError, compose, typed
from launcher.config.validate import run_id_problem
from launcher.train import main as train_main

IDENT = {
    "model": {"name": "gpt2-tiny", "n_layer": 2, "n_head": 2, "n_embd": 64,
              "n_positions": 256, "vocab_size": 512},
    "strategy": {"name": "ddp"},
    "world_size": 2,
}  # fmt: skip


def write_checkpoint(run: Path, step: int) -> None:
    folder = run / "checkpoints"
    path = folder / checkpoint.step_name(step)
    path.mkdir(parents=True)
    (path / "model.pt").write_bytes(b"m" * (10 + step))
    meta = {"step": step, "files": {"model.pt": 10 + step}, **IDENT, "lineage": "L"}
    (path / checkpoint.META).write_text(json.dumps(meta))
    (folder / checkpoint.LATEST).write_text(path.name + "\n")


def write_history(run: Path, steps: int, status: str | None) -> None:
    run.mkdir(parents=True, exist_ok=True)
    (run / "config.yaml").write_text("trainer: {max_steps: 4}\n")
    lines = "".join(json.dumps({"step": s, "loss": 5.0 - s}) + "\n" for s in range(1, steps + 1))
    (run / "metrics.jsonl").write_text(lines)
    if status is not None:
        (run / "summary.json").write_text(json.dumps({"status": status, "steps": steps}))


# name -> how to make it: the states a user's run directory is in after each kind of ending.
STATES = {
    "absent": lambda run: None,
    "completed, checkpointed": lambda run: (
        write_history(run, 4, "completed"), write_checkpoint(run, 2), write_checkpoint(run, 4)
    ),
    "completed, no checkpoints": lambda run: write_history(run, 4, "completed"),
    "stopped at 2": lambda run: (write_history(run, 2, "stopped"), write_checkpoint(run, 2)),
    "crashed before a checkpoint": lambda run: write_history(run, 2, None),
    "hang before a checkpoint": lambda run: write_history(run, 3, "failed: hang detected"),
    "summary unreadable": lambda run: (write_history(run, 0, None),
                                       (run / "summary.json").write_text("{garbage")),
}  # fmt: skip

# (state, resume, max_steps) -> outcome. "start": from step 0, nothing was there;
# "continue N": from step N; "finished N": ends with exit 0 at step N; "aside": the history
# moved to archive/<time>/, then from step 0; "refuse": one line, nothing touched.
OUTCOMES = {
    ("absent", "auto", 4): "start",
    ("absent", "never", 4): "start",
    ("absent", "archive", 4): "start",
    ("completed, checkpointed", "auto", 4): "finished 4",
    ("completed, checkpointed", "auto", 3): "finished 4",
    ("completed, checkpointed", "auto", 8): "continue 4",
    ("completed, checkpointed", "never", 4): "refuse",
    ("completed, checkpointed", "never", 8): "refuse",
    ("completed, checkpointed", "archive", 4): "aside",
    ("completed, no checkpoints", "auto", 4): "refuse",
    ("completed, no checkpoints", "auto", 8): "refuse",
    ("completed, no checkpoints", "never", 4): "refuse",
    ("completed, no checkpoints", "archive", 4): "aside",
    ("stopped at 2", "auto", 4): "continue 2",
    ("stopped at 2", "never", 4): "refuse",
    ("stopped at 2", "archive", 4): "aside",
    ("crashed before a checkpoint", "auto", 4): "aside",
    ("crashed before a checkpoint", "never", 4): "refuse",
    ("crashed before a checkpoint", "archive", 4): "aside",
    ("hang before a checkpoint", "auto", 4): "aside",
    ("hang before a checkpoint", "never", 4): "refuse",
    ("summary unreadable", "auto", 4): "aside",
    ("summary unreadable", "never", 4): "refuse",
}


def digest(folder: Path) -> dict[str, str]:
    if not folder.exists():
        return {}
    return {
        str(p.relative_to(folder)): hashlib.sha1(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize(("state", "resume_value", "max_steps"), list(OUTCOMES), ids=str)
def test_every_state_and_setting(tmp_path, caplog, state, resume_value, max_steps):
    run = tmp_path / "run"
    STATES[state](run)
    before = digest(run)
    expected = OUTCOMES[(state, resume_value, max_steps)]
    caplog.clear()
    with caplog.at_level(logging.INFO):
        if expected == "refuse":
            with pytest.raises(ConfigError) as refused:
                resume.plan(resume_value, run, IDENT, max_steps)
            line = str(refused.value)
            assert "\n" not in line and str(run) in line
            assert "new run.id" in line and "resume=archive" in line  # how to start fresh
            assert digest(run) == before  # not a byte touched
            return
        decided = resume.plan(resume_value, run, IDENT, max_steps)
    steps = [checkpoint.step_of(Path(p)) for p in decided.candidates]
    kind, _, at = expected.partition(" ")
    if kind == "finished":
        assert decided.finished_at == int(at) and digest(run) == before
    elif kind == "continue":
        assert decided.finished_at is None and steps[0] == int(at) and digest(run) == before
    elif kind == "start":
        assert steps == [] and digest(run) == before
    else:  # aside: every file, byte for byte, under archive/<time>/, then a fresh start
        assert steps == [] and decided.finished_at is None
        (moved,) = (run / resume.ARCHIVE).iterdir()
        prefix = f"{resume.ARCHIVE}/{moved.name}/"
        assert {k.removeprefix(prefix): v for k, v in digest(run).items()} == before
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1 and "moved" in warnings[0] and str(moved) in warnings[0]


def test_the_table_covers_every_state_and_setting():
    for state in STATES:
        for setting in ("auto", "never"):
            assert (state, setting, 4) in OUTCOMES, (state, setting)


def test_history_reads_what_is_there(tmp_path):
    run = tmp_path / "run"
    assert run_history.read(run).empty
    write_history(run, 3, "failed: hang detected")
    (run / "metrics.jsonl").write_text((run / "metrics.jsonl").read_text() + '{"step": 4, "lo')
    found = run_history.read(run)
    assert (found.records, found.last_step, found.status, found.steps) == (
        3, 3, "failed: hang detected", 3
    )  # fmt: skip
    assert found.describe() == (
        "metrics.jsonl (3 records, to step 3), summary.json (failed: hang detected at step 3)"
    )
    assert not found.completed and not found.empty


def test_finished_line_says_what_happened_and_how_to_go_on(tmp_path):
    line = resume.finished_line(tmp_path / "run", 4, 4)
    assert "\n" not in line and "step 4" in line and "nothing was trained or rewritten" in line
    assert "raise trainer.max_steps" in line and "new run.id" in line


@pytest.mark.parametrize(
    ("named", "expected"),
    [
        (None, "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"),
        ("SIGTERM", "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"),
        ("SIGUSR2, SIGXCPU,", "SIGUSR2,SIGXCPU,SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"),
    ],
)
def test_the_front_door_has_torchrun_forward_every_signal(named, expected):
    """Slurm's warnings (USR1/USR2) join torchrun's forwarded signals, and any the user
    named stay (see test_front_door_signals.py for what each does to a launch)."""
    environ = {} if named is None else {torchrun.SIGNALS_ENV: named}
    torchrun.forward_every_signal(environ)
    assert environ[torchrun.SIGNALS_ENV] == expected
    assert {s.name for s in preemption.STOP_SIGNALS} == set(torchrun.FORWARDED) - {"SIGQUIT"}


RUN_IDS = [
    ("../x", "holds a path separator"),
    ("/tmp/elsewhere", "holds a path separator"),
    ("a/b", "holds a path separator"),
    ("a\\b", "holds a path separator"),
    ("..", "is '..'"),
    (".", "is '.'"),
    ("' '", "is empty"),
    ("x" * 300, "is 300 bytes long, past the file system's limit of 255"),
]


@pytest.mark.parametrize(("run_id", "why"), RUN_IDS, ids=lambda v: str(v)[:20])
def test_a_run_id_that_is_not_one_folder_name_is_one_line(
    monkeypatch, capsys, tmp_path, run_id, why
):
    """The launch stops before anything is made, outside run.root or in it."""
    monkeypatch.setattr(
        sys, "argv", ["launcher.train", f"run.root={tmp_path}/runs", f"run.id={run_id}"]
    )
    with pytest.raises(SystemExit) as exit_info:
        train_main()
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: run.id=") and why in lines[0], lines[0]
    assert "run.root" in lines[0] and len(lines[0]) < 300
    assert list(tmp_path.iterdir()) == []  # nothing made, anywhere under the test's folder


@pytest.mark.parametrize("run_id", ["exp-1", "a.b_c", "x" * 255, "é" * 127])
def test_a_plain_run_id_passes(run_id):
    assert run_id_problem(run_id) is None


def test_the_limit_counts_bytes_not_characters():
    assert "is 256 bytes long" in run_id_problem("é" * 128)


def batch(global_batch=16, seq_len=128) -> dict:
    return {**IDENT, "batch": {"global_batch": global_batch, "seq_len": seq_len}}


# (checkpoint's meta.json, this launch) -> the fix the refusal names, or None: it resumes.
BATCH_CASES = [
    (batch(), batch(), None),
    (batch(), {**batch(), "world_size": 1}, None),  # another world size: accumulation
    (batch(16), batch(32), "trainer.global_batch_size=16"),
    (batch(32), batch(16), "trainer.global_batch_size=32"),
    (batch(seq_len=128), batch(seq_len=64), "trainer.seq_len=128"),
    (batch(16, 128), batch(32, 64), "trainer.global_batch_size=16 trainer.seq_len=128"),
    # Written before meta.json recorded the batch: its tokens per step tell.
    ({**IDENT, "step": 4, "tokens": 4 * 16 * 128}, batch(), None),
    ({**IDENT, "step": 4, "tokens": 4 * 16 * 128}, batch(32), "trainer.global_batch_size and"),
    ({**IDENT, "step": 4}, batch(32), None),  # nothing recorded: nothing to compare
]


@pytest.mark.parametrize(("saved", "now", "fix"), BATCH_CASES)
def test_a_resume_with_another_batch_or_sequence_length_is_refused(saved, now, fix):
    """The data position counts in the checkpoint's steps: resuming it with another batch
    would skip samples (16 -> 32 never read positions 128-287) and make `tokens` jump or
    go backwards."""
    found = resume.differences(saved, now)
    if fix is None:
        assert found == []
        return
    assert fix in " ".join(d.fix for d in found)
    line = str(resume.refusal(Path("run/checkpoints/step_4"), found, Path("run")))
    assert "\n" not in line and "cannot be resumed" in line and "new run.id" in line


def test_the_launch_records_its_batch():
    cfg = typed(compose(["trainer.global_batch_size=8", "trainer.seq_len=64"]))
    assert resume.identity(cfg, None, 2)["batch"] == {"global_batch": 8, "seq_len": 64}
