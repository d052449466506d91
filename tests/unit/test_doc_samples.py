"""The docs' sample outputs have the shape of what the commands print today (issue 53: the
quickstart's sample was older than the code). A sample is a fenced block right after a
`<!-- sample: NAME -->` line; `SAMPLES[NAME]` prints the same thing from the code that
prints it for real (the console's progress line and closing block, `launcher.runs`, the
one-line refusals), on run directories written here. Both are reduced to their shape (times,
numbers, run ids and paths as placeholders) and must match line for line: a column, a field
or a line added, dropped or reworded fails here until the sample is regenerated from a run.
"""

from __future__ import annotations

import json
import logging
import re

import pytest

from launcher import runs
from launcher.config import ConfigError, compose
from launcher.observe.sinks import closing_block, progress_line
from launcher.runtime.process import LOG_FORMAT
from launcher.train.next_steps import next_commands

from paths import REPO
from run_dir_tools import finished_run_dir

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MARKED = re.compile(r"^<!-- sample: ([\w-]+) -->\n```[\w]*\n(.*?)^```", re.S | re.M)
RUN_ID = "20261205-160738-3f2a9c1d"
CONSOLE = logging.Formatter(LOG_FORMAT.format(rank=0), "%H:%M:%S")


def console(message: str, logger: str = "launcher") -> str:
    """`message` as rank 0's console shows it (the runtime's own format)."""
    record = logging.LogRecord(logger, logging.INFO, __file__, 0, message, None, None)
    return CONSOLE.format(record)


def record(step: int, **extra) -> dict:
    """An interval record of a 2-rank DDP run (the default job), as the recorder logs it."""
    return {"step": step, "loss": 6.17, "tokens_per_s": 10575.0, "step_time_s/p50": 0.1889,
            "step_time_s/p90": 0.2012, "step_time_s/slowest_rank": 1, "comm/allreduce_s": 0.0123,
            "comm/exposed_s": 0.0123, "comm/overhead_frac": 0.097, "mfu": None,
            "eta_s": (200 - step) * 0.19, **extra}  # fmt: skip


def progress(tmp_path) -> str:
    last = record(200, **{"eval/loss": 6.3277, "eval/ppl": 559.9})
    return "\n".join(console(progress_line(r, 200, world_size=2)) for r in (record(190), last))


def default_run(tmp_path):
    """The default job's run directory as it ends: a checkpoint and the tokenizer."""
    run = finished_run_dir(tmp_path / "runs" / RUN_ID, loss0=7.0, lr=1e-3)
    step = run / "checkpoints" / "step_00000200"
    step.mkdir(parents=True)
    (step / "model.pt").write_bytes(b"m")
    (step / "meta.json").write_text(json.dumps({"step": 200, "files": {"model.pt": 1}}))
    (run / "tokenizer").mkdir()
    (run / "tokenizer" / "tokenizer.json").write_text("{}")
    return run


def closing(tmp_path) -> str:
    run = default_run(tmp_path)
    summary = {**json.loads((run / "summary.json").read_text()), "steps": 200}
    shown = run.relative_to(tmp_path)
    block = closing_block(shown, summary, next_commands(run, summary))
    block = block.replace(str(run), str(shown))
    first, *rest = block.splitlines()
    return "\n".join([console(first), *rest])


def runs_list(tmp_path, capsys) -> str:
    default_run(tmp_path)
    finished_run_dir(tmp_path / "runs" / "20261205-161502-77b0e1aa", loss0=6.0, lr=3e-3)
    assert runs.main([str(tmp_path / "runs")]) == 0
    return capsys.readouterr().out


def refusal(*overrides: str):
    def said(tmp_path) -> str:
        with pytest.raises(ConfigError) as refused:
            compose(list(overrides))
        return f"error: {refused.value}"

    return said


SAMPLES = {
    "progress": progress,
    "closing-block": closing,
    "runs-list": runs_list,
    "misspelt-key": refusal("trainer.max_stpes=3"),
    "exp-without-plus": refusal("exp=profile"),
}


def shape(text: str) -> list[str]:
    """`text` with what changes from run to run replaced: clock times, run ids and the paths
    holding them, durations (a wall time under a minute is `59.2 s`, above `1:15`), numbers
    (with their thousands commas and decimals); a `$ ` command line of the sample is not
    output and is dropped."""
    lines = []
    for line in text.rstrip("\n").splitlines():
        if line.startswith("$ "):
            continue
        line = re.sub(r"^\d{2}:\d{2}:\d{2}\b", "T", line)  # the console's clock
        line = re.sub(r"\S*\d{8}-\d{6}-[0-9a-f]{8}", "RUN", line)
        line = re.sub(r"\b\d+(:\d\d){1,2}\b|\b\d+(\.\d+)? s\b", "D", line)  # 1:15, 59.2 s
        line = re.sub(r"\d+(,\d{3})*(\.\d+)?", "9", line)
        lines.append(re.sub(r"\s+", " ", line).strip())
    return lines


def marked() -> list[tuple[str, str, str]]:
    """(file, sample name, sample text) of every marked sample in the docs."""
    return [
        (doc.relative_to(REPO).as_posix(), name, text)
        for doc in DOCS
        for name, text in MARKED.findall(doc.read_text())
    ]


def test_every_marked_sample_has_a_generator_and_every_generator_a_sample():
    names = [name for _, name, _ in marked()]
    assert sorted(set(names) - set(SAMPLES)) == []
    assert sorted(set(SAMPLES) - set(names)) == []


@pytest.mark.parametrize(
    ("doc", "name", "text"), marked(), ids=[f"{d}:{n}" for d, n, _ in marked()]
)
def test_a_documented_sample_has_the_shape_of_what_the_code_prints(doc, name, text, tmp_path,
                                                                   capsys):  # fmt: skip
    generate = SAMPLES[name]
    printed = generate(tmp_path, capsys) if name == "runs-list" else generate(tmp_path)
    assert shape(text) == shape(printed), f"{doc}: regenerate the {name} sample:\n{printed}"


def test_shape_keeps_the_words_and_drops_the_figures():
    sample = (
        "16:08:37 [rank 0] INFO launcher: run runs/20261205-160738-3f2a9c1d: completed, "
        "200 steps in 59.2 s wall time\n$ cmd\n  loss 6.0085, tokens/s 10,320"
    )
    assert shape(sample) == [
        "T [rank 9] INFO launcher: run RUN: completed, 9 steps in D wall time",
        "loss 9, tokens/s 9",
    ]  # fmt: skip
    assert shape("step 9 ms") != shape("step 9 ms | eta 0:01")
    assert shape("in 1:15 wall time") == shape("in 59.2 s wall time") == ["in D wall time"]
