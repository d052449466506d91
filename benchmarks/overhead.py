"""The launcher's own overhead: the trainer against a bare loop, side by side in one run.

    python benchmarks/overhead.py [--pairs 8] [--steps 60] [overrides...]

The verdict: the trainer's work per step at most TARGET (1.0x) the bare loop's, the median
of the pairs' ratios, with their spread and the machine's load printed beside it.

Both sides train the same model (same seed) on the same token windows in the same order,
with the same batch, accumulation, AdamW, clipping, device, precision and torch.compile
setting, without torchrun. The trainer adds its DataLoader, metrics, sinks (metrics.jsonl,
console), stop vote, hang watchdog, checkpoint and eval bookkeeping; the bare loop indexes
the dataset directly and does nothing else.

Each run's time per step is measured inside its loop: wall seconds from the end of the
first logged step (`trainer.log_interval`) to the end of the last, divided by the steps
between (the trainer's `elapsed_s` of those two metrics.jsonl records; the bare loop's
clock at the same two points, the device synchronised), and the process's CPU seconds
between the same two points (the trainer's read where its recorder makes those records: the
one thing this file adds to it). On a CPU device the verdict is on CPU seconds, which a
neighbour's load does not inflate (wall seconds count the time the process waited for a
core); on a GPU, where the host's CPU time is not the step's, on wall seconds. Start-up,
the first steps (allocator, compilation), the final eval and checkpoint fall outside the
window; the trainer's logging, every `log_interval` steps, falls inside it. The two sides
run alternately in this one process, `--pairs` times, each pair in the opposite order of
the last, and the verdict is the median of the pairs' trainer / bare ratios: a pair's two
runs are seconds apart, so a neighbour's burst or a clock change hits both alike.

On Linux with glibc the allocator is pinned for the whole process first (no mmap for large
blocks, no trimming of the heap): with glibc's defaults every tensor above 32 MB (the
logits) is mmapped and unmapped on each use, and on this 2-core VM the page faults that
causes varied from 6,600 to 48,000 per step between runs of the same side, decided more of
a run's time than the launcher does, and made the ratio swing by tens of percent.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import torch

from launcher.config import compose
from launcher.config.batch import BatchPlan
from launcher.data.loader import StepBatchSampler
from launcher.data.prepare import prepare_data
from launcher.model.build import build_model, loss_function
from launcher.observe.recorder import Recorder
from launcher.runtime.launch_state import LaunchState
from launcher.runtime.process import pick_device, seed_everything
from launcher.strategy.base import compile_mode
from launcher.strategy.ddp.engine import AUTOCAST_DTYPES
from launcher.strategy.optim import build_optimizer
from launcher.train import job
from launcher.train.bad_input import check_or_exit
from launcher.train.loop import lr_at

TARGET = 1.0  # the trainer's work per step at most the bare loop's (the median of pairs)
CPU_S = "benchmark/cpu_s"  # the process's CPU seconds when a record is made (this file's)
# Eval and checkpoints only at the end (outside the window): they are work the user asked
# for, not overhead. No DataLoader workers by default: on a CPU-only machine they compete
# with the compute threads for the same cores, a cost a GPU node does not pay (pass
# data.num_workers=2 to measure it anyway).
DEFAULTS = [
    "trainer.log_interval=10",
    "trainer.eval_interval=100000",
    "trainer.checkpoint_interval=100000",
    "data.num_workers=0",
    "data.persistent_workers=false",
]
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's mallopt parameters (malloc.h)


def pin_allocator() -> bool:
    """Keep freed memory in glibc's heap for reuse: no mmap per large block, no trimming.
    False where the C library is not glibc (the figures are then as noisy as it makes them)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
    except (OSError, AttributeError):
        return False


def window(cfg) -> tuple[int, int]:
    """The first and last logged steps: the window both sides are timed over."""
    t = cfg.trainer
    return t.log_interval, t.max_steps


class CPUStampedRecorder(Recorder):
    """The trainer's recorder, each interval's record stamped with the process's CPU
    seconds where its `elapsed_s` is taken: the window's CPU time, read from the trainer."""

    def interval(self, *args, **kwargs) -> dict:
        return {**super().interval(*args, **kwargs), CPU_S: time.process_time()}


