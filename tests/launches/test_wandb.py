"""logger=wandb: the session's 2-rank offline W&B run, read back with `wandb leet inspect`,
against the files; a one-process launch checks `logger.mode=disabled`."""

from __future__ import annotations

import json
import math
import re

import pytest
import yaml

from launcher.observe.wandb_sink import wandb_run_id

from launch import metrics, summary
from reference import launch_log
from reference_runs import DDP_RUN_ID, DDP_RUN_STEPS, FAKE_KEY
from wandb_readback import history, inspect_summary, records

RUN_ID = DDP_RUN_ID


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


pytest.importorskip("wandb", reason="wandb is in the test extra: pip install -e '.[test]'")


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
