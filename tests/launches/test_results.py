"""The results record of benchmarks/gpu_check.sh (benchmarks/results.py): its file name and
every field docs/performance.md quotes, from the files the GPU check writes."""

import datetime as dt
import json
import subprocess
import sys

import torch

from launch import base_env, explain
from paths import REPO

ROOT = REPO
SUMMARY = {
    "tokens_per_s": 370827.0,
    "mfu": 0.321,
    "step_time_s/p50": 0.1767,
    "mem/peak_gb": 65.6,
    "mem/host_peak_gb": 3.2,
    "loss": 7.1,
}
LADDER = {
    "device": "NVIDIA H200",
    "overrides": ["model=gpt2"],
    "steps": 30,
    "rows": [{"rung": 1, "change": "eager fp32, default DataLoader", "tokens_per_s": 1e5}],
}


def test_the_record_holds_every_figure_under_a_dated_device_name(tmp_path):
    out = tmp_path / "gpu-check"
    (out / "runs" / "throughput").mkdir(parents=True)
    (out / "runs" / "throughput" / "summary.json").write_text(json.dumps(SUMMARY))
    (out / "ladder.json").write_text(json.dumps(LADDER))
    cmd = [sys.executable, str(ROOT / "benchmarks" / "results.py"), str(out)]
    cmd += ["--dest", str(tmp_path / "results"), "--command", "bash benchmarks/gpu_check.sh"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=base_env())
    assert proc.returncode == 0, explain(proc)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    slug = "-".join(device.lower().replace("_", " ").split())
    (written,) = (tmp_path / "results").iterdir()
    assert written.name == f"{dt.date.today().isoformat()}-{slug}.json"
    rec = json.loads(written.read_text())
    assert rec == {
        "date": dt.date.today().isoformat(),
        "device": device,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "command": "bash benchmarks/gpu_check.sh",
        "tokens_per_s": 370827.0,
        "mfu": 0.321,
        "step_time_s/p50": 0.1767,
        "mem/peak_gb": 65.6,
        "mem/host_peak_gb": 3.2,
        "ladder": {"overrides": ["model=gpt2"], "rows": LADDER["rows"]},
        "profile": None,  # parts that did not finish are null, the rest still recorded
        "multirank": None,
        "model_cost": None,
        "overhead": None,
    }