def trainer_step_times(overrides: list[str]) -> dict[str, float]:
    """Wall and CPU seconds per step of the trainer over the window, from its own
    metrics.jsonl."""
    with tempfile.TemporaryDirectory() as root:
        cfg = compose([*overrides, f"run.root={root}", "run.id=trainer", "resume=never"])
        check_or_exit(cfg)
        with mock.patch.object(job, "Recorder", CPUStampedRecorder):
            if job.run(cfg, LaunchState()) != 0:
                raise SystemExit("the trainer run failed")
        first, last = window(cfg)
        lines = (Path(root) / "trainer" / "metrics.jsonl").read_text().splitlines()
        records = {r["step"]: r for r in map(json.loads, lines) if "elapsed_s" in r}
    return {
        figure: (records[last][key] - records[first][key]) / (last - first)
        for figure, key in (("wall", "elapsed_s"), ("cpu", CPU_S))
    }


def trainer_per_step(overrides: list[str]) -> float:
    """Wall seconds per step of the trainer over the window."""
    return trainer_step_times(overrides)["wall"]


def bare_per_step(overrides: list[str], rank: int = 0, world_size: int = 1) -> float:
    """Wall seconds per step of the bare loop over the same window; with `world_size` above
    1 (under torchrun, the gloo group made), each rank's share of the batch and the model
    wrapped in plain DDP: the bare step at that world size (benchmarks/scale.py)."""
    return bare_step_times(overrides, rank, world_size)["wall"]


def bare_step_times(overrides: list[str], rank: int = 0, world_size: int = 1) -> dict[str, float]:
    """Wall and CPU seconds per step of the bare loop over the window."""
    cfg = compose(overrides)
    t = cfg.trainer
    device = pick_device(t.device, local_rank=0)
    sync = torch.distributed.barrier if world_size > 1 else lambda: None
    data = prepare_data(cfg.data, seq_len=t.seq_len, seed=t.seed, is_builder=rank == 0, wait=sync)
    seed_everything(t.seed)
    model = build_model(
        cfg.model, data.vocab_size, eot_id=data.eot_id, grad_checkpointing=t.grad_checkpointing
    ).to(device)
    optimizer = build_optimizer(model, t)
    if world_size > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    module = (
        model if t.compile == "off" else torch.compile(model, mode=compile_mode(t.compile, device))
    )
    dtype = AUTOCAST_DTYPES.get(t.precision)
    scaler = torch.amp.GradScaler(device.type, enabled=t.precision == "fp16")
    plan = BatchPlan.of(t, world_size=world_size)
    order = iter(StepBatchSampler(len(data.train), plan, rank=rank, seed=t.seed, start_step=0))
    loss_of = loss_function(cfg.model)
    first, last = window(cfg)
    marks = {}
    for step in range(t.max_steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, t)
        for micro in range(plan.accum):
            windows = (data.train[i] for i in next(order))
            x, y = (torch.stack(z).to(device) for z in zip(*windows, strict=True))
            last_micro = micro == plan.accum - 1  # DDP all-reduces only there, as the trainer
            with contextlib.nullcontext() if world_size == 1 or last_micro else model.no_sync():
                with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                    loss = loss_of(module, x, y)
                scaler.scale(loss / plan.accum).backward()
        scaler.unscale_(optimizer)
        if t.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if step + 1 in (first, last):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            marks[step + 1] = (time.perf_counter(), time.process_time())
    return {
        figure: (marks[last][i] - marks[first][i]) / (last - first)
        for i, figure in enumerate(("wall", "cpu"))
    }


SIDES = {"trainer": trainer_step_times, "bare": bare_step_times}


def paired_runs(count: int, sides: dict[str, Callable[[], float | dict]]) -> list[dict]:
    """`count` pairs of per-step seconds of two sides (a figure, or {figure: seconds}), their
    order alternating from pair to pair so that a drift of the machine lands on both; each
    pair said on stderr with the load average."""
    a, b = sides
    pairs = []
    for n in range(count):
        order = (a, b) if n % 2 == 0 else (b, a)
        with contextlib.redirect_stdout(sys.stderr):  # the trainer's console
            got = {side: sides[side]() for side in order}
        pairs.append({a: got[a], b: got[b]})  # in the sides' order, whichever ran first
        said = [
            f"{what} {a} {figure(got[a], what) * 1e3:.2f} ms, {b} {figure(got[b], what) * 1e3:.2f} "
            f"({(figure(got[a], what) / figure(got[b], what) - 1) * 100:+.1f}%)"
            for what in (("wall", "cpu") if isinstance(got[a], dict) else ("",))
        ]
        print(f"pair {n + 1}: " + "; ".join(said) + f" (load {os.getloadavg()[0]:.1f})",
              file=sys.stderr)  # fmt: skip
    return pairs


