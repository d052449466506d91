"""`python -m launcher.generate` under bad input, in-process: every flag's bad values and
every file it reads (a run's checkpoint and tokenizer, an export's config.json,
model.safetensors and tokenizer.json) in every wrong form, each refused in one line naming
the flag or the file, exit 2, no traceback, nothing changed; and the text streamed as it is
drawn, at most the model's context long."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from refusals import refusal

from launcher import generate
from launcher.checkpoint import protocol as checkpoint
from launcher.checkpoint.export import export
from launcher.config import compose
from launcher.data.bpe import train_bpe
from launcher.data.tokenizer import TOKENIZER_DIR, save_for_transformers
from launcher.model.build import build_model

from run_dir_tools import digest

CONTEXT = 32  # model.n_positions of the test model: --max-tokens is bounded by it
VOCAB = 320  # a multiple of 64, as the launcher pads it
TEXT = ["def f(x):\n    return x + 1\n", "class A:\n    pass\n", "import os, sys\n"] * 20


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    """A run directory of a tiny native GPT-2 (one checkpoint, its tokenizer) and its export."""
    base = tmp_path_factory.mktemp("generate")
    run = base / "run"
    cfg = compose(["model.impl=native", f"model.n_positions={CONTEXT}"])
    torch.manual_seed(0)
    model = build_model(cfg.model, VOCAB)
    meta = {"model": {"impl": "native", "n_head": model.config.n_head}}
    writer = checkpoint.CheckpointWriter(
        run / "checkpoints", is_main=True, barrier=lambda: None, keep=1, meta=meta
    )
    writer.save(4, lambda f: torch.save(model.state_dict(), f / "model.pt"), {})
    save_for_transformers(train_bpe(TEXT, VOCAB), None, run / TOKENIZER_DIR)
    export(run, base / "export")
    return {"run": run, "export": base / "export"}


def one_line(capsys, argv: list[str]) -> str:
    return refusal(capsys, lambda: generate.main(argv))


FLAGS = [
    (["--temperature", "nan"], "argument --temperature: nan: must be a finite number of 0 or more"),
    (["--temperature", "inf"], "argument --temperature: inf: must be a finite number"),
    (["--temperature", "-1"], "argument --temperature: -1: must be a finite number of 0 or more"),
    (["--temperature", "hot"], "argument --temperature: 'hot' is not a number"),
    (["--top-k", "-3"], "argument --top-k: -3: must be at least 0 (0: every token)"),
    (["--top-k", "2.5"], "argument --top-k: '2.5' is not a whole number"),
    (["--max-tokens", "0"], "argument --max-tokens: 0: must be at least 1"),
    (["--max-tokens", "100000000"],
     f"argument --max-tokens: 100000000: more than the model's context of {CONTEXT} tokens"),
    (["--max-tokens", str(CONTEXT + 1)], f"give at most {CONTEXT}"),
    (["--samples", "0"], "argument --samples: 0: must be at least 1"),
    (["--seed", "-1"], "argument --seed: -1: must be within 0..9223372036854775807"),
    (["--seed", str(2**64)], "argument --seed: 18446744073709551616: must be within"),
    (["--prompt", ""], "--prompt encodes to no tokens; give some text"),
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
]  # fmt: skip


@pytest.mark.parametrize("source", ["run", "export"])
@pytest.mark.parametrize(("flags", "words"), FLAGS, ids=[" ".join(f) for f, _ in FLAGS])
def test_every_bad_flag_is_one_line(sources, capsys, source, flags, words):
    argv = [str(sources[source]), "--prompt", "def ", *flags]
    assert words in one_line(capsys, argv)


def test_a_missing_prompt_is_one_line(sources, capsys):
    line = one_line(capsys, [str(sources["run"])])
    assert "the following arguments are required: --prompt" in line


def cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def pad(path: Path) -> None:
    path.write_bytes(path.read_bytes() + b"\0" * 16)


def garbage(path: Path) -> None:
    path.write_bytes(b"\xff\x00garbage" * 8)


def same_size_garbage(path: Path) -> None:
    """Complete by its size (what meta.json records), unreadable by its bytes."""
    path.write_bytes(b"\0" * path.stat().st_size)


def empty(path: Path) -> None:
    path.write_bytes(b"")


def folder_in_its_place(path: Path) -> None:
    path.unlink()
    path.mkdir()


def gone(path: Path) -> None:
    path.unlink()


def wrong_json(text: str):
    return lambda path: path.write_text(text)


def bigger_tokenizer(path: Path) -> None:
    """A readable tokenizer of another model: more tokens than this model has."""
    from tokenizers import Tokenizer

    other = train_bpe(TEXT, VOCAB)
    other.add_tokens([f"<extra{i}>" for i in range(64)])
    Tokenizer.save(other, str(path))


# (which source, which file in it, the damage, words of the line). Each file of each source
# in each wrong form: truncated, padded, garbage, empty, a folder in its place, gone, JSON of
# the wrong shape, another model's.
TOKENIZER = f"{TOKENIZER_DIR}/tokenizer.json"
DAMAGE = [
    ("run", TOKENIZER, garbage, "tokenizer.json is not a readable tokenizer"),
    ("run", TOKENIZER, cut, "tokenizer.json is not a readable tokenizer"),
    ("run", TOKENIZER, empty, "tokenizer.json is not a readable tokenizer"),
    ("run", TOKENIZER, wrong_json("[]"), "is not a readable tokenizer"),
    ("run", TOKENIZER, bigger_tokenizer, "more than the model's 320"),
    ("run", TOKENIZER, folder_in_its_place, "no tokenizer.json saved"),
    ("run", TOKENIZER, gone, "no tokenizer.json saved with this model"),
    ("run", "checkpoints/step_00000004/model.pt", same_size_garbage, "no checkpoint of"),
    ("run", "checkpoints/step_00000004/model.pt", garbage, "holds no complete checkpoint"),
    ("run", "checkpoints/step_00000004/model.pt", cut, "holds no complete checkpoint"),
    ("run", "checkpoints/step_00000004/meta.json", garbage, "holds no complete checkpoint"),
    ("run", "checkpoints/step_00000004/meta.json", wrong_json('{"step": 4}'),
     "holds no complete checkpoint"),
    ("run", "checkpoints/latest", garbage, ""),  # the pointer is a hint: the folders decide
    ("export", "config.json", garbage, "config.json is not readable JSON"),
    ("export", "config.json", empty, "config.json is not readable JSON"),
    ("export", "config.json", wrong_json("[1]"), "config.json is not a model config"),
    ("export", "config.json", wrong_json('{"model_type": "gpt2", "n_embd": "wide"}'),
     "not a loadable GPT-2 export"),
    ("export", "config.json", wrong_json('{"model_type": "bert"}'), "not a loadable GPT-2"),
    ("export", "config.json", folder_in_its_place, "holds no config.json"),
    ("export", "config.json", gone, "holds no config.json"),
    ("export", "model.safetensors", cut, "model.safetensors is "),
    ("export", "model.safetensors", pad, "(truncated or padded)"),
    ("export", "model.safetensors", garbage, "model.safetensors is not a readable safetensors"),
    ("export", "model.safetensors", empty, "model.safetensors is not a readable safetensors"),
    ("export", "model.safetensors", gone, "holds no model.safetensors or pytorch_model.bin"),
    ("export", "model.safetensors", folder_in_its_place, "holds no model.safetensors or"),
    ("export", "tokenizer.json", garbage, "tokenizer.json is not a readable tokenizer"),
    ("export", "tokenizer.json", cut, "tokenizer.json is not a readable tokenizer"),
    ("export", "tokenizer.json", bigger_tokenizer, "more than the model's 320"),
    ("export", "tokenizer.json", gone, "no tokenizer.json saved with this model"),
]  # fmt: skip


DAMAGE_IDS = [f"{s}-{n.split('/')[-1]}-{d.__name__}" for s, n, d, _ in DAMAGE]


@pytest.mark.parametrize(("source", "name", "damage", "words"), DAMAGE, ids=DAMAGE_IDS)
def test_every_damaged_file_is_one_line(sources, tmp_path, capsys, source, name, damage, words):
    folder = tmp_path / source
    shutil.copytree(sources[source], folder)
    damage(folder / name)
    before = digest(folder)
    argv = [str(folder), "--prompt", "def ", "--max-tokens", "4"]
    if not words:  # damage the launcher tolerates: the run still samples
        assert generate.main(argv) == 0
        return
    line = one_line(capsys, argv)
    assert words in line and str(folder) in line, line
    assert digest(folder) == before  # generate reads; it changes nothing


@pytest.mark.parametrize("source", ["nowhere", "a file", "an empty folder"])
def test_a_source_that_is_no_model_is_one_line(tmp_path, capsys, source):
    path = tmp_path / "x"
    if source == "a file":
        path.write_text("not a run")
    elif source == "an empty folder":
        path.mkdir()
    line = one_line(capsys, [str(path), "--prompt", "def "])
    assert str(path) in line


def test_the_text_is_streamed_as_it_is_drawn():
    """Each token's text is written before the next is drawn; a character split over two
    tokens (its first half decodes to U+FFFD) waits for its second."""
    table = {(1,): "a", (1, 2): "a\ufffd", (1, 2, 3): "aé", (1, 2, 3, 4): "aé!"}
    events: list[str] = []

    def drawn():
        for token in (1, 2, 3, 4):
            events.append(f"draw {token}")
            yield token

    text = generate.stream(drawn(), lambda ids: table[tuple(ids)], lambda t: events.append(t))
    assert text == "aé!"
    assert events == ["draw 1", "a", "draw 2", "draw 3", "é", "draw 4", "!", ""]


def test_the_context_is_the_bound_and_a_sample_fills_it(sources, capsys):
    """--max-tokens equal to the model's context is sampled whole; greedy output from the
    run and from its export is the same text."""
    outs = []
    for source in ("run", "export"):
        argv = [str(sources[source]), "--prompt", "def ", "--max-tokens", str(CONTEXT)]
        assert generate.main([*argv, "--temperature", "0"]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and outs[0].startswith("def ")
