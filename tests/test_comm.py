"""DDP communication knobs on 2 gloo ranks: hooks, buckets, replicas in sync, NCCL settings."""

from __future__ import annotations

import json
import math
import subprocess

import pytest

from launch import FAST, base_env, explain, losses, summary, torchrun, torchrun_cmd

RUN = [*FAST, "trainer.max_steps=8"]


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    root = tmp_path_factory.mktemp("plain")
    proc = torchrun([*RUN, f"run.root={root}", "run.id=none"])
    assert proc.returncode == 0, explain(proc)
    return root / "none"


def test_default_buckets_and_replicas(plain):
    s = summary(plain)
    assert s["replicas_in_sync"] is True
    assert s["comm/buckets"] == 1  # 0.13M parameters (0.5 MB) fit one 25 MB bucket


@pytest.mark.parametrize("hook", ["fp16", "bf16"])
def test_compression_hook_trains_and_keeps_replicas_identical(plain, tmp_path, hook):
    extra = [f"strategy.comm_hook={hook}", "strategy.bucket_cap_mb=0.05"]
    if hook == "fp16":  # one launch also carries an NCCL preset and a single override
        extra += ["nccl=ethernet", "nccl.env.NCCL_SOCKET_NTHREADS=8"]
    proc = torchrun([*RUN, f"run.root={tmp_path}", "run.id=h", *extra])
    assert proc.returncode == 0, explain(proc)
    s = summary(tmp_path / "h")
    assert s["replicas_in_sync"] is True
    assert s["comm/buckets"] > 1  # 0.05 MB buckets split the gradients
    reference = losses(plain)
    for step, loss in losses(tmp_path / "h").items():  # compressed, not changed in kind
        assert loss == pytest.approx(reference[step], rel=2e-3), step
    if hook == "fp16":
        env = json.loads((tmp_path / "h" / "env.json").read_text())["nccl_env"]
        assert env["NCCL_IB_DISABLE"] == "1" and env["NCCL_SOCKET_NTHREADS"] == "8"
        assert env["NCCL_SOCKET_IFNAME"] == "^lo,docker"


# PowerSGD: the first 8 steps keep the plain run's LR schedule (lr_decay_steps=8), so the
# losses compare; warm-up (trainer.warmup_steps=3) makes steps 1-3 plain all-reduce.
POWERSGD = [
    *FAST,
    "strategy.comm_hook=powersgd",
    "trainer.lr_decay_steps=8",
    "trainer.checkpoint_interval=6",
]


@pytest.fixture(scope="module")
def powersgd_small_buckets(tmp_path_factory):
    """12 steps straight with 0.05 MB buckets: the layout on which PyTorch's hook hung."""
    root = tmp_path_factory.mktemp("powersgd")
    proc = torchrun([*POWERSGD, f"run.root={root}", "run.id=p", "strategy.bucket_cap_mb=0.05"])
    assert proc.returncode == 0, explain(proc)
    return root / "p"


def test_powersgd_small_buckets_trains_and_keeps_replicas_identical(plain, powersgd_small_buckets):
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


def test_powersgd_resume_with_default_buckets_is_exact(powersgd_small_buckets, tmp_path):
    """6 steps, then a resumed launch to 12, both with one 25 MB bucket: bit-identical to
    12 straight with 0.05 MB buckets. PowerSGD's memory is kept per parameter, so neither
    the bucket size nor DDP's rebuild of buckets after a restart changes the arithmetic."""
    common = [*POWERSGD, f"run.root={tmp_path}", "run.id=r"]
    first = torchrun([*common, "trainer.max_steps=6"])
    assert first.returncode == 0, explain(first)
    second = torchrun([*common, "trainer.max_steps=12"])
    assert second.returncode == 0, explain(second)
    assert "resumed from step 6" in second.stderr
    s = summary(tmp_path / "r")
    assert s["replicas_in_sync"] is True and s["comm/buckets"] == 1
    assert losses(tmp_path / "r") == losses(powersgd_small_buckets)  # every step, exactly


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