def figure(measured: float | dict, what: str) -> float:
    """A side's seconds per step: the figure itself, or its `what` ("wall", "cpu")."""
    return measured[what] if isinstance(measured, dict) else measured


def spread(ratios: list[float]) -> str:
    """The pairs' ratios as a reader judges a median by: the lowest, the quartiles, the
    highest."""
    q1, q2, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    return f"min {min(ratios):.3f}, quartiles {q1:.3f} {q2:.3f} {q3:.3f}, max {max(ratios):.3f}"


def verdict(
    pairs: list[dict], target: float, out: Path | None, figures: dict, judged: str = "wall"
) -> int:
    """The median of the pairs' ratios (first side over second, of the `judged` figure)
    against `target` (a ratio), printed with their spread and written to `out` with
    `figures`: exit code 0 within it, 1 over."""
    a, b = pairs[0]
    ratios = {
        what: [figure(p[a], what) / figure(p[b], what) for p in pairs]
        for what in (("wall", "cpu") if isinstance(pairs[0][a], dict) else ("wall",))
    }
    ratio = statistics.median(ratios[judged])
    within = ratio <= target
    if out:
        figures |= {"pairs_s": pairs, "ratio": ratio, "judged": judged, "target": target}
        figures |= {"ratios": ratios, "within": within, "load": os.getloadavg()}
        out.write_text(json.dumps(figures, indent=1))
    print()
    for what, values in ratios.items():
        print(f"{a} / {b}, {what} seconds per step, {len(values)} pairs: median "
              f"{statistics.median(values):.3f} ({spread(values)})")  # fmt: skip
    print(f"Judged on {judged} seconds: {ratio:.3f}. {'Within' if within else 'OVER'} the "
          f"{target:.2f}x target. Load average now {os.getloadavg()[0]:.1f}.")  # fmt: skip
    return 0 if within else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8, help="trainer/bare pairs of runs")
    parser.add_argument("--steps", type=int, default=60, help="steps per run")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    overrides = [*DEFAULTS, *args.overrides]
    cfg = compose([*overrides, f"trainer.max_steps={args.steps}"])
    first, last = window(cfg)
    if last <= first or last % first:
        raise SystemExit(
            f"--steps={args.steps} must be a multiple of trainer.log_interval={first} above "
            "it: the window runs from the first logged step to the last"
        )
    if "OMP_NUM_THREADS" not in os.environ:  # what torchrun gives each worker; less noisy
        torch.set_num_threads(1)
    device = pick_device(cfg.trainer.device, local_rank=0)
    print(f"allocator pinned: {pin_allocator()}", file=sys.stderr)
    load = os.getloadavg()[0]
    with contextlib.redirect_stdout(sys.stderr):  # the trainer's console goes to stderr
        for measure in SIDES.values():  # imports, kernels and compilation caches warm
            measure([*overrides, f"trainer.max_steps={first + 1}"])
    timed = [*overrides, f"trainer.max_steps={args.steps}"]
    pairs = paired_runs(
        args.pairs, {side: lambda m=measure: m(timed) for side, measure in SIDES.items()}
    )

    tokens_per_step = BatchPlan.of(cfg.trainer, world_size=1).tokens_per_step
    threads = torch.get_num_threads()
    print(f"\n{last - first}-step window, {args.pairs} pairs, {device}, {threads} thread(s), "
          f"load average {load:.1f} at the start")  # fmt: skip
    print("| loop    | wall ms/step (median) | CPU ms/step (median) | tokens/s (wall) |")
    print("|---------|-----------------------|----------------------|-----------------|")
    for side in ("bare", "trainer"):
        wall, cpu = (statistics.median(p[side][what] for p in pairs) for what in ("wall", "cpu"))
        print(f"| {side:<7} | {wall * 1e3:21.2f} | {cpu * 1e3:20.2f} | "
              f"{tokens_per_step / wall:15,.0f} |")  # fmt: skip
    figures = {"device": str(device), "overrides": args.overrides, "window_steps": last - first}
    judged = "cpu" if device.type == "cpu" else "wall"
    return verdict(pairs, TARGET, args.out, figures, judged)


if __name__ == "__main__":
    sys.exit(main())
