"""The launcher's own overhead: the trainer against a bare loop, side by side in one run.

    python benchmarks/overhead.py [--rounds 3] [overrides...]

Both sides train the same model (same seed) on the same token windows in the same order,
with the same batch, accumulation, AdamW and clipping, in one process without torchrun. The
trainer adds its DataLoader, metrics, sinks (metrics.jsonl, console), stop vote, checkpoint
and eval bookkeeping; the bare loop indexes the dataset directly and does nothing else.

Each side runs in a fresh process of its own: a 2-step warm-up, then a SHORT and a LONG run,
and its time per step is (LONG run - SHORT run) / (LONG - SHORT steps). The difference
cancels start-up, the final eval and checkpoint, and everything else that does not grow
with the number of steps; what remains is the per-step cost, logging included. Both the
process CPU time (the verdict: another tenant stealing the core does not count) and the
wall time are reported. Rounds alternate which side goes first; the figures are medians.
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

import torch

from launcher.batch import BatchPlan
from launcher.config import compose
from launcher.data import prepare_data
from launcher.data.loader import StepBatchSampler
from launcher.job import check_or_exit, run
from launcher.launch_state import LaunchState
from launcher.loop import lm_loss, lr_at
from launcher.model import build_model
from launcher.runtime import seed_everything
from launcher.strategy.optim import build_optimizer

BUDGET = 0.03  # the trainer may be at most 3% slower per step than the bare loop
SHORT, LONG = 20, 100
# Eval and checkpoints only at the end (cancelled by the difference): they are work the
# user asked for, not overhead. No DataLoader workers by default: on a CPU-only machine they
# compete with the compute threads for the same cores, a cost a GPU node does not pay
# (pass data.num_workers=2 to measure it anyway).
DEFAULTS = [
    "trainer.log_interval=10",
    "trainer.eval_interval=100000",
    "trainer.checkpoint_interval=100000",
    "data.num_workers=0",
    "data.persistent_workers=false",
]


def run_trainer(overrides: list[str]) -> None:
    with tempfile.TemporaryDirectory() as root:
        cfg = compose([*overrides, f"run.root={root}", "run.id=trainer", "resume=never"])
        check_or_exit(cfg)
        if run(cfg, LaunchState()) != 0:
            raise SystemExit("the trainer run failed")


def run_bare(overrides: list[str]) -> None:
    cfg = compose(overrides)
    t = cfg.trainer
    data = prepare_data(
        cfg.data, seq_len=t.seq_len, seed=t.seed, is_builder=True, wait=lambda: None
    )
    seed_everything(t.seed)
    model = build_model(cfg.model, data.vocab_size, eot_id=data.eot_id)
    optimizer = build_optimizer(model, t)
    plan = BatchPlan.of(t, world_size=1)
    accum = plan.accum
    sampler = StepBatchSampler(len(data.train), plan, rank=0, seed=t.seed, start_step=0)
    order = iter(sampler)
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


def side_per_step(side: str, overrides: list[str]) -> dict[str, float]:
    """This process's per-step CPU and wall time for one side, by differencing two runs."""
    train = run_trainer if side == "trainer" else run_bare
    train([*overrides, "trainer.max_steps=2"])  # imports, allocator and kernels warm
    spent = {}
    for steps in (SHORT, LONG):
        cpu, wall = time.process_time(), time.perf_counter()
        train([*overrides, f"trainer.max_steps={steps}"])
        spent[steps] = (time.process_time() - cpu, time.perf_counter() - wall)
    return {
        "cpu": (spent[LONG][0] - spent[SHORT][0]) / (LONG - SHORT),
        "wall": (spent[LONG][1] - spent[SHORT][1]) / (LONG - SHORT),
    }


def measure(side: str, overrides: list[str]) -> dict[str, float]:
    """One side in a fresh process, so neither inherits the other's allocator or threads."""
    cmd = [sys.executable, __file__, "--side", side, *overrides]
    # One intra-op thread per process unless the caller says otherwise: what torchrun gives
    # each worker by default, and far less noisy on a small machine.
    env = {"OMP_NUM_THREADS": "1", **os.environ}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{side} run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--side", choices=("trainer", "bare"), help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    overrides = [*DEFAULTS, *args.overrides]
    if args.side:
        print(json.dumps(side_per_step(args.side, overrides)))
        return 0
    cfg = compose(overrides)
    tokens_per_step = cfg.trainer.global_batch_size * cfg.trainer.seq_len
    rounds = []
    for r in range(args.rounds):
        order = ("trainer", "bare") if r % 2 == 0 else ("bare", "trainer")
        got = {side: measure(side, args.overrides) for side in order}
        rounds.append(got)
        print(
            f"round {r + 1}: trainer {got['trainer']['cpu'] * 1e3:.2f} ms CPU "
            f"({got['trainer']['wall'] * 1e3:.2f} wall) per step, bare "
            f"{got['bare']['cpu'] * 1e3:.2f} ms CPU ({got['bare']['wall'] * 1e3:.2f} wall)",
            file=sys.stderr,
        )

    def median(side, kind):
        return statistics.median(r[side][kind] for r in rounds)

    def ratio(kind):
        return statistics.median(r["trainer"][kind] / r["bare"][kind] for r in rounds)

    print("\n| loop    | CPU ms/step | wall ms/step | tokens/s (wall) |")
    print("|---------|-------------|--------------|-----------------|")
    for side in ("bare", "trainer"):
        cpu, wall = median(side, "cpu"), median(side, "wall")
        tokens_per_s = tokens_per_step / wall
        print(f"| {side:<7} | {cpu * 1e3:11.2f} | {wall * 1e3:12.2f} | {tokens_per_s:15,.0f} |")
    cpu_ratio, wall_ratio = ratio("cpu"), ratio("wall")
    within = cpu_ratio - 1 <= BUDGET
    print(
        f"\ntrainer / bare, CPU time: {cpu_ratio:.3f} ({(cpu_ratio - 1) * 100:+.1f}%); "
        f"wall time: {wall_ratio:.3f} ({(wall_ratio - 1) * 100:+.1f}%). "
        f"{'Within' if within else 'OVER'} the {BUDGET:.0%} budget (judged on CPU time)."
    )
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
