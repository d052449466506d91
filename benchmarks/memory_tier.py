"""What the memory tier costs per step: the trainer with it on against the same trainer with
it off, side by side in one run.

    python benchmarks/memory_tier.py [--pairs 8] [--steps 60] [--interval 10] [overrides...]

Both sides are the trainer at the default job's shape (gpt2-tiny, 16 sequences of 128
tokens per step, micro-batches of 4), one process, eval and durable checkpoints outside the
window, as benchmarks/overhead.py runs it and with its helpers: the same window (the first
logged step to the last, from the trainer's own metrics.jsonl), the allocator pinned, the
two sides alternating, each pair in the opposite order of the last, and the verdict the
median of the pairs' on / off ratios. "On" writes a memory checkpoint every `--interval`
steps into trainer.memory_checkpoint_dir (default /dev/shm): the copy of the state between
two steps, the thread's write while the next step runs, and the seal after it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
from pathlib import Path

import torch
from overhead import (  # benchmarks/ is on the path
    DEFAULTS,
    paired_runs,
    pin_allocator,
    trainer_per_step,
    verdict,
    window,
)

from launcher.config import compose
from launcher.runtime.process import pick_device

BUDGET = 0.03  # the tier may cost at most 3% of a step (issue 30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8, help="on/off pairs of runs")
    parser.add_argument("--steps", type=int, default=60, help="steps per run")
    parser.add_argument("--interval", type=int, default=10, help="steps between memory saves")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    overrides = [*DEFAULTS, *args.overrides]
    first, last = window(compose([*overrides, f"trainer.max_steps={args.steps}"]))
    if last <= first or last % first:
        raise SystemExit(
            f"--steps={args.steps} must be a multiple of trainer.log_interval={first} above it"
        )
    sides = {
        "on": [*overrides, f"trainer.memory_checkpoint_interval={args.interval}"],
        "off": [*overrides, "trainer.memory_checkpoint_interval=0"],
    }
    steps = f"trainer.max_steps={args.steps}"
    if "OMP_NUM_THREADS" not in os.environ:  # what torchrun gives each worker; less noisy
        torch.set_num_threads(1)
    device = pick_device(compose(overrides).trainer.device, local_rank=0)
    print(f"allocator pinned: {pin_allocator()}", file=sys.stderr)
    with contextlib.redirect_stdout(sys.stderr):  # warm imports, kernels and the token cache
        trainer_per_step([*sides["on"], f"trainer.max_steps={first + 1}"])
    pairs = paired_runs(
        args.pairs, {side: lambda o=sides[side]: trainer_per_step([*o, steps]) for side in sides}
    )
    print(f"\n{last - first}-step window, a memory checkpoint every {args.interval} steps, "
          f"{args.pairs} pairs, {device}, {torch.get_num_threads()} thread(s)")  # fmt: skip
    print("| memory tier | ms/step (median) |")
    print("|-------------|------------------|")
    for side in ("off", "on"):
        print(f"| {side:<11} | {statistics.median(p[side] for p in pairs) * 1e3:16.2f} |")
    figures = {"device": str(device), "overrides": args.overrides, "interval": args.interval}
    return verdict(pairs, BUDGET, args.out, figures)


if __name__ == "__main__":
    raise SystemExit(main())
