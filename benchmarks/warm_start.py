"""Warm start against cold: one launch and one restart, ranks forked from the agent's fork
server or started as new interpreters, side by side in one run.

    python benchmarks/warm_start.py [--pairs 3] [--nproc 8] [--out FILE] [overrides]

Each side is what a user types, into a fresh run.root each time:

    python -m launcher.torchrun --standalone --nproc_per_node=N --max-restarts=1 \\
        -m launcher.train <a short job> fault.kind=device_error fault.rank=1 fault.once=true

with `LAUNCHER_WARM_START=1` (the default: launcher.warm_start) or `0`. Rank 1 fails with a
device error at `--fault-step`, once; torchrun restarts every rank, which resume from the
last checkpoint and finish. Per launch: the wall seconds from start to exit, the CPU seconds
of every process under it (getrusage of the reaped processes, the fork server that
outlives its agent by a moment adopted and reaped here), the start (from the launch to
rank 0's first step) and the restart (from rank 1's error line to rank 0's first step after
the resume), both read from the rank logs' timestamps. The sides alternate, each pair in the
opposite order of the last; the verdict is the median over pairs of warm / cold restart
seconds, against TARGET, with the load average beside it.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import startup  # benchmarks/ is on the path: its launch, timed and reaped

PR_SET_CHILD_SUBREAPER = 36
TARGET = 0.75  # a warm restart at most 3/4 of a cold one's seconds (the median of pairs)
JOB = [
    "trainer.global_batch_size=16",
    "trainer.micro_batch_size=2",
    "trainer.seq_len=64",
    "trainer.log_interval=1",
    "trainer.eval_interval=1000",
    "trainer.checkpoint_interval=10",
    "data.max_bytes=400000",
    "data.bpe_vocab_size=512",
    "run.report=false",
]


def stamp(line: str) -> float:
    """A rank log line's time (`2026-12-06 15:51:13,815 [rank 0] ...`) in epoch seconds."""
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def phases(run_dir: Path, fault_step: int) -> tuple[float, float]:
    """(when rank 0 logged its first step, seconds from rank 1's failure to rank 0's first
    step after its resume), from the rank logs."""
    rank0 = (run_dir / "logs" / "rank0.log").read_text().splitlines()
    rank1 = (run_dir / "logs" / "rank1.log").read_text().splitlines()
    failed = next(stamp(ln) for ln in rank1 if f"failed at step {fault_step}" in ln)
    steps = [ln for ln in rank0 if "INFO launcher: step " in ln]
    resumed = next(i for i, ln in enumerate(rank0) if "resumed from step" in ln)
    after = next(stamp(ln) for ln in rank0[resumed:] if "INFO launcher: step " in ln)
    return stamp(steps[0]), after - failed


def adopt_orphans() -> None:
    """Make this process the subreaper of what a launch leaves behind: a warm start's fork
    server ends a moment after its agent, and its CPU seconds (its ranks' among them) count
    only if it is reaped here rather than by init (Linux's PR_SET_CHILD_SUBREAPER)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def launch(warm: bool, nproc: int, steps: int, fault_step: int, root: Path, extra: list[str]):
    """One launch to its end: {wall, cpu, start, restart} seconds."""
    env = dict(os.environ, LAUNCHER_WARM_START="1" if warm else "0")
    cmd = [sys.executable, "-m", "launcher.torchrun", "--standalone", f"--nproc_per_node={nproc}",
           "--max-restarts=1", "-m", "launcher.train", *JOB, f"trainer.max_steps={steps}",
           "fault.kind=device_error", "fault.rank=1", f"fault.step={fault_step}",
           "fault.once=true", f"run.root={root}", "run.id=run", *extra]  # fmt: skip
    began = time.time()
    wall, cpu = startup.launch(cmd, root.with_suffix(".log"), env)
    first_step, restart = phases(root / "run", fault_step)
    return {"wall": wall, "cpu": cpu, "start": first_step - began, "restart": restart}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3, help="warm/cold pairs of launches")
    parser.add_argument("--nproc", type=int, default=8, help="ranks per launch")
    parser.add_argument("--steps", type=int, default=30, help="steps of the job")
    parser.add_argument("--fault-step", type=int, default=15, help="rank 1's device error")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    parser.add_argument("overrides", nargs="*", help="overrides of the job")
    args = parser.parse_args()
    adopt_orphans()
    load = os.getloadavg()[0]
    pairs = []
    with tempfile.TemporaryDirectory(prefix="warm-start-") as work:
        for i in range(args.pairs):
            order = (True, False) if i % 2 == 0 else (False, True)
            pair = {}
            for warm in order:
                root = Path(work) / f"{i}-{'warm' if warm else 'cold'}"
                pair["warm" if warm else "cold"] = launch(
                    warm, args.nproc, args.steps, args.fault_step, root, args.overrides
                )
            pairs.append(pair)
    print(f"{args.nproc} ranks, {args.steps} steps, rank 1 failing at step {args.fault_step} "
          f"once; load average {load:.1f} before, {os.getloadavg()[0]:.1f} after\n")  # fmt: skip
    print("| side | wall s | CPU s | launch to first step s | failure to next step s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for side in ("warm", "cold"):
        for pair in pairs:
            f = pair[side]
            print(f"| {side} | {f['wall']:.1f} | {f['cpu']:.1f} | {f['start']:.1f} | "
                  f"{f['restart']:.1f} |")  # fmt: skip
    ratios = {k: [p["warm"][k] / p["cold"][k] for p in pairs] for k in pairs[0]["warm"]}
    print()
    for key, values in ratios.items():
        spread = f"min {min(values):.2f}, max {max(values):.2f}"
        print(f"warm / cold, {key} seconds, {len(values)} pairs: median "
              f"{statistics.median(values):.2f} ({spread})")  # fmt: skip
    verdict = statistics.median(ratios["restart"])
    print(f"\nJudged on the restart: warm / cold {verdict:.2f} against the target {TARGET}: "
          f"{'met' if verdict <= TARGET else 'not met'}")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps({"pairs": pairs, "load": load, "nproc": args.nproc}))
    return 0 if verdict <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
