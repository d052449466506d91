"""DDP communication knobs on 2 gloo ranks: hooks, buckets, replicas in sync, NCCL settings.

The runs the tests read are the points of one multirun launch (`points`): plain all-reduce
at the default bucket size, fp16 and bf16 compression with 0.05 MB buckets, the comm timing
off, and PowerSGD with 0.05 MB buckets; the launch carries an NCCL preset and a single
override of it (launch-wide: NCCL reads its settings once, when the process group is
created). Each point is a job of its own (its engine, hook and seed built again), so each
equals the launch it replaced.
"""

from __future__ import annotations

import json
import math
import subprocess

import pytest

from launcher.plan.comm import step_comm
from launcher.plan.measured import read_run
from launcher.plan.presets import LINKS, Topology

from launch import (
    FAST,
    base_env,
    explain,
    losses,
    metrics,
    summary,
    sweep_of_points,
    torchrun,
    torchrun_cmd,
)
from reference import cut_at

RUN = [*FAST, "trainer.max_steps=8"]


# PowerSGD: the first 8 steps keep the plain run's LR schedule (lr_decay_steps=8), so the
# losses compare; warm-up (trainer.warmup_steps=3) makes steps 1-3 plain all-reduce.
POWERSGD = [
    *FAST,
    "strategy.comm_hook=powersgd",
    "trainer.lr_decay_steps=8",
    "trainer.checkpoint_interval=6",
]
NCCL = ["nccl=ethernet", "nccl.env.NCCL_SOCKET_NTHREADS=8"]


@pytest.fixture(scope="module")
def points(tmp_path_factory):
    """{point: run directory} of the one launch: "none" (plain), "fp16", "bf16", "untimed",
    "powersgd" (12 steps straight with 0.05 MB buckets: the layout on which PyTorch's hook
    hung)."""
    root = tmp_path_factory.mktemp("comm")
    runs = {
        "none": RUN,
        "fp16": [*RUN, "strategy.comm_hook=fp16", "strategy.bucket_cap_mb=0.05"],
        "bf16": [*RUN, "strategy.comm_hook=bf16", "strategy.bucket_cap_mb=0.05"],
        "untimed": [*RUN, "trainer.max_steps=2", "strategy.time_comm=false"],
        "powersgd": [*POWERSGD, "strategy.bucket_cap_mb=0.05"],
    }
    args = sweep_of_points(root / "conf", runs)
    proc = torchrun([*args, *NCCL, f"run.root={root}", "run.id=c"])
    assert proc.returncode == 0, explain(proc)
    return {name: root / "c" / f"point={name}" for name in runs}


def test_default_buckets_and_replicas(points):
    s = summary(points["none"])
    assert s["replicas_in_sync"] is True
    assert s["comm/buckets"] == 1  # 0.13M parameters (0.5 MB) fit one 25 MB bucket


def check_comm_figures(records: list[dict], wire_itemsize: int, world: int = 2) -> None:
    """exposed <= all-reduce <= step time, bandwidth and overhead derived consistently."""
    logged = [r for r in records if "loss" in r]
    assert logged
    for r in logged:
        assert 0 <= r["comm/exposed_s"] <= r["comm/allreduce_s"]
        assert r["comm/exposed_s/max"] <= r["comm/allreduce_s/max"] <= r["step_time_s/max"]
        assert r["comm/allreduce_s/p50"] <= r["comm/allreduce_s/p90"] <= r["comm/allreduce_s/max"]
        assert 0 <= r["comm/overhead_frac"] < 1
        assert r["comm/bytes"] % wire_itemsize == 0 and r["comm/bytes"] > 0
        algbw = r["comm/bytes"] / r["comm/allreduce_s"] / 1e9
        assert r["comm/busbw_gbps"] == pytest.approx(algbw * 2 * (world - 1) / world)


