"""Sweeps inside one torchrun launch (Hydra multirun on one process group), their summary,
and the comparison of separate launches."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest

from launch import FAST, base_env, explain, losses, summary, torchrun
from reference import copy_run, launch_log
from reference_runs import DDP_SWEEP_POINTS, ddp_sweep_overrides
from wandb_readback import inspect_summary, private_wandb_env, records

SWEEP = [*FAST, "trainer.max_steps=6", "trainer.eval_interval=0", "trainer.checkpoint_interval=0"]


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_bucket_sweep_runs_every_point_on_one_process_group(ddp_sweep, shared_root):
    sweep_dir, log = ddp_sweep, launch_log(shared_root, "ddp_sweep")
    assert log.count("process group created") == 1, log[-4000:]
    points = list(DDP_SWEEP_POINTS)
    for point in points:
        assert summary(sweep_dir / point)["status"] == "completed"
    rows = read_csv(sweep_dir / "sweep_summary.csv")
    assert [r["point"] for r in rows] == points
    assert [r["strategy.bucket_cap_mb"] for r in rows] == ["0.05", "25.0"]
    assert int(rows[0]["buckets"]) > int(rows[1]["buckets"]) == 1
    assert [r["best"] for r in rows].count("True") == 1
    for r in rows:
        assert float(r["exposed_s"]) <= float(r["allreduce_s"]) < float(r["step_time_p90_s"])
    table = (sweep_dir / "sweep_summary.md").read_text()
    assert table.count("| bucket_cap_mb=") == 2 and "**best**" in table
    assert (sweep_dir / "sweep_summary.png").read_bytes()[:4] == b"\x89PNG"
    # A fresh model and the same data for each point: with 2 ranks a sum of two gradients
    # is exact whatever the bucketing, so the losses agree to the last bit.
    assert losses(sweep_dir / points[0]) == losses(sweep_dir / points[1])


def test_requeued_sweep_skips_completed_points(ddp_sweep, tmp_path):
    sweep_dir = copy_run(ddp_sweep, tmp_path / "sweep")
    env = base_env(**private_wandb_env(tmp_path))
    proc = torchrun(ddp_sweep_overrides(sweep_dir), env=env)
    assert proc.returncode == 0, explain(proc)
    assert proc.stderr.count("already completed") == 2, explain(proc)
    assert len(read_csv(sweep_dir / "sweep_summary.csv")) == 2


def test_comm_hook_sweep_reports_loss_difference_from_none(tmp_path):
    """Also logged to W&B offline: one run per point, named by it, grouped by the sweep,
    and one more run of the group holding the summary table."""
    args = [*SWEEP, "+exp=comm_hook_sweep", f"run.root={tmp_path}", "run.id=hooks"]
    args += ["logger=wandb", "logger.mode=offline"]
    env = base_env(**private_wandb_env(tmp_path))
    proc = torchrun([*args, "strategy.comm_hook=none,bf16", "strategy.bucket_cap_mb=0.05"], env=env)
    assert proc.returncode == 0, explain(proc)
    groups = {}
    for found in tmp_path.rglob("offline-run-*"):
        run = next(r["run"] for r in records(found, tmp_path) if r["type"] == "run")
        groups[inspect_summary(found, tmp_path)["name"]] = run["run_group"]
    assert groups == {
        "comm_hook=none": "hooks",
        "comm_hook=bf16": "hooks",
        "hooks summary": "hooks",
    }
    rows = {r["point"]: r for r in read_csv(tmp_path / "hooks" / "sweep_summary.csv")}
    assert set(rows) == {"comm_hook=none", "comm_hook=bf16"}
    assert float(rows["comm_hook=none"]["loss_diff_vs_none"]) == 0.0
    diff = float(rows["comm_hook=bf16"]["loss_diff_vs_none"])
    final = float(rows["comm_hook=bf16"]["final_loss"])
    assert diff == pytest.approx(final - float(rows["comm_hook=none"]["final_loss"]))
    assert abs(diff) < 0.01 * final  # compression changes the loss slightly, not in kind


def test_separate_launches_compare_in_the_same_format(ddp_sweep, tmp_path):
    sweep_dir = ddp_sweep
    dirs = [str(sweep_dir / point) for point in DDP_SWEEP_POINTS]
    cmd = [sys.executable, "-m", "launcher.config.sweep", *dirs, "--out", str(tmp_path / "cmp")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=base_env())
    assert proc.returncode == 0, explain(proc)
    assert read_csv(tmp_path / "cmp" / "sweep_summary.csv") == read_csv(
        sweep_dir / "sweep_summary.csv"
    )
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "launcher.config.sweep",
            str(tmp_path),
            "--out",
            str(tmp_path / "x"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=base_env(),
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "summary.json" in bad.stderr


@pytest.mark.parametrize(
    ("sweep_args", "named"),
    [
        (["strategy.bucket_cap_mb=1,-1"], "strategy.bucket_cap_mb=-1.0"),
        (["nccl=default,debug"], "nccl.* differs between sweep points"),
    ],
)
def test_bad_sweep_point_is_rejected_before_anything_starts(tmp_path, sweep_args, named):
    proc = torchrun([*SWEEP, "+exp=bucket_sweep", f"run.root={tmp_path}", *sweep_args])
    assert proc.returncode != 0
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and named in errors[0], explain(proc)
    assert "process group created" not in proc.stderr
    assert not list(tmp_path.glob("*/*/summary.json"))
