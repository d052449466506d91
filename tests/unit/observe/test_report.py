"""report.png and the closing block on run directories written here: the picture is drawn
and not blank, the block says what the files hold (`launcher.runs`: tests/unit/test_runs.py)."""

from __future__ import annotations

import io
import json
import logging

import numpy as np
import pytest

from launcher.observe.report import deferred, draw
from launcher.observe.sinks import ConsoleSink, closing_block
from launcher.resilience import preemption

from run_dir_tools import finished_run_dir, not_blank, pixels


def test_report_is_drawn_and_not_blank(tmp_path):
    """Not blank, at the pixel level: a good share of the picture is not background, it has
    many colours (curves, a heatmap's gradient), and the heatmap region shows the slow rank
    as a row of its own colour."""
    run = finished_run_dir(tmp_path / "a", loss0=6.0, lr=1e-3)
    out = draw(run, "a", tmp_path / "report.png")
    rgb = pixels(out)
    height, width, _ = rgb.shape
    assert width >= 1000 and height >= 800
    not_white = not_blank(out)
    assert not_white > 0.05, not_white
    assert len(np.unique(rgb.reshape(-1, 3), axis=0)) > 200
    # The bottom-left panel is the step-time heatmap: its rows differ (rank 2 is slow).
    panel = rgb[int(height * 0.70) : int(height * 0.92), int(width * 0.06) : int(width * 0.26)]
    row_colours = {tuple(row.mean(axis=0).round()) for row in panel[:: max(len(panel) // 8, 1)]}
    assert len(row_colours) >= 2


def test_closing_block_names_the_run_its_wall_time_and_what_comes_next(tmp_path):
    summary = json.loads(
        (finished_run_dir(tmp_path / "a", loss0=6.0, lr=1e-3) / "summary.json").read_text()
    )
    offered = ["  next: python -m launcher.analyze x"]  # launcher.train.next_steps chooses
    text = closing_block(tmp_path / "a", summary, offered)
    first, figures, report, *rest = text.splitlines()
    # summary.json's wall_time_s, as `launcher.runs` shows it (1:15 there too, below)
    assert first == f"run {tmp_path / 'a'}: completed, 20 steps in 1:15 wall time"
    assert "loss 5.0000, eval loss 5.1000, tokens/s 1,010, mfu none (" in figures
    assert rest == offered
    failed = closing_block(tmp_path / "a", {**summary, "status": "failed: rank 1 at step 3: x"})
    assert len(failed.splitlines()) == 1 and "rank 1 at step 3" not in failed  # said once


def closing_report_line(tmp_path, drawn: dict, report: bool, caplog, code: int = 0) -> str:
    """The closing block's report line of a finished run's console sink."""
    run = finished_run_dir(tmp_path / "a", loss0=6.0, lr=1e-3)
    summary = {**json.loads((run / "summary.json").read_text()), "exit_code": code}
    sink = ConsoleSink(20, 0, stream=io.StringIO(), run_dir=run, report=report)
    with caplog.at_level(logging.INFO, logger="launcher"):
        sink.log_images(drawn)
        sink.close(summary)
    return [line for line in caplog.text.splitlines() if "  report: " in line][0].strip()


@pytest.mark.parametrize(
    ("drawn", "report", "said"),
    [
        ({"report": "R/report.png"}, True, "report: R/report.png"),
        ({}, True, "report: not drawn (the warning above says why)"),  # drawing failed
        ({}, False, "report: off (run.report=false)"),
    ],
)
def test_the_closing_block_says_where_the_report_is_or_why_there_is_none(
    tmp_path, caplog, drawn, report, said
):
    assert closing_report_line(tmp_path, drawn, report, caplog) == said


RESTARTS = {"TORCHELASTIC_RESTART_COUNT": "1", "TORCHELASTIC_MAX_RESTARTS": "3"}
LAST = {"TORCHELASTIC_RESTART_COUNT": "3", "TORCHELASTIC_MAX_RESTARTS": "3"}


@pytest.mark.parametrize(
    ("code", "stopped_by", "environ", "said"),
    [
        (0, None, RESTARTS, None),  # completed: drawn
        (143, "SIGTERM", {}, "at the run's end (stopped by SIGTERM: the launch that resumes"),
        (143, "SIGUSR1", LAST, "at the run's end (stopped by SIGUSR1: the launch that resumes"),
        (7, "SIGTERM", {}, "at the run's end (stopped by SIGTERM: the launch that resumes"),
        (143, "a full disk", {}, "at the run's end (stopped by a full disk: the launch that"),
        (143, "SIGINT", {}, None),  # Ctrl-C: a person at the terminal may look at it
        (1, None, RESTARTS, "at the run's end (torchrun restarts the job: 2 restart(s) left)"),
        (5, None, RESTARTS, "at the run's end (torchrun restarts the job: 2 restart(s) left)"),
        (1, None, LAST, None),  # no restart left: the run ends here
        (2, None, {}, None),  # no torchrun restarts (plain python, --max-restarts=0)
    ],
)
def test_an_end_the_run_goes_on_from_leaves_the_report_to_the_last_launch(
    code, stopped_by, environ, said
):
    """A scheduler's stop and a failure torchrun restarts in place draw no report (every
    rank of the restart waited for rank 0's matplotlib: 3.8 s of a preemption on 16 ranks
    on 2 cores); the run's last launch draws it."""
    got = deferred(code, stopped_by, environ)
    assert got == said if said is None else got.startswith(said), got


def test_the_closing_block_says_when_a_deferred_report_comes(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(preemption._Request, "signal_name", "SIGTERM")
    line = closing_report_line(tmp_path, {}, True, caplog, code=143)
    assert line == (
        "report: at the run's end (stopped by SIGTERM: the launch that resumes it draws it)"
    )
