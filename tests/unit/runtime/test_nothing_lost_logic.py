"""A run directory's history belongs to it (in-process): every run-directory state x every
`resume` setting x a max_steps at, above and below the run's step, against the resume
decision. Each case either continues, says the run is finished, starts fresh in an empty
directory, moves an unfinished attempt aside (byte for byte), or refuses in one line
without touching a byte. What needs real ranks is in tests/launches/test_nothing_lost.py.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from launcher.checkpoint import protocol as checkpoint
from launcher.checkpoint import resume
from launcher.config import ConfigError, compose, typed
from launcher.config.validate import run_id_problem
from launcher.runtime import disk, run_history
from launcher.train.front_door import main as train_main

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
    torch.save({"step": torch.tensor(step)}, path / "model.pt")  # readable, as a finished run's
    size = (path / "model.pt").stat().st_size
    meta = {"step": step, "files": {"model.pt": size}, **IDENT, "lineage": "L"}
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


def test_an_unreadable_last_checkpoint_is_not_a_finished_run(tmp_path):
    """Full size but not a torch file (as after a crash while the disk wrote it): the run is
    not finished; the launch resumes with that checkpoint first, and the loader falls back
    from it to the previous one (launcher.checkpoint.manager, tests/launches/test_faults.py)."""
    run = tmp_path / "run"
    STATES["completed, checkpointed"](run)
    model = run / "checkpoints" / checkpoint.step_name(4) / "model.pt"
    model.write_bytes(b"\0" * model.stat().st_size)
    decided = resume.plan("auto", run, IDENT, 4)
    assert decided.finished_at is None
    assert [checkpoint.step_of(Path(p)) for p in decided.candidates] == [4, 2]


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
# Hydra's override grammar refuses these in run.id itself; the variable carries them.
CONTROL_IDS = [
    ("a\nb", "holds the control character '\\n'"),
    ("a\tb", "holds the control character '\\t'"),
    ("a\x1bb", "holds the control character '\\x1b'"),
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


@pytest.mark.parametrize(
    ("run_id", "why"), [RUN_IDS[0], RUN_IDS[4], RUN_IDS[7], *CONTROL_IDS], ids=lambda v: str(v)[:20]
)
def test_launcher_run_id_is_checked_like_run_id(monkeypatch, capsys, tmp_path, run_id, why):
    """$LAUNCHER_RUN_ID names the run directory when run.id is unset (the Slurm and
    Kubernetes renderers set it), so a bad one is the same one line, naming the variable."""
    monkeypatch.setenv("LAUNCHER_RUN_ID", run_id)
    monkeypatch.setattr(sys, "argv", ["launcher.train", f"run.root={tmp_path}/runs"])
    with pytest.raises(SystemExit) as exit_info:
        train_main()
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: LAUNCHER_RUN_ID=") and why in lines[0], lines[0]
    assert list(tmp_path.iterdir()) == []  # no directory named with a newline, or any


def test_run_id_wins_over_a_bad_launcher_run_id(monkeypatch):
    """An explicit run.id is the name used, so the variable it overrides is not checked."""
    from launcher.config.validate import validate

    monkeypatch.setenv("LAUNCHER_RUN_ID", "../elsewhere")
    cfg = compose(["run.id=exp-1"])
    validate(cfg, world_size=1)  # no ConfigError


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
    # Nothing recorded (nor in its run's config.yaml): the data position cannot be proven.
    ({**IDENT, "step": 4}, batch(32), '"batch": {"global_batch": G, "seq_len": L}'),
    ({**IDENT, "step": 4}, batch(), '"batch": {"global_batch": G, "seq_len": L}'),
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


@pytest.mark.parametrize(
    ("config", "now", "refused"),
    [
        ("trainer: {global_batch_size: 16, seq_len: 128}\n", batch(), False),
        ("trainer: {global_batch_size: 16, seq_len: 128}\n", batch(32), True),
        ("trainer: {global_batch_size: null, seq_len: 128}\n", batch(), True),
        ("[garbage", batch(), True),
    ],
    ids=["same batch", "another batch", "no batch there", "unreadable config"],
)
def test_a_checkpoint_without_its_batch_is_judged_by_its_runs_config(tmp_path, config, now,
                                                                      refused):  # fmt: skip
    """A checkpoint whose meta.json records neither its batch nor its tokens: the run's
    config.yaml (written by the launch that wrote it) says what its batch was; with neither,
    the data position cannot be proven and the resume is refused."""
    step = tmp_path / "run" / "checkpoints" / "step_00000004"
    step.mkdir(parents=True)
    (step / checkpoint.META).write_text(json.dumps({**IDENT, "step": 4}))
    (tmp_path / "run" / "config.yaml").write_text(config)
    found = resume.differences(resume.read_meta_with_batch(step), now)
    assert bool(found) == refused, found


def test_the_launch_records_its_batch():
    cfg = typed(compose(["trainer.global_batch_size=8", "trainer.seq_len=64"]))
    assert resume.identity(cfg, None, 2)["batch"] == {"global_batch": 8, "seq_len": 64}


FULL = OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize(
    ("exc", "free", "full"),
    [
        (FULL, 10 * 2**30, True),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), 10 * 2**30, True),
        (RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 6784 vs 6676"),
         0, True),  # torch.save's zip writer: no errno, but nothing is free
        (RuntimeError("unexpected pos 6784 vs 6676"), 10 * 2**30, False),
        (OSError(errno.EACCES, "Permission denied"), 10 * 2**30, False),
        (ValueError("bad value"), 0, False),
    ],
    ids=["ENOSPC", "EDQUOT", "torch short write, disk full", "torch, room", "EACCES", "other"],
)  # fmt: skip
def test_a_full_disk_is_told_from_other_write_errors(monkeypatch, tmp_path, exc, free, full):
    monkeypatch.setattr(disk, "free_bytes", lambda path: free)
    assert disk.is_full(exc, tmp_path) is full


def test_a_full_disk_behind_another_error_counts(monkeypatch, tmp_path):
    monkeypatch.setattr(disk, "free_bytes", lambda path: 10 * 2**30)
    try:
        raise ValueError("could not save") from FULL
    except ValueError as wrapped:
        assert disk.is_full(wrapped, tmp_path)


def test_the_no_space_line_names_the_path_and_the_sizes(tmp_path):
    line = disk.no_space_line("checkpoint step_00000012", tmp_path, 5 * 2**20 // 2)
    assert "\n" not in line and str(tmp_path) in line and "it needs about 2.5 MB" in line
    assert " free there; free some space or point run.root at another file system" in line
    assert disk.mb(300) == "0 kB" and disk.mb(4096) == "4 kB" and disk.mb(None) == "?"


def failing(exc):
    def write(folder: Path):
        (folder / "model.pt").write_bytes(b"half")
        raise exc

    return write


@pytest.mark.parametrize(
    ("exc", "full", "says"),
    [
        (FULL, True, "no space left on device writing checkpoint step_00000008"),
        (OSError(errno.EIO, "Input/output error"), False, "could not be written (rank 0: OSError"),
    ],
    ids=["disk full", "I/O error"],
)
def test_a_checkpoint_that_cannot_be_written_leaves_the_good_ones(tmp_path, exc, full, says):
    folder = tmp_path / "checkpoints"
    writer = checkpoint.CheckpointWriter(folder, is_main=True, barrier=lambda: None, keep=3)
    writer.save(4, lambda f: (f / "model.pt").write_bytes(b"good"), {})
    before = digest(folder)
    with pytest.raises(checkpoint.CheckpointNotWritten) as failed:
        writer.save(8, failing(exc), {})
    assert failed.value.disk_full is full and failed.value.step == 8
    assert says in str(failed.value) and "step_00000004, is kept" in str(failed.value)
    assert digest(folder) == before  # no .tmp-step_00000008, latest still names step 4


def test_every_rank_learns_of_one_ranks_failed_write(tmp_path):
    """Rank 1's problem reaches rank 0 through the gather that replaced the barrier: rank 0
    removes the temporary folder and raises the same line (the gather is the collective)."""
    folder = tmp_path / "checkpoints"
    rank1_says = (f"OSError: [Errno {errno.ENOSPC}] No space left on device", True)
    writer = checkpoint.CheckpointWriter(
        folder, is_main=True, barrier=lambda: None, keep=3,
        gather=lambda mine: [mine, rank1_says if isinstance(mine, (tuple, type(None))) else ""],
    )  # fmt: skip
    with pytest.raises(checkpoint.CheckpointNotWritten, match="no space left") as failed:
        writer.save(2, lambda f: (f / "model.pt").write_bytes(b"fine on rank 0"), {})
    assert failed.value.disk_full and not any(folder.iterdir())


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """A real save_pretrained folder of a tiny GPT-2 (what launcher.export writes)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = tmp_path_factory.mktemp("export")
    config = GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=32, vocab_size=64)
    GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


def cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def as_bin(folder: Path) -> None:
    """pytorch_model.bin instead of safetensors, then damaged."""
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"PK\x03\x04 not a zip")


INIT_FROM = [
    ("whole", lambda f: None, None),
    ("weights missing", lambda f: (f / "model.safetensors").unlink(),
     "holds no model.safetensors or pytorch_model.bin"),
    ("weights truncated", lambda f: cut(f / "model.safetensors"), "model.safetensors is "),
    ("weights padded", lambda f: (f / "model.safetensors").write_bytes(
        (f / "model.safetensors").read_bytes() + b"\0"), "truncated or padded"),
    ("weights garbage", lambda f: (f / "model.safetensors").write_bytes(b"\xff" * 64),
     "not a readable safetensors file"),
    ("weights empty", lambda f: (f / "model.safetensors").write_bytes(b""),
     "not a readable safetensors file"),
    ("config garbage", lambda f: (f / "config.json").write_bytes(b"\xff{garbage"),
     "config.json is not readable JSON"),
    ("config a list", lambda f: (f / "config.json").write_text("[1]"),
     "is not a model config"),
    ("config missing", lambda f: (f / "config.json").unlink(), "holds no config.json"),
    ("torch weights garbage", as_bin, "pytorch_model.bin is not a readable torch file"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "damage", "says"), INIT_FROM, ids=[c[0] for c in INIT_FROM])
