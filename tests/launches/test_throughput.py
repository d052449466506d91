"""The GPU check (the throughput experiment, its profile, the optimisation ladder, the
multi-rank paths), run end to end on the CPU."""

from __future__ import annotations

import json
import subprocess

import pytest

from launch import base_env, explain, metrics, summary
from paths import REPO

ROOT = REPO


def test_gpu_check_script_end_to_end_on_cpu(tmp_path):
    """The script a GPU machine runs, with overrides that make it CPU-sized: the doctor,
    the throughput experiment (its figures consistent at every logged step), its profile
    read by the analyser, every rung of the optimisation ladder, and two ranks stopped by
    SIGTERM (benchmarks/multirank_check.sh)."""
    tiny = [
        "model=gpt2-tiny",
        "trainer.seq_len=64",
        "data.vocab_size=512",
        "trainer.micro_batch_size=2",
        "trainer.compile=off",
        "trainer.precision=fp32",
        "trainer.max_steps=4",
        "trainer.log_interval=1",
        "data.num_workers=0",
        "data.persistent_workers=false",
    ]
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), str(tmp_path), *tiny],
        capture_output=True,
        text=True,
        timeout=900,
        env=base_env(
            # every micro-batch size is a fresh compile on the CPU (20-25 CPU-seconds): the
            # search stays at its first size here (its logic: unit/train/test_ladder_search.py)
            LADDER_ARGS="--steps 4 --max-micro-batch 2",
            RESULTS_DIR=str(tmp_path / "results"),
        ),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, explain(proc)
    for name in (
        "doctor.txt",
        "throughput.log",
        "profile_report.md",
        "ladder.json",
        "ladder.log",
        "multirank.json",
        "runs/throughput/summary.json",
    ):
        assert (tmp_path / name).is_file(), name
    throughput_run = tmp_path / "runs" / "throughput"
    records = [r for r in metrics(throughput_run) if "loss" in r]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    for r in records:  # one rank, one step per interval: tokens/s is tokens per step / step time
        assert r["tokens_per_s"] == pytest.approx(2 * 64 / r["step_time_s/p50"], rel=1e-9)
        assert r["mfu"] is None
    s = summary(throughput_run)  # medians over the 3 steady steps (odd: the same middle step)
    assert s["tokens_per_s"] == pytest.approx(2 * 64 / s["step_time_s/p50"], rel=1e-9)
    assert not (throughput_run / "checkpoints").exists()  # the experiment turns them off
    assert "eval/loss" not in json.dumps(records)
    checks = (tmp_path / "multirank_checks.txt").read_text().splitlines()
    assert len(checks) == 6 and all(line.startswith("multirank: ok") for line in checks), checks
    multirank = json.loads((tmp_path / "multirank.json").read_text())
    assert (multirank["exit_code"], multirank["status"]) == (143, "stopped")
    assert multirank["comm"]["comm/allreduce_s"] > 0 and multirank["traces"] == ["rank0", "rank1"]
    last = proc.stdout.strip().splitlines()
    assert last[-6].startswith("ladder on CPU") and last[-1].lstrip().startswith("5. + fused AdamW")
    rows = json.loads((tmp_path / "ladder.json").read_text())["rows"]
    assert [r["rung"] for r in rows] == [1, 2, 3, 4, 5]
    assert rows[0]["speedup"] == 1.0
    for r in rows:
        assert r["mfu"] is None and r["tokens_per_s"] > 0
        assert r["speedup"] == pytest.approx(r["tokens_per_s"] / rows[0]["tokens_per_s"])
        # Medians over the 3 steady steps: the same middle step for both figures.
        assert r["tokens_per_s"] == pytest.approx(
            r["tokens_per_step"] / r["step_time_s/p50"], rel=1e-9
        )
    assert rows[4]["micro_batch_size"] == 2  # the cap
    assert "| 5 | + fused AdamW, best micro-batch |" in (tmp_path / "ladder.log").read_text()
    (record,) = (tmp_path / "results").iterdir()  # benchmarks/results.py's format
    rec = json.loads(record.read_text())
    assert record.name.endswith("-cpu.json") and rec["ladder"]["rows"] == rows
    assert rec["mfu"] is None and rec["tokens_per_s"] > 0 and rec["model_cost"] is None
    assert rec["overhead"] is None  # measured on a GPU only
    assert rec["multirank"] == multirank
    classes = {c["class"]: c for c in rec["profile"]["kernel_classes"]}
    assert classes["matmul"]["flops_per_step"] > 0 and classes["matmul"]["tflops"] > 0
    assert "## Compute by kernel class" in (tmp_path / "profile_report.md").read_text()
