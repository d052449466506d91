"""The launcher's own overhead: the trainer against a bare loop, side by side in one run.

    python benchmarks/overhead.py [--rounds 4] [overrides...]

Each side runs in a fresh process of its own. Both train the same model (same seed) on the
same token windows in the same order with the same batch, accumulation, AdamW and clipping,
in one process without torchrun. The trainer adds its DataLoader, metrics,
sinks (metrics.jsonl, console) and checkpoint/eval bookkeeping; the bare loop indexes the
dataset directly and does nothing else. Each side's time per step is the median over log
intervals of wall time / steps (the first interval, with start-up, is left out), so the
trainer's logging work between steps is counted. Rounds alternate in ABBA order so that
machine noise hits both alike; the verdict is the median of the rounds' paired ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from launcher.config import compose
from launcher.data import prepare_data
from launcher.data.loader import StepBatchSampler
from launcher.loop import lm_loss, lr_at
from launcher.model import build_model
from launcher.runtime import seed_everything
from launcher.strategy.ddp import build_optimizer
from launcher.train import run

BUDGET = 0.03  # the trainer may be at most 3% slower per step than the bare loop
# Eval and checkpoints only at the end: they are work the user asked for, not overhead.
# No DataLoader workers by default: on a CPU-only machine they compete with the compute
# threads for the same cores, a cost a GPU node does not pay (pass data.num_workers=2 to
# measure it anyway).
DEFAULTS = [
    "trainer.max_steps=120",
    "trainer.log_interval=10",
    "trainer.eval_interval=1000",
    "trainer.checkpoint_interval=1000",
    "data.num_workers=0",
    "data.persistent_workers=false",
]


def trainer_step_time(overrides: list[str], root: Path) -> float:
    cfg = compose([*overrides, f"run.root={root}", "run.id=trainer", "resume=never"])
    if run(cfg) != 0:
        raise SystemExit("the trainer run failed")
    records = [
        json.loads(ln) for ln in (root / "trainer" / "metrics.jsonl").read_text().splitlines()
    ]
    records = [r for r in records if "loss" in r]
    per_step = [
        (b["elapsed_s"] - a["elapsed_s"]) / (b["step"] - a["step"])
        for a, b in zip(records[1:], records[2:], strict=False)
    ]
    return statistics.median(per_step)


def bare_step_time(overrides: list[str]) -> float:
    cfg = compose(overrides)
    t = cfg.trainer
    data = prepare_data(
        cfg.data, seq_len=t.seq_len, seed=t.seed, is_builder=True, wait=lambda: None
    )
    seed_everything(t.seed)
    model = build_model(cfg.model, data.vocab_size, eot_id=data.eot_id)
    optimizer = build_optimizer(model, t, torch.device("cpu"))
    accum = t.global_batch_size // t.micro_batch_size
    order = iter(
        StepBatchSampler(
            len(data.train),
            global_batch=t.global_batch_size,
            micro_batch=t.micro_batch_size,
            rank=0,
            world_size=1,
            seed=t.seed,
            start_step=0,
        )
    )
    marks = [time.perf_counter()]
    for step in range(t.max_steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, t)
        for _ in range(accum):
            x, y = (torch.stack(z) for z in zip(*(data.train[i] for i in next(order)), strict=True))
            loss = lm_loss(model(input_ids=x).logits, y)
            (loss / accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if (step + 1) % t.log_interval == 0:
            marks.append(time.perf_counter())
    per_step = [(b - a) / t.log_interval for a, b in zip(marks[1:], marks[2:], strict=False)]
    return statistics.median(per_step)


def measure(side: str, overrides: list[str]) -> float:
    """One side in a fresh process, so neither inherits the other's allocator or threads."""
    cmd = [sys.executable, __file__, "--side", side, *overrides]
    # One intra-op thread per process unless the caller says otherwise: what torchrun gives
    # each worker by default, and far less noisy on a small machine.
    env = {"OMP_NUM_THREADS": "1", **os.environ}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{side} run failed:\n{done.stderr[-3000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--side", choices=("trainer", "bare"), help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    overrides = [*DEFAULTS, *args.overrides]
    if args.side == "trainer":
        with tempfile.TemporaryDirectory() as root:
            print(trainer_step_time(overrides, Path(root)))
        return 0
    if args.side == "bare":
        print(bare_step_time(overrides))
        return 0
    cfg = compose(overrides)
    tokens_per_step = cfg.trainer.global_batch_size * cfg.trainer.seq_len
    times: dict[str, list[float]] = {"trainer": [], "bare": []}
    for r in range(args.rounds):
        # ABBA order: a drift in machine speed during the run hits both sides alike.
        order = ("trainer", "bare") if r % 2 == 0 else ("bare", "trainer")
        for side in order:
            times[side].append(measure(side, args.overrides))
        print(
            f"round {r + 1}: trainer {times['trainer'][-1] * 1e3:.2f} ms/step, "
            f"bare {times['bare'][-1] * 1e3:.2f} ms/step",
            file=sys.stderr,
        )
    trainer, bare = statistics.median(times["trainer"]), statistics.median(times["bare"])
    # Each round's two sides ran back to back: their ratio is the paired, less noisy figure.
    ratio = statistics.median(t / b for t, b in zip(times["trainer"], times["bare"], strict=True))
    print("\n| loop    | ms/step | tokens/s |\n|---------|---------|----------|")
    print(f"| bare    | {bare * 1e3:7.2f} | {tokens_per_step / bare:8,.0f} |")
    print(f"| trainer | {trainer * 1e3:7.2f} | {tokens_per_step / trainer:8,.0f} |")
    within = ratio - 1 <= BUDGET
    print(
        f"\ntrainer / bare (median of the rounds' ratios) = {ratio:.3f} "
        f"({(ratio - 1) * 100:+.1f}%): {'within' if within else 'OVER'} the {BUDGET:.0%} budget"
    )
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
