"""The optimisation ladder: what each step users are told to take buys, measured in one run.

    python benchmarks/ladder.py [--steps N] [--out FILE] [--max-micro-batch N] [overrides...]

Each rung adds one change to the previous rung, on the same model and data, through the
real trainer (one process):

  1. eager fp32, a default DataLoader (no workers, no pinned memory)
  2. + DataLoader workers, pinned memory (which is what makes the non-blocking
     host-to-device copies actually asynchronous)
  3. + bf16 autocast
  4. + torch.compile
  5. + fused AdamW and the best micro-batch that fits (doubling until memory runs out or
     tokens/s stops improving by 3%)

It prints one table (step time, tokens/s, MFU, peak memory, speed-up over rung 1) and writes
the rows as JSON. On a GPU the default is GPT-2 124M at sequence 1024 on synthetic tokens;
on a CPU, gpt2-tiny (MFU shows as n/a there: a CPU has no known peak).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
from pathlib import Path

import torch

from launcher.config import compose
from launcher.runtime.launch_state import LaunchState
from launcher.train.bad_input import check_or_exit
from launcher.train.job import run

GPU_BASE = ["model=gpt2", "data=synthetic", "trainer.seq_len=1024", "trainer.micro_batch_size=16"]
CPU_BASE = [
    "model=gpt2-tiny",
    "data=synthetic",
    "data.vocab_size=8192",
    "trainer.seq_len=256",
    "trainer.micro_batch_size=4",
]
COMMON = [
    "trainer.global_batch_size=null",
    "trainer.eval_interval=0",
    "trainer.checkpoint_interval=0",
    "trainer.warmup_steps=2",
    "trainer.log_interval=1",
]
RUNGS = [
    (
        "eager fp32, default DataLoader",
        [
            "trainer.precision=fp32",
            "trainer.compile=off",
            "trainer.fused_adamw=false",
            "data.num_workers=0",
            "data.persistent_workers=false",
            "data.pin_memory=false",
        ],
    ),
    (
        "+ workers, pinned memory, non-blocking copies",
        ["data.num_workers=2", "data.persistent_workers=true", "data.pin_memory=true"],
    ),
    ("+ bf16 autocast", ["trainer.precision=bf16"]),
    ("+ torch.compile", ["trainer.compile=default"]),
    ("+ fused AdamW, best micro-batch", ["trainer.fused_adamw=true"]),
]
GAIN = 1.03  # a larger micro-batch must add at least 3% tokens/s to be worth its memory


def train_once(overrides: list[str], root: Path, name: str) -> dict:
    """One short run through the real trainer; its summary.json figures."""
    cfg = compose([*overrides, f"run.root={root}", f"run.id={name}", "resume=never"])
    check_or_exit(cfg)
    try:
        code = run(cfg, LaunchState())
    finally:
        torch._dynamo.reset()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if code != 0:
        raise SystemExit(f"rung {name} failed with exit code {code}")
    summary = json.loads((root / name / "summary.json").read_text())
    summary["micro_batch_size"] = cfg.trainer.micro_batch_size
    summary["tokens_per_step"] = cfg.trainer.global_batch_size * cfg.trainer.seq_len
    return summary


def best_micro_batch(
    overrides: list[str], root: Path, start: int, limit: int, train=train_once
) -> dict:
    """Double the micro-batch while it fits and pays; the best run's summary. `train` runs
    one size (the trainer; tests/unit/train/test_ladder_search.py gives it a table)."""
    best = train([*overrides, f"trainer.micro_batch_size={start}"], root, f"micro{start}")
    micro = start * 2
    while micro <= limit:
        try:
            trial = train([*overrides, f"trainer.micro_batch_size={micro}"], root, f"micro{micro}")
        except torch.OutOfMemoryError:
            print(f"micro-batch {micro}: out of memory", file=sys.stderr)
            break
        if trial["tokens_per_s"] < best["tokens_per_s"] * GAIN:
            break
        best, micro = trial, micro * 2
    return best


def climb(base: list[str], steps: int, max_micro: int, root: Path) -> list[dict]:
    rows, applied = [], [*base, *COMMON, f"trainer.max_steps={steps}"]
    for index, (name, changes) in enumerate(RUNGS, start=1):
        applied = [*applied, *changes]
        if index == len(RUNGS):
            start = compose(applied).trainer.micro_batch_size
            result = best_micro_batch(applied, root, start, max_micro)
        else:
            result = train_once(applied, root, f"rung{index}")
        rows.append({"rung": index, "change": name, **_figures(result)})
        print(f"rung {index} done: {rows[-1]}", file=sys.stderr)
    first = rows[0]["tokens_per_s"]
    for row in rows:
        row["speedup"] = row["tokens_per_s"] / first
    return rows


def _figures(summary: dict) -> dict:
    keys = (
        "micro_batch_size",
        "tokens_per_step",
        "step_time_s/p50",
        "tokens_per_s",
        "mfu",
        "mem/peak_gb",
    )
    return {k: summary[k] for k in keys}


def table(rows: list[dict]) -> str:
    lines = [
        "| rung | change | micro | step ms | tokens/s | MFU | peak GB | speed-up |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mfu = "n/a" if r["mfu"] is None else f"{r['mfu'] * 100:.1f}%"
        mem = "n/a" if r["mem/peak_gb"] is None else f"{r['mem/peak_gb']:.1f}"
        lines.append(
            f"| {r['rung']} | {r['change']} | {r['micro_batch_size']} | "
            f"{r['step_time_s/p50'] * 1e3:.1f} | {r['tokens_per_s']:,.0f} | {mfu} | {mem} | "
            f"{r['speedup']:.2f}x |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="steps per rung (30 GPU, 12 CPU)")
    parser.add_argument(
        "--max-micro-batch", type=int, default=None, help="search cap (128 GPU, 16 CPU)"
    )
    parser.add_argument("--out", default="runs/ladder.json", help="where to write the rows")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides applied to every rung")
    args = parser.parse_args()
    gpu = torch.cuda.is_available()
    base = [*(GPU_BASE if gpu else CPU_BASE), *args.overrides]
    steps = args.steps or (30 if gpu else 12)
    max_micro = args.max_micro_batch or (128 if gpu else 16)
    with tempfile.TemporaryDirectory() as root:
        rows = climb(base, steps, max_micro, Path(root))
    device = torch.cuda.get_device_name(0) if gpu else "CPU"
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"device": device, "overrides": base, "steps": steps, "rows": rows}, indent=1)
    )
    print(f"\nladder on {device} ({' '.join(base)}), {steps} steps per rung; rows in {out}\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
