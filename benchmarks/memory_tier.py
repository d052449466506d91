"""What the memory tier costs per step: the trainer with it on against the same trainer with
it off, side by side in one run; and how its work grows with the state (--growth).

    python benchmarks/memory_tier.py [--pairs 8] [--steps 60] [--interval 10] [overrides...]
    python benchmarks/memory_tier.py --growth gpt2-tiny,gpt2,gpt2-medium [--ranks 1,2]

Both sides are the trainer at the default job's shape (gpt2-tiny, 16 sequences of 128
tokens per step, micro-batches of 4), one process, eval and durable checkpoints outside the
window, as benchmarks/overhead.py runs it and with its helpers: the same window (the first
logged step to the last, from the trainer's own metrics.jsonl), the allocator pinned, the
two sides alternating, each pair in the opposite order of the last, and the verdict the
median of the pairs' on / off ratios. "On" writes a memory checkpoint every `--interval`
steps into trainer.memory_checkpoint_dir (default /dev/shm): the copy of the state between
two steps, the thread's write while the next step runs, and the seal after it.

--growth times the tier's own work, per rank, for each model size: DDP's model and AdamW
state (after an optimizer step, so the moments exist) cut into the part one rank of a node
of `--ranks` ranks copies (launcher.checkpoint.memory.node_share, as the trainer does), the copy to
host memory and the write into /dev/shm, medians of `--repeats`. What grows with the state
is the bytes; the table shows whether the time per byte stays flat (it should: a copy and a
write), and what a rank's share of a node costs as the node's ranks split it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
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

from launcher.checkpoint import memory
from launcher.checkpoint.memory import node_share
from launcher.config import compose
from launcher.config.model_shape import GPT2_VOCAB, param_count
from launcher.model.build import build_model
from launcher.runtime.process import pick_device
from launcher.strategy.base import host_copy

TARGET = 1.03  # the tier may cost at most 3% of a step


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8, help="on/off pairs of runs")
    parser.add_argument("--steps", type=int, default=60, help="steps per run")
    parser.add_argument("--interval", type=int, default=10, help="steps between memory saves")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    parser.add_argument("--growth", help="model sizes, comma-separated: time the tier's work")
    parser.add_argument("--ranks", default="1,2", help="with --growth: ranks per node")
    parser.add_argument("--repeats", type=int, default=3, help="with --growth: timings each")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    if args.growth:
        return growth(args)
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
    return verdict(pairs, TARGET, args.out, figures)


def state_of(model_name: str) -> tuple[int, dict]:
    """(parameters, DDP's two memory-tier files) of `model_name` after one AdamW step."""
    cfg = compose([f"model={model_name}"])
    model = build_model(cfg.model, int(cfg.model.vocab_size or GPT2_VOCAB))
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    opt.step()
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    optimizer = {"optimizer": opt.state_dict(), "scaler": scaler.state_dict()}
    files = {"model.pt": model.state_dict(), "optimizer.pt": optimizer}
    return param_count(cfg.model), files


def time_part(files: dict, share: node_share.NodeShare, repeats: int) -> tuple[int, float, float]:
    """(bytes, copy s, write s) of one rank's part: medians of `repeats`."""
    copies, writes, size = [], [], 0
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(dir=memory.SHM) as folder:
            start = time.perf_counter()
            part = host_copy(node_share.part_of(files, share))
            copied = time.perf_counter()
            node_share.write(Path(folder), part)
            writes.append(time.perf_counter() - copied)
            copies.append(copied - start)
            size = (Path(folder) / node_share.PART_FILE).stat().st_size
            del part
    return size, statistics.median(copies), statistics.median(writes)


def growth(args) -> int:
    """The tier's copy and write per rank against the state's size (see the docstring)."""
    ranks = [int(r) for r in args.ranks.split(",")]
    rows = []
    print("| model | parameters | ranks a node | written per rank | copy | write | GB/s |")
    print("|-------|-----------:|-------------:|-----------------:|-----:|------:|-----:|")
    for name in args.growth.split(","):
        params, files = state_of(name)
        for n in ranks:
            # The largest part, the one that sets the node's pace (all copy at once).
            timed = [time_part(files, node_share.NodeShare(i, tuple(range(n))), args.repeats)
                     for i in range(n)]  # fmt: skip
            size, copy_s, write_s = max(timed)
            rate = size / (copy_s + write_s) / 1e9
            rows.append({"model": name, "params": params, "ranks_per_node": n, "bytes": size,
                         "copy_s": copy_s, "write_s": write_s, "gb_per_s": rate})  # fmt: skip
            print(f"| {name} | {params / 1e6:.1f}M | {n} | {size / 1e6:.1f} MB | "
                  f"{copy_s * 1e3:.0f} ms | {write_s * 1e3:.0f} ms | {rate:.2f} |")  # fmt: skip
        del files
    if args.out:
        args.out.write_text(json.dumps({"growth": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
