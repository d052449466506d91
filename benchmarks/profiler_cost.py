"""What profiling costs: step time with the profiler off, `steps` and `full`, side by side.

    python benchmarks/profiler_cost.py [--rounds 2] [--steps 24] [overrides...]

Each mode trains the same run (same seed, data and order) in a fresh single process,
logging every step; `steps` and `full` record every step after the first 8 (profiler
warm-up included in those 8). The figure per mode is the median step time over the
recorded steps, taken from metrics.jsonl, against the same steps of the run with the
profiler off. Rounds rotate the order of the modes. It also prints the trace size per
recorded step, since `full` (shapes, memory, stacks) grows traces as well as steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MODES = ("off", "steps", "full")
SKIP, WARMUP = 6, 2
DEFAULTS = [
    "trainer.log_interval=1",
    "trainer.eval_interval=0",
    "trainer.checkpoint_interval=0",
    "data.num_workers=0",
    "data.persistent_workers=false",
]


def run_mode(mode: str, steps: int, overrides: list[str], root: Path) -> tuple[float, float]:
    """(median step seconds over the recorded steps, trace MB per recorded step)."""
    active = steps - SKIP - WARMUP
    profile = [
        f"profiler={mode}",
        f"profiler.skip_first={SKIP}",
        f"profiler.warmup={WARMUP}",
        f"profiler.active={active}",
    ]
    run_id = f"{mode}-{len(list(root.iterdir()))}"
    cmd = [
        sys.executable,
        "-m",
        "launcher.train",
        *DEFAULTS,
        f"trainer.max_steps={steps}",
        *(profile if mode != "off" else []),
        *overrides,
        f"run.root={root}",
        f"run.id={run_id}",
    ]
    env = {"OMP_NUM_THREADS": "1", **os.environ}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=env)
    if done.returncode != 0:
        raise SystemExit(f"profiler={mode} run failed:\n{done.stderr[-3000:]}")
    run_dir = root / run_id
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    recorded = [r["step_time_s/p50"] for r in records if "loss" in r and r["step"] > SKIP + WARMUP]
    traces = list((run_dir / "traces").rglob("*.json"))
    size = sum(p.stat().st_size for p in traces) / 1e6 / max(active, 1)
    return statistics.median(recorded), size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for r in range(args.rounds):
            order = MODES[r % 3 :] + MODES[: r % 3]
            for mode in order:
                results[mode].append(run_mode(mode, args.steps, args.overrides, root))
            print(
                f"round {r + 1}: "
                + ", ".join(f"{m} {results[m][-1][0] * 1e3:.1f} ms" for m in MODES),
                file=sys.stderr,
            )
    base = statistics.median(t for t, _ in results["off"])
    print("\n| profiler | step (ms, median) | vs off | trace MB per recorded step |")
    print("|----------|-------------------|--------|----------------------------|")
    for mode in MODES:
        step = statistics.median(t for t, _ in results[mode])
        size = statistics.median(s for _, s in results[mode])
        print(f"| {mode:<8} | {step * 1e3:17.1f} | {step / base:5.2f}x | {size:26.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
