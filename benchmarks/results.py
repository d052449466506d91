"""The GPU check's figures as one JSON record: benchmarks/results/<date>-<device>.json.

    python benchmarks/results.py OUT [--dest benchmarks/results] [--command "..."]

OUT is the folder benchmarks/gpu_check.sh wrote (runs/throughput/summary.json, ladder.json,
the analysis of runs/profile, multirank.json, and model_cost.json and overhead.json where a
GPU ran them; these four are null in the record when that part did not finish). One file
per date and device, committed with the docs that quote it, so that every figure in
docs/performance.md has a record of what measured it, when and with which versions.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from pathlib import Path

import torch

# The throughput run's summary.json keys a record carries, under the same names.
SUMMARY_KEYS = ("tokens_per_s", "mfu", "step_time_s/p50", "mem/peak_gb", "mem/host_peak_gb")


def device_name() -> str:
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def _optional(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def profile_figures(out: Path) -> dict | None:
    """What the analyser found in the profiled throughput steps: time by kernel class with
    achieved TFLOP/s, the compute/memory-bound split, the breakdown per rank, the advice."""
    report = _optional(out / "runs" / "profile" / "analysis" / "report.json")
    if report is None:
        return None
    keys = ("kernel_classes", "bound_shares", "peak_flops", "per_rank", "top_ops")
    return {
        **{key: report[key] for key in keys},
        "advice": [{"kind": a["kind"], "finding": a["finding"]} for a in report["advice"]],
    }


def record(out: Path, command: str, date: dt.date, device: str) -> dict:
    """Everything one GPU check measured, with what it ran on."""
    summary = json.loads((out / "runs" / "throughput" / "summary.json").read_text())
    ladder = json.loads((out / "ladder.json").read_text())
    return {
        "date": date.isoformat(),
        "device": device,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "command": command,
        **{key: summary[key] for key in SUMMARY_KEYS},
        "ladder": {"overrides": ladder["overrides"], "rows": ladder["rows"]},
        "profile": profile_figures(out),
        "multirank": _optional(out / "multirank.json"),
        "model_cost": _optional(out / "model_cost.json"),
        "overhead": _optional(out / "overhead.json"),
    }


def file_name(date: dt.date, device: str) -> str:
    """`2026-12-01-nvidia-h200.json`: the device name lower-cased, runs of anything but
    letters and digits turned into one dash."""
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    return f"{date.isoformat()}-{slug}.json"


def write(rec: dict, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / file_name(dt.date.fromisoformat(rec["date"]), rec["device"])
    path.write_text(json.dumps(rec, indent=1) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder gpu_check.sh wrote")
    parser.add_argument("--dest", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--command", default="bash benchmarks/gpu_check.sh")
    args = parser.parse_args(argv)
    rec = record(args.out, args.command, dt.date.today(), device_name())
    print(f"results: {write(rec, args.dest)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
