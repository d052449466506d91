"""The closing block offers only the commands that will work on the run (issue 53): a table
of what runs leave (traces, a checkpoint, a tokenizer) against the commands offered; each
offered command is then run on the run directory where that is cheap (analyze's refusal,
generate's and export's need of a checkpoint are the cases the issue met)."""

from __future__ import annotations

import json

import pytest

from launcher.observe.sinks import closing_block
from launcher.train.next_steps import next_commands


def make_run(run, *, traces=False, checkpoint=False, tokenizer=False):
    run.mkdir(parents=True)
    if traces:
        (run / "traces" / "rank0").mkdir(parents=True)
    if checkpoint:
        step = run / "checkpoints" / "step_00000016"
        step.mkdir(parents=True)
        (step / "model.pt").write_bytes(b"x" * 10)
        (step / "meta.json").write_text(json.dumps({"step": 16, "files": {"model.pt": 10}}))
        (run / "checkpoints" / "latest").write_text("step_00000016")
    if tokenizer:
        (run / "tokenizer").mkdir()
        (run / "tokenizer" / "tokenizer.json").write_text("{}")
    return run


NONE = "no checkpoint saved"
# (what the run left, status) -> the commands offered, by name, in order
CASES = [
    # +exp=profile: traces, no checkpoint (the run, whose `generate` failed after 38 s)
    (dict(traces=True), "completed", ["analyze", NONE]),
    # the default run: a checkpoint and its tokenizer, no traces
    (dict(checkpoint=True, tokenizer=True), "completed", ["generate", "export", "continue"]),
    # a run of token ids (data=memmap, synthetic): nothing to decode samples with
    (dict(checkpoint=True), "completed", ["export", "continue"]),
    (dict(traces=True, checkpoint=True, tokenizer=True), "completed",
     ["analyze", "generate", "export", "continue"]),
    (dict(), "completed", [NONE]),
    (dict(checkpoint=True, tokenizer=True), "stopped", ["generate", "export", "continue"]),
]  # fmt: skip


def names(lines: list[str]) -> list[str]:
    out = []
    for line in lines:
        text = line.strip().removeprefix("next: ")
        if text.startswith("python -m launcher."):
            out.append(text.split()[2].removeprefix("launcher."))
        else:
            out.append(NONE if text.startswith(NONE) else text.split(":")[0])
    return out


@pytest.mark.parametrize(("left", "status", "offered"), CASES)
def test_only_commands_that_work_are_offered(tmp_path, left, status, offered):
    run = make_run(tmp_path / "r", **left)
    summary = {"status": status, "steps": 16, "run_id": "r", "wall_time_s": 42.0}
    lines = next_commands(run, summary)
    assert names(lines) == offered
    if "continue" in offered:
        more = " trainer.max_steps=<more than 16>" if status == "completed" else ""
        assert lines[-1].endswith(f"continue: the same command with run.id=r{more}")
    block = closing_block(run, summary, lines).splitlines()
    assert block[0] == f"run {run}: {status}, 16 steps in 42.0 s wall time"
    assert block[3:] == lines and block[2] == f"  report: {run / 'report.png'}"


def test_what_is_not_offered_would_have_failed(tmp_path, capsys):
    """The commands left out of a +exp=profile run's block refuse it (exit 2), and analyze,
    left out of a run without traces, refuses that one."""
    from launcher import export, generate
    from launcher.analyze.__main__ import main as analyze

    profiled = make_run(tmp_path / "profiled", traces=True)
    assert generate.main([str(profiled), "--prompt", "def "]) == 2
    assert export.main([str(profiled), str(tmp_path / "out")]) == 2
    plain = make_run(tmp_path / "plain")
    assert analyze([str(plain)]) == 2
    assert capsys.readouterr().err.count("error:") >= 3