@pytest.mark.parametrize("hook", ["fp16", "bf16"])
def test_compression_hook_trains_and_keeps_replicas_identical(points, hook):
    plain, run_dir = points["none"], points[hook]
    s = summary(run_dir)
    assert s["replicas_in_sync"] is True
    assert s["comm/buckets"] > 1  # 0.05 MB buckets split the gradients
    # the plan cuts them as DDP does, from the fp32 gradients, then halves each one's bytes
    planned = step_comm(read_run(run_dir).shape.cfg, 2, Topology(1, 2, LINKS["gloo"]))
    assert s["comm/buckets"] == len(planned["collectives"])
    assert s["comm/bytes"] == planned["bytes"]
    check_comm_figures(metrics(run_dir), wire_itemsize=2)
    # the hook sends 16-bit values: exactly half the bytes of the fp32 all-reduce
    assert s["comm/bytes"] * 2 == summary(plain)["comm/bytes"]
    reference = losses(plain)
    for step, loss in losses(run_dir).items():  # compressed, not changed in kind
        assert loss == pytest.approx(reference[step], rel=2e-3), step
    env = json.loads((run_dir / "env.json").read_text())["nccl_env"]
    assert env["NCCL_IB_DISABLE"] == "1" and env["NCCL_SOCKET_NTHREADS"] == "8"
    assert env["NCCL_SOCKET_IFNAME"] == "^lo,docker"


def test_plain_allreduce_comm_figures(points):
    check_comm_figures(metrics(points["none"]), wire_itemsize=4)


def test_untimed_comm_reports_no_comm_figures(points):
    untimed = points["untimed"]
    assert [r["step"] for r in metrics(untimed) if "loss" in r] == [1, 2]
    for r in metrics(untimed):
        assert not any(k.startswith("comm/") and k != "comm/buckets" for k in r), r
    assert summary(untimed)["comm/exposed_s"] is None


def test_powersgd_small_buckets_trains_and_keeps_replicas_identical(points):
    plain, powersgd_small_buckets = points["none"], points["powersgd"]
    s = summary(powersgd_small_buckets)
    assert s["status"] == "completed" and s["replicas_in_sync"] is True
    assert s["comm/buckets"] > 1
    got, reference = losses(powersgd_small_buckets), losses(plain)
    assert sorted(got) == list(range(1, 13)) and all(math.isfinite(v) for v in got.values())
    for step in (1, 2, 3, 4):  # updates 0-2 were plain all-reduces: the same losses
        assert got[step] == pytest.approx(reference[step], rel=1e-5), step
    for step in range(5, 9):  # compressed from then on: changed, but not in kind
        assert got[step] != reference[step]
        assert got[step] == pytest.approx(reference[step], rel=5e-3), step
    meta = json.loads((powersgd_small_buckets / "checkpoints/step_00000012/meta.json").read_text())
    for rank in (0, 1):  # each rank's error feedback is part of the sealed checkpoint
        assert meta["files"][f"powersgd_rank{rank}.pt"] > 0
    records = metrics(powersgd_small_buckets)
    check_comm_figures(records, wire_itemsize=4)
    full = summary(plain)["comm/bytes"]
    sent = {r["step"]: r["comm/bytes"] for r in records if "loss" in r}
    assert sent[1] == full and sent[5] < full / 2  # warm-up all-reduces, then the factors


def test_powersgd_resume_with_default_buckets_is_exact(points, tmp_path):
    """The 0.05 MB run's step-6 checkpoint, resumed to 12 with one 25 MB bucket: bit-identical
    to the 12 straight steps. PowerSGD's memory is kept per parameter, so neither the bucket
    size nor DDP's rebuild of buckets after a restart changes the arithmetic."""
    powersgd_small_buckets = points["powersgd"]
    cut_at(powersgd_small_buckets, 6, tmp_path / "r")
    resumed = torchrun([*POWERSGD, f"run.root={tmp_path}", "run.id=r", "trainer.max_steps=12"])
    assert resumed.returncode == 0, explain(resumed)
    assert "resumed from step 6" in resumed.stderr
    s = summary(tmp_path / "r")
    assert s["replicas_in_sync"] is True and s["comm/buckets"] == 1
    straight = losses(powersgd_small_buckets)
    assert losses(tmp_path / "r") == {k: v for k, v in straight.items() if k > 6}  # exactly


def test_commbench_reports_nccl_tests_figures(tmp_path):
    out = tmp_path / "cb.json"
    args = ["--min-bytes", "1K", "--max-bytes", "64K", "--iters", "3", "--out", str(out)]
    cmd = torchrun_cmd(args, module="launcher.commbench")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=base_env())
    assert proc.returncode == 0, explain(proc)
    report = json.loads(out.read_text())
    assert report["world_size"] == 2
    rows = report["rows"]
    assert [(r["dtype"], r["bytes"]) for r in rows] == [
        (d, b) for d in ("fp32", "bf16") for b in (1024, 4096, 16384, 65536)
    ]
    for r in rows:
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] / (r["time_us"] / 1e6) / 1e9)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * 2 * (2 - 1) / 2)
    assert "busbw (GB/s)" in proc.stdout
