"""What a run directory can hold, damaged every way, against the resume decision (in-process).

Every file and folder a run directory can hold x missing, empty, truncated, garbage
bytes, wrong type: each resume either falls back with one warning naming the thing and
why, or refuses with one line; never a traceback, and the good checkpoint's bytes never
change. Also: the compatibility check, retention, the lock, metrics.jsonl on resume.
What needs real ranks is in tests/launches/test_resume_launch.py.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
from pathlib import Path

import pytest

from launcher.checkpoint import protocol as checkpoint
from launcher.checkpoint import resume
from launcher.config import ConfigError
from launcher.observe.sinks import JsonlSink
from launcher.runtime import lock
from launcher.strategy.deepspeed import universal as ds_universal

from run_dir_tools import garbage, write_lock

DDP2 = {
    "model": {
        "name": "gpt2-tiny",
        "n_layer": 2,
        "n_head": 2,
        "n_embd": 64,
        "n_positions": 256,
        "vocab_size": 512,
    },
    "strategy": {"name": "ddp"},
    "world_size": 2,
}


ZERO2 = {**DDP2, "strategy": {"name": "deepspeed", "zero_stage": 2, "precision": "fp32"}}


FSDP2 = {**DDP2, "strategy": {"name": "fsdp2"}}


LINEAGE = "abc123"


def write_checkpoint(folder: Path, step: int, ident=DDP2, lineage=LINEAGE, ranks=2) -> Path:
    """A checkpoint folder as the writer leaves it (file contents are stand-ins)."""
    path = folder / checkpoint.step_name(step)
    path.mkdir(parents=True)
    names = ["model.pt", "optimizer.pt", *(f"rng_rank{r}.pt" for r in range(ranks))]
    for name in names:
        (path / name).write_bytes(os.urandom(64 + step))
    files = {n: (path / n).stat().st_size for n in names}
    meta = {"step": step, "files": files, **ident, "lineage": lineage}
    (path / checkpoint.META).write_text(json.dumps(meta))
    (folder / checkpoint.LATEST).write_text(path.name + "\n")  # as the writer moves it
    return path


@pytest.fixture
def run_dir(tmp_path) -> Path:
    """A run of 40 steps: checkpoints at 20 and 40, latest naming 40, its run files."""
    run = tmp_path / "run"
    ckpts = run / "checkpoints"
    write_checkpoint(ckpts, 20)
    write_checkpoint(ckpts, 40)
    (run / "logs").mkdir()
    (run / "logs" / "rank0.log").write_text("earlier launch\n")
    (run / "config.yaml").write_text("model: {}\n")
    (run / "env.json").write_text("{}")
    (run / "summary.json").write_text('{"status": "completed"}')
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2)))
    return run


def digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha1(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def decide(run: Path, caplog, resume_value="auto", now=DDP2):
    """The plan's choice (step numbers) and the warnings it logged."""
    caplog.clear()
    with caplog.at_level(logging.INFO):
        found = resume.plan(resume_value, run, now).candidates
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    return [checkpoint.step_of(Path(p)) for p in found], warnings


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: max(1, path.stat().st_size // 2)])


def make_folder(path: Path) -> None:
    path.unlink()
    path.mkdir()
    (path / "x").write_text("x")


S40 = "checkpoints/step_00000040"


# (what is damaged, how) -> (steps tried in order, text of the one warning, or None for none)
FALLBACKS = [
    ("checkpoints/latest", "missing", lambda p: p.unlink(), [40, 20], "latest is missing"),
    ("checkpoints/latest", "empty", lambda p: p.write_text(""), [40, 20], "holds ''"),
    ("checkpoints/latest", "truncated", lambda p: p.write_text("step_000"), [40, 20], "step_000"),
    ("checkpoints/latest", "garbage", garbage, [40, 20], "latest is unreadable"),
    ("checkpoints/latest", "older", lambda p: p.write_text("step_00000020"), [40, 20], None),
    (f"{S40}/meta.json", "missing", lambda p: p.unlink(), [20], "no meta.json"),
    (f"{S40}/meta.json", "empty", lambda p: p.write_text(""), [20], "meta.json is unreadable"),
    (f"{S40}/meta.json", "truncated", truncate, [20], "meta.json is unreadable"),
    (f"{S40}/meta.json", "garbage", garbage, [20], "meta.json is unreadable"),
    (f"{S40}/meta.json", "a list", lambda p: p.write_text("[1]"), [20], "meta.json is unread"),
    (f"{S40}/meta.json", "a folder", make_folder, [20], "meta.json is unreadable"),
    (f"{S40}/model.pt", "missing", lambda p: p.unlink(), [20], "model.pt is missing"),
    (f"{S40}/model.pt", "empty", lambda p: p.write_bytes(b""), [20], "model.pt has 0 bytes"),
    (f"{S40}/model.pt", "truncated", truncate, [20], "model.pt has 52 bytes, meta.json says 104"),
    (f"{S40}/model.pt", "a folder", make_folder, [20], "model.pt is not a file"),
    (f"{S40}/rng_rank1.pt", "missing", lambda p: p.unlink(), [20], "rng_rank1.pt is missing"),
    (f"{S40}/rng_rank1.pt", "truncated", truncate, [20], "rng_rank1.pt has"),
    (f"{S40}/optimizer.pt", "missing", lambda p: p.unlink(), [20], "optimizer.pt is missing"),
    (S40, "a file", lambda p: (shutil.rmtree(p), p.write_text("x")), [20], "not a folder"),
    (S40, "empty folder", lambda p: (shutil.rmtree(p), p.mkdir()), [20], "no meta.json"),
    # A full-size file of garbage is complete by sizes: the load finds it out (launch test).
    (f"{S40}/model.pt", "garbage, full size", lambda p: p.write_bytes(b"\0" * 104), [40, 20], None),
    # Stray entries and leftovers: nothing skipped, so no warning; leftovers are removed.
    ("checkpoints/step_00000040.bak", "stray folder", lambda p: p.mkdir(), [40, 20], None),
    ("checkpoints/step_", "stray file", lambda p: p.write_text("x"), [40, 20], None),
    ("checkpoints/notes.txt", "stray file", lambda p: p.write_text("x"), [40, 20], None),
    ("checkpoints/step_00000060", "stray folder", lambda p: p.mkdir(), [40, 20], "step_00000060"),
    # A save's folder that cannot be verified (no intent, no markers) is kept, moved aside.
    ("checkpoints/.tmp-step_00000060", "leftover", lambda p: p.mkdir(), [40, 20], "unsealed"),
    ("checkpoints/.latest.tmp", "leftover", lambda p: p.write_text("st"), [40, 20], None),
    # Files the launch rewrites or truncates: their content does not matter to the decision.
    ("metrics.jsonl", "garbage", garbage, [40, 20], None),
    ("metrics.jsonl", "missing", lambda p: p.unlink(), [40, 20], None),
    ("summary.json", "garbage", garbage, [40, 20], None),
    ("config.yaml", "garbage", garbage, [40, 20], None),
    ("env.json", "empty", lambda p: p.write_text(""), [40, 20], None),
    ("logs", "missing", shutil.rmtree, [40, 20], None),
]


@pytest.mark.parametrize(
    ("where", "how", "damage", "tried", "warning"),
    FALLBACKS,
    ids=[f"{w} {h}" for w, h, *_ in FALLBACKS],
)
def test_damage_falls_back_with_one_warning(run_dir, caplog, where, how, damage, tried, warning):
    damage(run_dir / where)
    good = digest(run_dir / "checkpoints" / "step_00000020")
    steps, warnings = decide(run_dir, caplog)
    assert steps == tried
    if warning is None:
        assert warnings == []
    else:
        assert len(warnings) == 1, warnings
        assert warning in warnings[0], warnings[0]
        if "step_" in where:
            assert Path(where).parts[1] in warnings[0]  # names the thing it skipped
    assert digest(run_dir / "checkpoints" / "step_00000020") == good
    left = [p.name for p in (run_dir / "checkpoints").iterdir()]
    assert not [n for n in left if n.startswith((".tmp-", ".latest.tmp"))]
    if how == "leftover":  # one log line says so
        assert "interrupted checkpoint save" in caplog.text or "unsealed" in caplog.text


REFUSALS = [
    (
        "checkpoints/latest",
        "a folder",
        lambda p: (p.unlink(), p.mkdir()),
        "latest is a folder, where",
    ),
    ("metrics.jsonl", "a folder", lambda p: (p.unlink(), p.mkdir()), "metrics.jsonl is a folder"),
    ("summary.json", "a folder", lambda p: (p.unlink(), p.mkdir()), "summary.json is a folder"),
    ("config.yaml", "a folder", lambda p: (p.unlink(), p.mkdir()), "config.yaml is a folder"),
    ("env.json", "a folder", lambda p: (p.unlink(), p.mkdir()), "env.json is a folder"),
    ("logs", "a file", lambda p: (shutil.rmtree(p), p.write_text("x")), "logs is a file, where"),
]


@pytest.mark.parametrize(
    ("where", "how", "damage", "message"), REFUSALS, ids=[f"{w} {h}" for w, h, *_ in REFUSALS]
)
def test_wrong_type_refuses_with_one_line(run_dir, caplog, where, how, damage, message):
    damage(run_dir / where)
    before = digest(run_dir)
    with pytest.raises(ConfigError) as refused:
        decide(run_dir, caplog)
    line = str(refused.value)
    assert message in line and "\n" not in line and "move it out" in line
    assert digest(run_dir) == before


def test_no_complete_checkpoint_left_refuses_rather_than_start_over(run_dir, caplog):
    for step in (20, 40):
        (run_dir / "checkpoints" / checkpoint.step_name(step) / "model.pt").unlink()
    before = digest(run_dir)
    with pytest.raises(ConfigError, match="holds checkpoints but none is complete") as refused:
        decide(run_dir, caplog)
    assert "model.pt is missing" in str(refused.value)
    assert "resume=archive" in str(refused.value) and "new run.id" in str(refused.value)
    assert digest(run_dir) == before


def test_checkpoints_folder_a_file_refuses(tmp_path, caplog):
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints").write_text("x")
    with pytest.raises(ConfigError, match="checkpoints is a file, where the"):
        decide(run, caplog)


def test_fresh_run_directory_starts_from_scratch(tmp_path, caplog):
    assert decide(tmp_path / "new", caplog) == ([], [])
    (tmp_path / "empty" / "checkpoints").mkdir(parents=True)
    assert decide(tmp_path / "empty", caplog) == ([], [])


def ident(base=DDP2, **changes) -> dict:
    out = json.loads(json.dumps(base))
    for key, value in changes.items():
        part, _, name = key.partition("__")
        if name:
            out[part][name] = value
        else:
            out[part] = value
    return out


INCOMPATIBLE = [
    (DDP2, ident(model__n_layer=4), "model.n_layer is 2 there, 4 now", "model.n_layer=2"),
    (DDP2, ident(model__n_embd=128), "model.n_embd is 64 there, 128 now", "model.n_embd=64"),
    (
        DDP2,
        ident(model__name="gpt2", model__n_layer=12),
        "model is gpt2-tiny there, gpt2 now",
        "model=gpt2-tiny",
    ),
    (DDP2, ident(model__vocab_size=8192), "vocab_size is 512 there", "data and tokenizer"),
    (ZERO2, ident(ZERO2, strategy__precision="bf16"), "precision is fp32", "precision=fp32"),
]


@pytest.mark.parametrize(("saved", "now", "what", "fix"), INCOMPATIBLE)
def test_incompatible_checkpoint_refuses_with_what_and_how(tmp_path, caplog, saved, now, what, fix):
    run = tmp_path / "run"
    write_checkpoint(run / "checkpoints", 10, ident=saved)
    before = digest(run)
    with pytest.raises(ConfigError) as refused:
        decide(run, caplog, now=now)
    line = str(refused.value)
    assert "\n" not in line
    assert "step_00000010 cannot be resumed with these settings" in line
    assert what in line and "To resume it, run with " in line and fix in line
    assert "new run.id" in line and "resume=archive" in line  # how to start fresh
    assert digest(run) == before


@pytest.mark.parametrize(
    "now",
    [
        ident(world_size=4),  # DDP checkpoints hold the whole model: any world size
        ident(model__name="renamed"),  # the name alone, same shape
    ],
)
def test_compatible_settings_resume(tmp_path, caplog, now):
    run = tmp_path / "run"
    saved = ZERO2 if now["strategy"]["name"] == "deepspeed" else DDP2
    write_checkpoint(run / "checkpoints", 10, ident=saved)
    assert decide(run, caplog, now=now) == ([10], [])


# Every (checkpoint's strategy, launch's strategy) pair, at the same world size and at
# another: "load" (the engine loads it as saved), "convert" (DeepSpeed's universal
# checkpoint, made by ds_universal.prepare before the engine loads it), or the refusal's
# words. DDP and FSDP2 load each other at any world size (DDP's whole state sharded, DCP
# gathered or resharded); DeepSpeed converts ZeRO 1-3 to another world size, to DDP and
# FSDP2, and ZeRO-1 to ZeRO-2 and back (DeepSpeed 0.19.8's ZeRO-3 loader takes only
# ZeRO-3's conversions, and its ZeRO-1/2 loader no ZeRO-3 one); ZeRO-0 (no shards: the
# whole state in every rank's file) loads at any world size, into DeepSpeed only.
ENGINES = ("ddp", "fsdp2", "zero0", "zero1", "zero2", "zero3")


NO_DS = "strategy is {a} there, deepspeed now (DeepSpeed loads no other engine's checkpoint)"


NO_OTHER = "strategy is deepspeed there, {b} now (a ZeRO-0 checkpoint has no shards for"


STAGES = "(DeepSpeed's universal checkpoint converts ZeRO-1 <-> ZeRO-2, and any stage 1-3 to"


def strategy_of(engine: str) -> dict:
    if engine.startswith("zero"):
        return {"name": "deepspeed", "zero_stage": int(engine[4:]), "precision": "fp32"}
    return {"name": engine}


def outcome(a: str, b: str, same_world: bool) -> str:
    """What the table says for a checkpoint of engine `a` resumed by engine `b`."""
    table = {  # rows: the checkpoint's engine; columns: ENGINES; (same world, another world)
        "ddp": ["load", "load", NO_DS, NO_DS, NO_DS, NO_DS],
        "fsdp2": ["load", "load", NO_DS, NO_DS, NO_DS, NO_DS],
        "zero0": [NO_OTHER, NO_OTHER, "load", STAGES, STAGES, STAGES],
        "zero1": ["convert", "convert", STAGES, ("load", "convert"), "convert", STAGES],
        "zero2": ["convert", "convert", STAGES, "convert", ("load", "convert"), STAGES],
        "zero3": ["convert", "convert", STAGES, STAGES, STAGES, ("load", "convert")],
    }
    cell = table[a][ENGINES.index(b)]
    if isinstance(cell, tuple):
        cell = cell[0] if same_world else cell[1]
    return cell.format(a=a, b=b)


@pytest.mark.parametrize(("old_ws", "new_ws"), [(2, 2), (2, 1), (1, 2)])
@pytest.mark.parametrize("b", ENGINES)
@pytest.mark.parametrize("a", ENGINES)
def test_resume_table_every_strategy_pair_and_world_size(tmp_path, caplog, a, b, old_ws, new_ws):
    run = tmp_path / "run"
    saved = {**DDP2, "strategy": strategy_of(a), "world_size": old_ws}
    now = {**DDP2, "strategy": strategy_of(b), "world_size": new_ws}
    write_checkpoint(run / "checkpoints", 10, ident=saved)
    expected = outcome(a, b, old_ws == new_ws)
    if expected in ("load", "convert"):
        assert decide(run, caplog, now=now) == ([10], [])
        assert ds_universal.needs_conversion(saved, now) == (expected == "convert")
        return
    with pytest.raises(ConfigError) as refused:
        decide(run, caplog, now=now)
    line = str(refused.value)
    assert "\n" not in line and expected in line and "To resume it, run with " in line
    assert f"strategy={a}" in line or f"strategy.zero_stage={a[4:]}" in line


def test_checkpoint_from_before_identities_is_not_compared(tmp_path, caplog):
    run = tmp_path / "run"
    write_checkpoint(run / "checkpoints", 10, ident={"world_size": 2}, lineage=None)
    assert decide(run, caplog, now=ident(ZERO2, world_size=2)) == ([10], [])


def test_older_incompatible_fallback_is_skipped_with_a_warning(tmp_path, caplog):
    run = tmp_path / "run"
    write_checkpoint(run / "checkpoints", 10, ident=ident(model__n_layer=4))
    write_checkpoint(run / "checkpoints", 20)
    steps, warnings = decide(run, caplog)
    assert steps == [20]
    assert len(warnings) == 1 and "step_00000010 as a fallback" in warnings[0]


def test_resume_never_refuses_checkpoints_and_writes_nothing(run_dir, caplog):
    before = digest(run_dir)
    with pytest.raises(ConfigError, match="resume=never but .* already holds checkpoints"):
        decide(run_dir, caplog, "never")
    assert digest(run_dir) == before


def test_resume_path_unusable_is_an_error(run_dir, tmp_path, caplog):
    other = tmp_path / "other"
    step = write_checkpoint(other / "checkpoints", 30)
    (step / "model.pt").unlink()
    with pytest.raises(ConfigError, match="no complete checkpoint there .*model.pt is missing"):
        decide(tmp_path / "fresh", caplog, str(step))
    with pytest.raises(ConfigError, match="no complete checkpoint there"):
        decide(tmp_path / "fresh", caplog, str(tmp_path / "nowhere" / "step_00000001"))


def test_resume_path_from_another_run_into_one_with_checkpoints_refuses(run_dir, tmp_path, caplog):
    other = write_checkpoint(tmp_path / "other" / "checkpoints", 30)
    before = digest(run_dir)
    with pytest.raises(ConfigError, match="already holds checkpoints of its own"):
        decide(run_dir, caplog, str(other))
    assert digest(run_dir) == before
    assert decide(tmp_path / "fresh", caplog, str(other)) == ([30], [])


def test_resume_path_inside_the_run_rewinds(run_dir, caplog):
    step20 = run_dir / "checkpoints" / "step_00000020"
    assert decide(run_dir, caplog, str(step20)) == ([20], [])
    assert decide(run_dir, caplog, str(run_dir)) == ([40, 20], [])


def test_resume_archive_moves_the_run_aside_and_starts_fresh(run_dir, caplog):
    before = digest(run_dir)
    steps, warnings = decide(run_dir, caplog, "archive")
    assert steps == [] and len(warnings) == 1 and "resume=archive: moved" in warnings[0]
    (archived,) = (run_dir / "archive").iterdir()
    assert {
        k.removeprefix(f"archive/{archived.name}/"): v
        for k, v in digest(run_dir).items()
        if k.startswith("archive/")
    } == {k: v for k, v in before.items() if not k.startswith("logs/")}
    assert not (run_dir / "checkpoints").exists() and (run_dir / "logs" / "rank0.log").exists()


def saved_by(folder: Path, step: int, lineage: str, keep=2, adopt: Path | None = None) -> None:
    writer = checkpoint.CheckpointWriter(
        folder, is_main=True, barrier=lambda: None, keep=keep, meta={**DDP2, "lineage": lineage}
    )
    if adopt is not None:
        writer.adopt(adopt)
    writer.save(step, lambda tmp: (tmp / "model.pt").write_bytes(b"m" * step), {})


def test_retention_deletes_only_older_checkpoints_of_its_own_lineage(tmp_path):
    ckpts = tmp_path / "checkpoints"
    for step in (10, 20):
        write_checkpoint(ckpts, step, lineage="mine")
    foreign = digest(write_checkpoint(ckpts, 5, lineage="theirs"))
    ahead = digest(write_checkpoint(ckpts, 50, lineage="mine"))  # newer than the run: kept
    saved_by(ckpts, 30, "mine")
    names = sorted(p.name for p in ckpts.glob("step_*"))
    assert names == ["step_00000005", "step_00000020", "step_00000030", "step_00000050"]
    assert digest(ckpts / "step_00000005") == foreign
    assert digest(ckpts / "step_00000050") == ahead
    assert (ckpts / "latest").read_text() == "step_00000030\n"
    meta = checkpoint.read_meta(ckpts / "step_00000030")
    assert meta["lineage"] == "mine" and meta["model"] == DDP2["model"]


def test_a_checkpoint_at_the_step_being_written_is_moved_aside_not_replaced(tmp_path, caplog):
    ckpts = tmp_path / "checkpoints"
    earlier = digest(write_checkpoint(ckpts, 30, lineage="mine"))
    with caplog.at_level(logging.WARNING):
        saved_by(ckpts, 30, "mine")
    (aside,) = (ckpts / checkpoint.SUPERSEDED).iterdir()
    assert aside.name.startswith("step_00000030-") and digest(aside) == earlier
    assert "moved the earlier step_00000030" in caplog.text
    assert checkpoint.is_complete(ckpts / "step_00000030")


def test_resuming_a_legacy_checkpoint_adopts_its_line(tmp_path):
    ckpts = tmp_path / "checkpoints"
    for step in (10, 20):
        write_checkpoint(ckpts, step, ident={"world_size": 2}, lineage=None)
    saved_by(ckpts, 30, "fresh", adopt=ckpts / "step_00000020")
    assert sorted(p.name for p in ckpts.glob("step_*")) == ["step_00000020", "step_00000030"]


def test_lineage_is_kept_from_the_resumed_checkpoint(tmp_path):
    ckpts = tmp_path / "checkpoints"
    write_checkpoint(ckpts, 10, lineage="old")
    saved_by(ckpts, 20, "fresh", adopt=ckpts / "step_00000010")
    assert checkpoint.read_meta(ckpts / "step_00000020")["lineage"] == "old"


@pytest.mark.parametrize(
    "tail",
    [
        b'{"step": 4, "lo',  # half-written when the run was killed
        b"\xff\xfe\x00\x01",  # garbage bytes
        b'["not", "a", "record"]\n{"no_step": 1}\n{"step": "4"}',
    ],
    ids=["half-written line", "garbage bytes", "not records"],
)
def test_metrics_resume_drops_unreadable_lines_with_one_warning(tmp_path, caplog, tail):
    path = tmp_path / "metrics.jsonl"
    good = b"".join(json.dumps({"step": s, "loss": 1.0}).encode() + b"\n" for s in (1, 2, 3))
    path.write_bytes(good + tail)
    with caplog.at_level(logging.WARNING):
        sink = JsonlSink(path, 2)
    sink.log({"step": 3, "loss": 0.5})
    sink.close({})
    assert [json.loads(ln)["step"] for ln in path.read_text().splitlines()] == [1, 2, 3]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "metrics.jsonl: dropped" in warnings[0]


def test_metrics_resume_of_an_empty_file(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"")
    JsonlSink(path, 5).close({})
    assert path.read_text() == "" and not caplog.records


def test_lock_is_exclusive_and_released(tmp_path):
    first = lock.RunLock(tmp_path, "launch-a")
    first.acquire()
    second = lock.RunLock(tmp_path, "launch-b")
    with pytest.raises(lock.LockHeld) as held:
        second.acquire()
    message = str(held.value)
    assert f"is in use by another launch (pid {os.getpid()} on {socket.gethostname()}" in message
    assert "launch launch-a" in message and "another run.id" in message and "\n" not in message
    first.release()
    assert not (tmp_path / lock.LOCK).exists()
    second.acquire()
    second.release()
    assert [p.name for p in tmp_path.iterdir()] == []  # no temporary files left


@pytest.mark.parametrize(
    "fields",
    [{}, {"host": "elsewhere"}, {"launch_key": "mine"}],
    ids=["live pid here", "heartbeat elsewhere", "live pid here, same key"],
)
def test_live_lock_is_not_taken(tmp_path, fields):
    path = write_lock(tmp_path, **fields)
    before = path.read_bytes()
    with pytest.raises(lock.LockHeld, match="in use by another launch"):
        lock.RunLock(tmp_path, "mine").acquire()
    assert path.read_bytes() == before


def test_lock_that_is_a_folder_refuses(tmp_path):
    (tmp_path / lock.LOCK).mkdir()
    with pytest.raises(lock.LockHeld, match="is a folder"):
        lock.RunLock(tmp_path, None).acquire()


def test_unreadable_torch_files_are_found_before_any_rank_loads(tmp_path):
    import torch

    good = tmp_path / "model.pt"
    torch.save({"w": torch.ones(3)}, good)
    zeros = tmp_path / "rng_rank1.pt"
    zeros.write_bytes(b"\0" * good.stat().st_size)
    assert checkpoint.unreadable([good]) is None
    assert "rng_rank1.pt is not a readable torch file" in checkpoint.unreadable([good, zeros])
    assert checkpoint.unreadable([tmp_path / "gone.pt"]) == "gone.pt is missing"
