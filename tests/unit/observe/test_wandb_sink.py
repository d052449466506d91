"""logger=wandb in-process, on real offline W&B runs: a bad mode is one line, the run id is
stable and valid, a restart continues the same run, the sweep summary's table and plot."""

from __future__ import annotations

import hashlib
import json
import math
import re
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from launcher.config import LoggerConfig
from launcher.observe.wandb_sink import WandbSink, headline_first, log_sweep_summary, wandb_run_id
from launcher.train.front_door import main

from wandb_readback import history, inspect_summary, private_wandb_env, records

pytest.importorskip("wandb", reason="wandb is in the test extra: pip install -e '.[test]'")


@pytest.fixture
def private_wandb(tmp_path, monkeypatch):
    for name, value in private_wandb_env(tmp_path).items():
        monkeypatch.setenv(name, value)


def test_bad_mode_is_one_line_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["launcher.train", "logger=wandb", "logger.mode=foo"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.strip() == "error: logger.mode=foo: not one of online, offline, disabled"


def test_wandb_run_id_is_stable_and_valid():
    assert wandb_run_id("20261130-184750-1a2b3c4d") == "20261130-184750-1a2b3c4d"
    point = wandb_run_id("20261130-184750-1a2b3c4d/bucket_cap_mb=1")
    assert point == wandb_run_id("20261130-184750-1a2b3c4d/bucket_cap_mb=1")
    assert point != wandb_run_id("20261130-184750-1a2b3c4d/bucket_cap_mb=2")
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", point)
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", wandb_run_id("x" * 200))


def offline_logger(tmp: Path, **keys) -> LoggerConfig:
    return OmegaConf.structured(LoggerConfig(mode="offline", **keys))


def test_restart_continues_the_same_wandb_run(tmp_path, private_wandb):
    """Two sinks for one run directory, as a requeue makes them: one W&B id, steps go on."""
    run_dir = tmp_path / "runs" / "sweep7" / "point-a"
    for attempt, steps in enumerate(([1, 2], [3, 4])):
        sink = WandbSink(
            offline_logger(tmp_path),
            run_dir=run_dir,
            run_id="sweep7/point-a",
            config={"attempt": attempt},
            group="sweep7",
        )
        for step in steps:
            sink.log({"step": step, "loss": 1.0 / step, "mfu": float("nan")})
        sink.close({"status": "stopped" if attempt == 0 else "completed", "loss": 0.25})
        time.sleep(1.1)  # offline run folders are named by the second they start
    runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 2
    ids = {inspect_summary(r, tmp_path)["run_id"] for r in runs}
    assert ids == {wandb_run_id("sweep7/point-a")}
    steps = [h["step"]["num"] for r in runs for h in history(r, tmp_path)]
    assert steps == [1, 2, 3, 4]
    first = records(runs[0], tmp_path)
    assert any(r["type"] == "preempting" for r in first)
    assert next(r["run"] for r in first if r["type"] == "run")["run_group"] == "sweep7"
    assert [h["item"]["mfu"] for h in history(runs[1], tmp_path)] == [None, None]


def test_sweep_summary_table_and_plot(tmp_path, private_wandb):
    from PIL import Image

    png = tmp_path / "sweep_summary.png"
    Image.new("RGB", (32, 16), (200, 30, 30)).save(png)
    rows = [
        {"point": "bucket_cap_mb=1", "step_time_p50_s": 0.05, "final_loss": 6.5, "best": True},
        {"point": "bucket_cap_mb=25", "step_time_p50_s": 0.06, "final_loss": math.nan},
    ]
    root = tmp_path / "runs"
    logger_cfg = offline_logger(tmp_path, project="sweeps", tags=["sweep"])
    run_id = log_sweep_summary(logger_cfg, root, "sw42", rows, png)
    (found,) = sorted((root / "sw42" / "wandb").glob("offline-run-*"))
    run = next(r["run"] for r in records(found, tmp_path) if r["type"] == "run")
    assert (run["run_id"], run["job_type"], run["run_group"]) == (run_id, "sweep_summary", "sw42")
    assert (run["project"], run["tags"]) == ("sweeps", ["sweep"])
    (row,) = history(found, tmp_path)
    item = row["item"]
    assert item["sweep_summary._type"] == "table-file"
    table = json.loads((found / "files" / item["sweep_summary.path"]).read_text())
    assert table["columns"] == list(rows[0])
    assert table["data"] == [list(rows[0].values()), ["bucket_cap_mb=25", 0.06, None, None]]
    assert item["sweep_plot._type"] == "image-file"
    assert item["sweep_plot.sha256"] == hashlib.sha256(png.read_bytes()).hexdigest()
    assert (found / "files" / item["sweep_plot.path"]).read_bytes() == png.read_bytes()
    assert log_sweep_summary(OmegaConf.structured(LoggerConfig()), root, "sw43", rows, png) is None
    assert not (root / "sw43").exists()


def test_the_run_summary_leads_with_the_headline_and_drops_what_does_not_apply():
    summary = {"status": "completed", "comm/allreduce_s": 0.01, "comm/allgather_s": None,
               "loss": math.nan, "tokens_per_s": 900.0, "eval/loss": None, "steps": 5}  # fmt: skip
    assert list(headline_first(summary).items()) == [
        ("status", "completed"),
        ("loss", None),  # a diverged run's loss keeps its place
        ("eval/loss", None),
        ("tokens_per_s", 900.0),
        ("steps", 5),
        ("comm/allreduce_s", 0.01),
    ]
