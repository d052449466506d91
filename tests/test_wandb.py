"""logger=wandb: real offline W&B runs, read back with `wandb leet inspect`, against the files.

One 2-rank torchrun launch with `logger.mode=offline` serves most checks; a one-process
launch checks `logger.mode=disabled`; the sweep summary and resume are checked in-process.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import sys
import time
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from launcher.config import LoggerConfig
from launcher.observe.wandb_sink import WandbSink, log_sweep_summary, wandb_run_id
from launcher.train.front_door import main

from launch import metrics, summary
from reference import launch_log
from reference_runs import DDP_RUN_ID, DDP_RUN_STEPS, FAKE_KEY
from wandb_readback import history, inspect_summary, private_wandb_env, records

pytest.importorskip("wandb", reason="wandb is in the test extra: pip install -e '.[test]'")

RUN_ID = DDP_RUN_ID


@pytest.fixture
def private_wandb(tmp_path, monkeypatch):
    for name, value in private_wandb_env(tmp_path).items():
        monkeypatch.setenv(name, value)


def as_wandb_stores(node):
    """W&B leaves out a config key whose value is an empty mapping; keeps the rest as is."""
    if isinstance(node, dict):
        return {k: as_wandb_stores(v) for k, v in node.items() if v != {}}
    if isinstance(node, list):
        return [as_wandb_stores(v) for v in node]
    return node


def same_value(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-12)
    return a == b


@pytest.fixture(scope="module")
def offline(ddp_run, shared_root, tmp_path_factory):
    """The session's DDP run (tests/reference_runs.py): 2 ranks, W&B offline, a recognisable
    fake API key in the environment. `written` holds every folder the launch wrote to (the
    run directory and wandb's own folders outside it); `cli` is where `wandb` reading the run
    back keeps its debug log."""
    found = sorted((ddp_run / "wandb").glob("offline-run-*"))
    return {
        "run_dir": ddp_run,
        "written": [ddp_run, shared_root / "ddp_run-wandb"],
        "output": launch_log(shared_root, RUN_ID),
        "cli": tmp_path_factory.mktemp("wandb-cli"),
        "wandb_runs": found,
    }


def test_one_wandb_run_for_the_job_not_one_per_rank(offline):
    assert len(offline["wandb_runs"]) == 1, offline["wandb_runs"]
    every = sorted(p.name for d in offline["written"] for p in d.rglob("*.wandb"))
    assert every == [f"run-{RUN_ID}.wandb"]


def test_history_equals_metrics_jsonl(offline):
    rows = history(offline["wandb_runs"][0], offline["cli"])
    expected = metrics(offline["run_dir"])
    assert len(rows) == len(expected) == DDP_RUN_STEPS
    for row, want in zip(rows, expected, strict=True):
        got = {k: v for k, v in row["item"].items() if not k.startswith("_")}
        assert row["step"]["num"] == want["step"]
        assert set(got) == set(want), set(got) ^ set(want)
        bad = {k: (got[k], want[k]) for k in want if not same_value(got[k], want[k])}
        assert not bad, f"step {want['step']}: {bad}"


def test_config_summary_and_run_fields(offline):
    run_dir, tmp = offline["run_dir"], offline["cli"]
    state = inspect_summary(offline["wandb_runs"][0], tmp)
    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
    env = json.loads((run_dir / "env.json").read_text())
    config = {k: v for k, v in state["config"].items() if k != "_wandb"}
    assert config == as_wandb_stores({**resolved, "env": env})
    assert config["logger"]["mode"] == "offline" and config["env"]["world_size"] == 2
    assert state["run_id"] == wandb_run_id(RUN_ID) == RUN_ID
    assert (state["name"], state["project"]) == (RUN_ID, "launcher")
    assert state["tags"] == ["ci", "offline"]
    assert (state["state"], state["exit_code"]) == ("finished", 0)
    final = summary(run_dir)
    for key, value in final.items():
        if value is not None:
            assert same_value(state["summary"][key], value), key
    found = records(offline["wandb_runs"][0], tmp)
    run_record = next(r["run"] for r in found if r["type"] == "run")
    assert run_record["resume"] is True and run_record["job_type"] == "train"


def test_api_key_is_nowhere_on_disk(offline):
    """Every file the launch wrote (run directory, W&B folder, wandb's cache logs), as bytes."""
    leaks = [
        str(path)
        for folder in offline["written"]
        for path in folder.rglob("*")
        if path.is_file() and FAKE_KEY.encode() in path.read_bytes()
    ]
    assert not leaks
    wandb_logs = offline["written"][1] / "cache"
    assert list(wandb_logs.rglob("core-debug-*.log")), "wandb's logs were searched"
    assert FAKE_KEY not in offline["output"]
    written = {p.relative_to(offline["run_dir"]).parts[0] for p in offline["run_dir"].rglob("*")}
    assert {"config.yaml", "env.json", "logs", "wandb"} <= written


def test_disabled_writes_no_wandb_run_and_imports_no_optional_package(single_process, shared_root):
    """A plain run without W&B or TensorBoard imports neither, nor DeepSpeed: the shared
    single-process run (logger=wandb logger.mode=disabled, every import timed)."""
    assert not list(single_process.rglob("wandb"))
    assert not list((shared_root / "ws1-wandb").rglob("wandb"))
    output = launch_log(shared_root, "single_process")
    optional = r"\|\s+(wandb|tensorboardX|tensorboard|deepspeed)(\.|$)"
    imported = [ln for ln in output.splitlines() if re.search(optional, ln)]
    assert not imported, imported[:3]
    assert "tensorboard_sink" in output  # the check sees the launcher's own imports


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