def test_init_from_a_damaged_folder_is_one_line(exported, tmp_path, case, damage, says):
    from launcher.preflight import init_from_problem

    folder = tmp_path / "weights"
    shutil.copytree(exported, folder)
    damage(folder)
    problem = init_from_problem(str(folder))
    if says is None:
        assert problem is None
        return
    assert problem is not None and "\n" not in problem and says in problem, problem
    assert problem.startswith(f"model.init_from={folder}: ")
    assert "python -m launcher.export" in problem


def native_run(tmp_path: Path) -> Path:
    """A run directory with two complete checkpoints of a native GPT-2 (steps 2 and 4)."""
    import torch

    from launcher.model.build import build_model

    model = build_model(compose(["model.impl=native"]).model, 256)
    meta = {"model": {"impl": "native", "n_head": model.config.n_head}}
    writer = checkpoint.CheckpointWriter(
        tmp_path / "run" / "checkpoints", is_main=True, barrier=lambda: None, keep=3, meta=meta
    )
    for step in (2, 4):
        writer.save(step, lambda f: torch.save(model.state_dict(), f / "model.pt"), {})
    return tmp_path / "run"


def test_export_skips_an_unreadable_newest_checkpoint_with_one_warning(tmp_path, capsys):
    from launcher.export import main as export_main

    run = native_run(tmp_path)
    newest = run / "checkpoints" / "step_00000004" / "model.pt"
    newest.write_bytes(b"\0" * newest.stat().st_size)  # garbage of the right size: "complete"
    assert export_main([str(run), str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    warnings = [ln for ln in captured.err.splitlines() if "warning" in ln.lower()]
    assert len(warnings) == 1 and warnings[0].startswith("warning: checkpoint ")
    assert "step_00000004 is unreadable" in warnings[0] and "falling back" in warnings[0]
    assert "exported " in captured.out and "step_00000002" in captured.out
    assert (tmp_path / "out" / "model.safetensors").is_file()

    older = run / "checkpoints" / "step_00000002" / "model.pt"
    older.write_bytes(b"\0" * older.stat().st_size)
    assert export_main([str(run), str(tmp_path / "out2")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("error: no checkpoint of ") and "could be read" in lines[-1]
    assert "Traceback" not in "\n".join(lines) and not (tmp_path / "out2").exists()


@pytest.mark.parametrize(
    ("dtype", "bad_id", "at", "in_val"),
    [("uint16", 997, 12_345, False), ("uint16", 65_535, 0, True), ("int32", -1, 19_999, False),
     ("uint32", 50_257, 7, True)],
)  # fmt: skip
def test_memmap_ids_outside_the_vocabulary_are_one_line_naming_the_file(
    tmp_path, dtype, bad_id, at, in_val
):
    from omegaconf import OmegaConf

    from launcher.config.schema import DataConfig
    from launcher.data.prepare import prepare_data

    tokens = (np.arange(20_000) % 997).astype(dtype)
    (tmp_path / "train.bin").write_bytes(tokens.tobytes())
    bad = tokens.copy()
    bad[at] = bad_id
    damaged = tmp_path / ("val.bin" if in_val else "train.bin")
    damaged.write_bytes(bad.tobytes())
    cfg = OmegaConf.structured(DataConfig)
    cfg.source, cfg.dtype, cfg.vocab_size = "memmap", dtype, 997
    cfg.paths = [str(tmp_path / "train.bin")]
    cfg.val_paths = [str(tmp_path / "val.bin")] if in_val else []
    with pytest.raises(ValueError) as refused:
        prepare_data(cfg, seq_len=99, seed=0, is_builder=True, wait=lambda: None)
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"{damaged}: token id {bad_id} at position {at:,}")
    assert "data.vocab_size=997: ids 0-996" in line and "data.dtype" in line
