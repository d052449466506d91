"""`python -m launcher.export` under bad input, in-process: its arguments, every file of the
run it reads (each checkpoint's weights and meta.json, the latest pointer, the tokenizer)
and the folder it writes, each in its wrong forms: one line naming the file or folder, exit
2, no traceback, nothing of the run changed and no half an export left; and a good export
as readable as its run directory (run.access)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from refusals import refusal

from launcher.checkpoint import protocol as checkpoint
from launcher.config import compose
from launcher.data.bpe import train_bpe
from launcher.data.tokenizer import TOKENIZER_DIR, save_for_transformers
from launcher.export import main as export_main
from launcher.model.build import build_model

from run_dir_tools import digest

STEP = "checkpoints/step_00000004"


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A private run directory of a tiny native GPT-2: checkpoints at steps 2 and 4, and
    its tokenizer."""
    run = tmp_path_factory.mktemp("export") / "run"
    torch.manual_seed(0)
    model = build_model(compose(["model.impl=native", "model.n_positions=32"]).model, 320)
    meta = {"model": {"impl": "native", "n_head": model.config.n_head}}
    writer = checkpoint.CheckpointWriter(
        run / "checkpoints", is_main=True, barrier=lambda: None, keep=2, meta=meta
    )
    for step in (2, 4):
        writer.save(step, lambda f: torch.save(model.state_dict(), f / "model.pt"), {})
    save_for_transformers(train_bpe(["def f(x): return x\n"] * 20, 320), None, run / TOKENIZER_DIR)
    run.chmod(0o700)
    return run


def one_line(capsys, argv: list[str]) -> str:
    return refusal(capsys, lambda: export_main(argv))


FLAGS = [
    ([], "the following arguments are required: source, out"),
    (["RUN"], "the following arguments are required: out"),
    (["RUN", "OUT", "--bogus"], "unrecognized arguments: --bogus"),
    (["RUN", "OUT", "extra"], "unrecognized arguments: extra"),
]


@pytest.mark.parametrize(("argv", "words"), FLAGS, ids=[" ".join(a) or "none" for a, _ in FLAGS])
def test_a_bad_argument_is_one_line(finished, tmp_path, capsys, argv, words):
    argv = [{"RUN": str(finished), "OUT": str(tmp_path / "out")}.get(a, a) for a in argv]
    assert words in one_line(capsys, argv)
    assert not (tmp_path / "out").exists()


def same_size_garbage(path: Path) -> None:
    path.write_bytes(b"\0" * path.stat().st_size)


def garbage(path: Path) -> None:
    path.write_bytes(b"\xff\x00garbage")


def folder_in_its_place(path: Path) -> None:
    path.unlink()
    path.mkdir()


def without_the_model(path: Path) -> None:
    """meta.json as an older launcher wrote it: no model shape."""
    meta = json.loads(path.read_text())
    del meta["model"]
    path.write_text(json.dumps(meta))


def both_steps(damage):
    """The damage done to both checkpoints' file of that name: nothing left to fall back to."""

    def both(path: Path) -> None:
        for step in path.parent.parent.glob("step_*"):
            damage(step / path.name)

    both.__name__ = f"both_{damage.__name__}"
    return both


# (the file, the damage, words of the line). One checkpoint damaged: the export falls back
# to the older one, with one warning line; both: one error line.
RUN_DAMAGE = [
    (f"{STEP}/model.pt", both_steps(same_size_garbage), "could be read"),
    (f"{STEP}/model.pt", both_steps(garbage), "holds no complete checkpoint"),
    (f"{STEP}/model.pt", both_steps(folder_in_its_place), "holds no complete checkpoint"),
    (f"{STEP}/meta.json", both_steps(garbage), "holds no complete checkpoint"),
    (f"{STEP}/meta.json", both_steps(without_the_model), "does not record model.n_head"),
    ("checkpoints", lambda p: shutil.rmtree(p), "holds no complete checkpoint"),
]  # fmt: skip
IDS = [f"{n.split('/')[-1]}-{d.__name__}" for n, d, _ in RUN_DAMAGE]


@pytest.mark.parametrize(("name", "damage", "words"), RUN_DAMAGE, ids=IDS)
def test_a_damaged_run_is_one_line_and_nothing_changes(
    finished, tmp_path, capsys, name, damage, words
):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    damage(run / name)
    before = digest(run)
    line = one_line(capsys, [str(run), str(tmp_path / "out")])
    assert words in line and str(run) in line, line
    assert digest(run) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no (half an) export


def test_one_damaged_checkpoint_falls_back_with_one_warning(finished, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    same_size_garbage(run / STEP / "model.pt")
    assert export_main([str(run), str(tmp_path / "out")]) == 0
    warnings = capsys.readouterr().err.strip().splitlines()
    assert len(warnings) == 1 and "falling back to the previous one" in warnings[0]


OUT_FORMS = [
    ("a file", lambda out: out.write_text("mine"), "exists and is not an empty folder"),
    ("not empty", lambda out: (out.mkdir(), (out / "keep").write_text("mine")),
     "exists and is not an empty folder"),
    ("under a file", lambda out: out.parent.joinpath("f").write_text("mine"),
     "is not a writable directory"),
]  # fmt: skip


@pytest.mark.parametrize(("form", "make", "words"), OUT_FORMS, ids=[f for f, _, _ in OUT_FORMS])
def test_an_out_dir_in_a_wrong_form_is_one_line_and_kept(
    finished, tmp_path, capsys, form, make, words
):
    out = tmp_path / "out"
    make(out)
    target = tmp_path / "f" / "out" if form == "under a file" else out
    before = digest(tmp_path)
    assert words in one_line(capsys, [str(finished), str(target)])
    assert digest(tmp_path) == before  # what was there is kept, byte for byte


@pytest.mark.parametrize("mode", [0o700, 0o750, 0o755])
def test_an_export_is_as_readable_as_its_run_directory(finished, tmp_path, capsys, mode):
    """From the run directory or from one of its checkpoints: the run's mode on the folder,
    without the execute bits on the files (safetensors alone would write 0600)."""
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    run.chmod(mode)
    for source, out in ((run, tmp_path / "a"), (run / STEP, tmp_path / "b")):
        assert export_main([str(source), str(out)]) == 0
        assert out.stat().st_mode & 0o777 == mode
        files = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
        assert "model.safetensors" in files and "tokenizer.json" in files
        assert set(files.values()) == {mode & 0o666}, files
    capsys.readouterr()
