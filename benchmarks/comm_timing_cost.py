"""What the per-step communication timing costs: timed and untimed DDP side by side.

    torchrun --standalone --nproc_per_node=2 benchmarks/comm_timing_cost.py [--steps N] [k=v...]

Two DDP strategies wrap two copies of the same model on the same process group: one with
`strategy.time_comm=true` (the launcher's all-reduce hook recording CommTimer events,
figures drained every `trainer.log_interval` steps as the trainer does),
one with `strategy.time_comm=false` (DDP's built-in C++ all-reduce, nothing recorded).
Steps alternate between them on the same batches (ABAB...), so drift on a noisy machine
hits both alike. Each step is timed with the device synchronised at its end (this
benchmark's own timing, not the trainer's). The verdict is the median over pairs of
timed / untimed step time: the measurement must cost under 2%.

Defaults are the worst case for the timer: many small buckets (0.05 MB) per step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from launcher.config import compose, normalize, typed
from launcher.data.prepare import prepare_data
from launcher.model.build import build_model, model_loss
from launcher.runtime.launch_state import LaunchState
from launcher.runtime.placement import env_world
from launcher.runtime.process import RuntimeConfig, start, teardown
from launcher.strategy.ddp.engine import DDPStrategy

BUDGET = 0.02
DEFAULTS = ["strategy.bucket_cap_mb=0.05", "data.num_workers=0", "data.persistent_workers=false"]


def one_step(strategy: DDPStrategy, impl: str, x: torch.Tensor, y: torch.Tensor, device) -> float:
    begin = time.perf_counter()
    with strategy.autocast():
        loss = model_loss(strategy.module, impl, x, y)
    strategy.backward(loss)
    strategy.step(1e-4)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - begin


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="pairs of steps measured")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    root = Path(tempfile.gettempdir()) / "launcher-bench"  # the same path on every rank
    cfg = compose([*DEFAULTS, *args.overrides, f"run.root={root}", "run.id=comm_timing"])
    launch = LaunchState()
    normalize(cfg, env_world()[2])
    cfg = typed(cfg)
    rt = start(RuntimeConfig.of(cfg), launch)
    if not rt.distributed:
        raise SystemExit("run under torchrun: there is no communication to time otherwise")
    t = cfg.trainer
    data = prepare_data(
        cfg.data, seq_len=t.seq_len, seed=t.seed, is_builder=rt.local_rank == 0, wait=rt.barrier
    )
    sides = {}
    for timed in (True, False):
        cfg.strategy.time_comm = timed
        torch.manual_seed(t.seed)
        model = build_model(cfg.model, data.vocab_size, eot_id=data.eot_id)
        sides[timed] = DDPStrategy(cfg.strategy, cfg.trainer, rt, model)
    windows = [data.train[i] for i in range(t.micro_batch_size)]
    x = torch.stack([w[0] for w in windows]).to(rt.device)
    y = torch.stack([w[1] for w in windows]).to(rt.device)
    pairs = []
    for i in range(args.warmup + args.steps):
        order = (True, False) if i % 2 == 0 else (False, True)
        got = {timed: one_step(sides[timed], cfg.model.impl, x, y, rt.device) for timed in order}
        if (i + 1) % t.log_interval == 0:
            sides[True].drain_comm()  # reading the figures is part of the cost
        if i >= args.warmup:
            pairs.append(got)
    comm = sides[True].drain_comm()
    buckets = sides[True].comm_buckets()
    for side in sides.values():
        side.close()
    sides.clear()
    teardown(launch)
    if rt.rank != 0:
        return 0
    ratio = statistics.median(p[True] / p[False] for p in pairs)
    timed_ms = statistics.median(p[True] for p in pairs) * 1e3
    untimed_ms = statistics.median(p[False] for p in pairs) * 1e3
    last = comm[-1] if comm else None
    print(
        f"device {rt.device}, {rt.world_size} ranks, {buckets} buckets per step, "
        f"{len(pairs)} pairs of steps"
    )
    print(f"untimed (DDP built-in all-reduce): {untimed_ms:8.2f} ms/step (median)")
    print(f"timed   (launcher hook + CommTimer): {timed_ms:6.2f} ms/step (median)")
    if last is not None:
        print(
            f"last step's figures: all-reduce {last.allreduce_s * 1e3:.2f} ms, exposed "
            f"{last.exposed_s * 1e3:.2f} ms, {last.bytes:,} bytes"
        )
    within = ratio - 1 <= BUDGET
    print(
        f"timed / untimed, median of paired steps: {ratio:.4f} ({(ratio - 1) * 100:+.2f}%). "
        f"{'Within' if within else 'OVER'} the {BUDGET:.0%} budget."
    )
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
