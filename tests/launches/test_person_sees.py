"""What a person sees (issue 45): a failure under plain torchrun said once, and what a
finished run leaves to look at and use: report.png, runs/latest, `launcher.runs`,
`launcher.generate` from a checkpoint and from an export that transformers loads.

Two small launches (a typo, a rank that exits mid-run); the rest reads the session's
reference runs (tests/reference_runs.py) without changing them.
"""

from __future__ import annotations

import re

import pytest
from PIL import Image

from launcher import export as export_cmd
from launcher import generate, runs
from launcher.observe.sinks import wall_text

from launch import FAST_USER_LOADER, metrics, summary, torchrun
from run_dir_tools import not_blank
from tb_readback import read_runs
from wandb_readback import inspect_summary

# torchrun's own lines ("W1205 18:00:01.764000 ... Sending process ...") and, once it has
# reaped every worker, its ChildFailedError traceback: docs/faults.md explains them.
TORCHRUN_LINE = re.compile(r"^[WEI]\d{4} ")
MAX_LAUNCHER_LINES = 15


def launcher_lines(stderr: str) -> list[str]:
    """The lines the launcher and the ranks wrote: everything before torchrun reports the
    failed workers, less torchrun's own log lines."""
    lines = []
    for line in stderr.splitlines():
        if TORCHRUN_LINE.match(line) and "failed (exitcode" in line:
            break
        if not TORCHRUN_LINE.match(line):
            lines.append(line)
    return lines


def test_a_typo_under_plain_torchrun_is_one_line(tmp_path):
    proc = torchrun([f"run.root={tmp_path}", "trainer.max_stepz=3"])
    ours = launcher_lines(proc.stderr)
    assert ours == [
        "error: trainer.max_stepz: unknown key (did you mean trainer.max_steps, "
        "trainer.max_bad_steps?); check the spelling, or see docs/configuration.md"
    ], proc.stderr
    assert "cannot be cut short" not in proc.stderr  # rank 1 is quiet on torchrun's SIGTERM


def test_a_rank_that_exits_mid_run_is_the_one_cause(ddp_run, tmp_path):
    """Rank 1 exits at step 4: its line once, rank 0 one line, no traceback of the ranks on
    the terminal, at most MAX_LAUNCHER_LINES lines in all; summary.json names rank 1, its
    step and its line; runs/latest points at the run. The count is of a run whose token
    cache exists (the shared DDP run built it), as for the user's second run: building it
    says three lines more, whichever test builds it first."""
    fault = ["fault.kind=exit", "fault.rank=1", "fault.step=4", "trainer.max_steps=6"]
    proc = torchrun([*FAST_USER_LOADER, *fault, f"run.root={tmp_path}", "run.id=exits"])
    assert proc.returncode != 0
    ours = launcher_lines(proc.stderr)
    assert len(ours) <= MAX_LAUNCHER_LINES, "\n".join(ours)
    assert sum("fault.kind=exit: injecting at step 4" in line for line in ours) == 1, ours
    assert [line for line in ours if "rank 1 failed" in line] == [
        next(
            line
            for line in ours
            if line.endswith("[rank 0] WARNING launcher: stopping: rank 1 failed")
        )
    ]
    assert not [line for line in ours if "Traceback" in line or "Connection reset" in line]
    assert "received SIGTERM" not in "\n".join(ours)
    run_dir = tmp_path / "exits"
    s = summary(run_dir)
    assert s["status"] == "failed: rank 1 at step 4: exited with code 1 (fault.kind=exit)"
    assert (s["failed_rank"], s["failed_step"], s["steps"], s["exit_code"]) == (1, 4, 3, 1)
    assert (tmp_path / "latest").resolve() == run_dir.resolve()
    assert f"run {run_dir}: failed, 3 steps in " in ours[-1]
    # the secondary error is in rank 0's own log, for whoever wants it
    assert "by peer" in (run_dir / "logs" / "rank0.log").read_text()  # reset or closed


def test_a_finished_run_has_a_report_and_lists_and_compares(ddp_run, single_process, tmp_path,
                                                           capsys):  # fmt: skip
    assert not_blank(ddp_run / "report.png") > 0.05
    # the same picture, heatmaps included, in TensorBoard (at the last step) and W&B (summary)
    tb = read_runs(ddp_run / "tb")
    ((step, (width, height, _png)),) = tb["."]["images"]["report"]
    with Image.open(ddp_run / "report.png") as image:
        assert (step, (width, height)) == (24, image.size)
    (wandb_run,) = (ddp_run / "wandb").glob("offline-run-*")
    state = inspect_summary(wandb_run, tmp_path)
    assert state["summary"]["report"]["_type"] == "image-file"
    # One wall time (from the launch to the last write) in every place that shows one
    wall = summary(ddp_run)["wall_time_s"]
    loop = [r for r in metrics(ddp_run) if "elapsed_s" in r][-1]["elapsed_s"]
    assert wall > loop  # start-up and the closing writes are in it, not only the loop
    assert state["summary"]["wall_time_s"] == pytest.approx(wall, rel=1e-9)
    ((_, table),) = tb["."]["text"]["summary/text_summary"]
    assert f"| wall_time_s | {wall:.6g} |" in table
    log = (ddp_run / "logs" / "rank0.log").read_text()
    assert f"completed, 24 steps in {wall_text(wall)} wall time" in log
    ranks = (ddp_run / "ranks.jsonl").read_text().splitlines()
    assert len(ranks) == 24  # one row per log interval, each rank's figures in it
    assert runs.main([str(ddp_run.parent)]) == 0
    listed = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()}
    assert listed[ddp_run.name][1:3] == ["completed", "24"]
    assert wall_text(wall) in " ".join(listed[ddp_run.name])  # the same figure, as it was shown
    assert listed[ddp_run.name][-3:] == ["ddp", "2", "0"]
    assert listed[single_process.name][-2:] == ["1", "0"]
    plot = tmp_path / "compare.png"
    assert runs.main(["compare", str(ddp_run), str(single_process), "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "logger.mode" in out and "world_size" in out
    assert not_blank(plot) > 0.01


def test_generate_from_the_checkpoint_and_from_its_export(ddp_run, tmp_path, capsys):
    prompt = ["--prompt", "def ", "--max-tokens", "12", "--seed", "1"]
    assert generate.main([str(ddp_run), *prompt]) == 0
    from_checkpoint = capsys.readouterr().out
    assert from_checkpoint.startswith("def ") and len(from_checkpoint) > len("def \n")
    out = tmp_path / "export"
    assert export_cmd.main([str(ddp_run), str(out)]) == 0
    assert generate.main([str(out), *prompt]) == 0
    assert capsys.readouterr().out.endswith(from_checkpoint)  # same weights, seed, tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    ids = tokenizer("import os", return_tensors="pt").input_ids
    assert tokenizer.decode(ids[0]) == "import os"
    assert model(ids).logits.shape[-1] == model.config.vocab_size
    assert generate.main([str(tmp_path / "nothing"), *prompt]) == 2
