"""report.png, the closing block and `launcher.runs` on run directories written here: the
picture is drawn and not blank, the list and the comparison say what the files hold."""

from __future__ import annotations

import json

import numpy as np
import yaml
from PIL import Image

from launcher import runs
from launcher.observe.report import draw
from launcher.observe.sinks import closing_block

STEPS = range(2, 21, 2)


def make_run(folder, *, loss0: float, lr: float, ranks: int = 4, slow_rank: int = 2):
    """A run directory as a finished run leaves it: config, summary, metrics, ranks."""
    folder.mkdir(parents=True)
    config = {"trainer": {"lr": lr, "max_steps": 20}, "strategy": {"name": "ddp"},
              "run": {"id": folder.name}}  # fmt: skip
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    records = []
    for step in STEPS:
        record = {"step": step, "loss": loss0 - step * 0.05, "tokens_per_s": 1000.0 + step,
                  "step_time_s/p50": 0.02, "step_time_s/max": 0.03 + 0.001 * step,
                  "step_time_s/slowest_rank": slow_rank, "comm/overhead_frac": 0.3,
                  "data_wait_s": 0.001, "mem/peak_gb": None, "mem/host_peak_gb": 0.5}  # fmt: skip
        if step % 10 == 0:
            record["eval/loss"] = record["loss"] + 0.1
        records.append(record)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    per_rank = [
        {"step": step, "step_time_s": [0.02 + 0.01 * (r == slow_rank) for r in range(ranks)],
         "comm/exposed_s": [0.005 * r for r in range(ranks)], "data_wait_s": [0.001] * ranks}
        for step in STEPS
    ]  # fmt: skip
    (folder / "ranks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in per_rank))
    summary = {"status": "completed", "run_id": folder.name, "world_size": ranks, "steps": 20,
               "loss": records[-1]["loss"], "eval/loss": records[-1]["eval/loss"],
               "tokens_per_s": 1010.0, "mfu": None, "wall_time_s": 75.0,
               "exit_code": 0}  # fmt: skip
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def pixels(path):
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB")).astype(int)


def test_report_is_drawn_and_not_blank(tmp_path):
    """Not blank, at the pixel level: a good share of the picture is not background, it has
    many colours (curves, a heatmap's gradient), and the heatmap region shows the slow rank
    as a row of its own colour."""
    run = make_run(tmp_path / "a", loss0=6.0, lr=1e-3)
    out = draw(run, "a", tmp_path / "report.png")
    rgb = pixels(out)
    height, width, _ = rgb.shape
    assert width >= 1000 and height >= 800
    not_white = (rgb.sum(axis=2) < 3 * 250).mean()
    assert not_white > 0.05, not_white
    assert len(np.unique(rgb.reshape(-1, 3), axis=0)) > 200
    # The bottom-left panel is the step-time heatmap: its rows differ (rank 2 is slow).
    panel = rgb[int(height * 0.70) : int(height * 0.92), int(width * 0.06) : int(width * 0.26)]
    row_colours = {tuple(row.mean(axis=0).round()) for row in panel[:: max(len(panel) // 8, 1)]}
    assert len(row_colours) >= 2


def test_closing_block_names_the_run_its_wall_time_and_what_comes_next(tmp_path):
    summary = json.loads(
        (make_run(tmp_path / "a", loss0=6.0, lr=1e-3) / "summary.json").read_text()
    )
    text = closing_block(tmp_path / "a", summary)
    first, figures, *rest = text.splitlines()
    assert first.startswith(f"run {tmp_path / 'a'}: completed, 20 steps in ")
    assert first.endswith(" wall time")
    assert "loss 5.0000, eval loss 5.1000, tokens/s 1,010, mfu none (" in figures
    assert any(f"python -m launcher.analyze {tmp_path / 'a'}" in line for line in rest)
    assert any("launcher.generate" in line for line in rest)
    failed = closing_block(tmp_path / "a", {**summary, "status": "failed: rank 1 at step 3: x"})
    assert len(failed.splitlines()) == 1 and "rank 1 at step 3" not in failed  # said once


def test_runs_lists_and_compares(tmp_path, capsys):
    root = tmp_path / "runs"
    make_run(root / "a", loss0=6.0, lr=1e-3)
    make_run(root / "b", loss0=5.0, lr=3e-3)
    (root / "latest").symlink_to("b")
    assert runs.main([str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["id", "status", "steps", "loss", "eval", "loss", "tokens/s",
                                "mfu", "wall", "engine", "world", "exit"]  # fmt: skip
    assert [line.split()[:4] for line in lines[1:]] == [
        ["a", "completed", "20", "5.0000"],
        ["b", "completed", "20", "4.0000"],
    ]  # the link `latest` is not listed as a run of its own
    assert lines[1].split()[-5:] == ["-", "1:15", "ddp", "4", "0"]  # mfu, wall, engine, world, exit
    plot = tmp_path / "cmp.png"
    assert runs.main(["compare", "a", "b", "--root", str(root), "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "trainer.lr  0.001  0.003" in out and "run.id" not in out
    loss_row = next(line for line in out.splitlines() if line.startswith("loss "))
    assert loss_row.split() == ["loss", "5", "4", "-20.0%"]
    assert (pixels(plot).sum(axis=2) < 3 * 250).mean() > 0.01


def test_runs_refuses_what_is_not_a_run(tmp_path, capsys):
    assert runs.main(["compare", "nope", "b", "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: nope: not a run directory") and err.count("\n") == 1
    assert runs.main([str(tmp_path / "missing")]) == 2
