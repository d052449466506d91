"""The plan held against runs on this machine: step time at shapes the calibration never ran,
predicted and then measured back to back; every run's checkpoint bytes; each engine's memory
tier in /dev/shm.

    python benchmarks/plan_check.py [--steps 20] [--probes all] [--shapes all] [--tier all]
                                    [--repeats 1] [--keep DIR] [overrides...]

1. Calibration: the probes (PROBES: each engine at two accumulations, DDP at three and at another
   micro-batch, width, sequence, depth and bucket size, all at 2 ranks) run, and the plan is
   calibrated on all of them at once (`launcher.plan --from`, launcher.plan.calibrate: a FLOP
   rate, the optimizer's, the attention scores', each engine's fixed costs; each engine's
   links per collective).
2. Shapes: each shape of SHAPES, none of them a probe's (width and depth over a 4x range,
   sequence, micro-batch, accumulation, 1, 2 and 4 ranks, every engine, the compression hooks,
   a bucket size), is planned from the calibration, then run; its median step time beside
   the prediction, and whether the plan called it extrapolated.
3. Checkpoints: the bytes each run's last checkpoint holds (its files, RNG states aside)
   beside the plan's (launcher.plan.forecast.checkpoint_bytes), for every run above.
4. /dev/shm: each engine's memory tier (TIER), the bytes of one memory checkpoint on the node
   (every rank's folder, RNG states aside; the run is ended by a planted exit before its
   last step, so the tier is left for reading) beside the plan's
   (launcher.checkpoint.memory.node_state_bytes).

Every rank computes on one thread (OMP_NUM_THREADS=1, torchrun's own default); ranks that
outnumber the cores share them, which the plan counts (launcher.plan.calibrate.cpu_share).
On a machine shared with other work, `--repeats N` runs each probe and shape N times and
keeps the least disturbed (the shortest median step): 2 even on the quiet 2-core machine,
where one 20-step run moves by 15-30% (docs/plan.md).
Prints the tables, the ratios' median and worst, and the machine's load before and after
(its 1-minute load average: on a shared machine the times are noisy); exits 0. docs/plan.md's
table comes from this script.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from launcher.checkpoint import memory
from launcher.checkpoint.protocol import find_resumable, read_meta, scan
from launcher.config import compose
from launcher.plan import forecast
from launcher.plan.calibrate import describe
from launcher.plan.shape import checked, shape_of

BASE = ["trainer.global_batch_size=16", "trainer.micro_batch_size=4", "trainer.seq_len=128",
        "trainer.log_interval=5", "trainer.eval_interval=0", "data.max_bytes=400000",
        "data.tokenizer=bpe", "data.bpe_vocab_size=512"]  # fmt: skip
# name -> (ranks, overrides): the runs the plan is calibrated on
PROBES = {
    "ddp": (2, []),
    "ddp micro-batch 8": (2, ["trainer.micro_batch_size=8"]),
    "ddp width 128": (2, ["model.n_embd=128"]),
    "ddp sequence 256": (2, ["trainer.seq_len=256"]),
    "ddp depth 4": (2, ["model.n_layer=4"]),
    "ddp buckets 0.25 MB": (2, ["strategy.bucket_cap_mb=0.25"]),
    "ddp accumulation 4": (2, ["trainer.micro_batch_size=2"]),
    **{f"{e}{tail}": (2, [f"strategy={e}", *more])
       for e in ("zero1", "zero2", "zero3", "fsdp2")
       for tail, more in (("", []), (" accumulation 4", ["trainer.micro_batch_size=2"]))},
}  # fmt: skip
# name -> (ranks, overrides): the shapes predicted from the probes, then run
SHAPES = {
    "width 256": (2, ["model.n_embd=256"]),
    "depth 8": (2, ["model.n_layer=8"]),
    "sequence 512": (2, ["trainer.seq_len=512"]),
    "micro-batch 16": (2, ["trainer.micro_batch_size=16", "trainer.global_batch_size=32"]),
    "accumulation 8": (2, ["trainer.micro_batch_size=1"]),
    "1 rank": (1, []),
    "4 ranks": (4, []),
    "zero1 width 128": (2, ["strategy=zero1", "model.n_embd=128"]),
    "zero2 depth 4": (2, ["strategy=zero2", "model.n_layer=4"]),
    "zero3 sequence 256": (2, ["strategy=zero3", "trainer.seq_len=256"]),
    "fsdp2 width 128": (2, ["strategy=fsdp2", "model.n_embd=128"]),
    "fsdp2 no reshard": (2, ["strategy=fsdp2_noreshard"]),
    "fsdp2 4 ranks": (4, ["strategy=fsdp2"]),
    "bf16 hook": (2, ["strategy.comm_hook=bf16"]),
    "fp16 hook": (2, ["strategy.comm_hook=fp16"]),
    "buckets 0.05 MB": (2, ["strategy.bucket_cap_mb=0.05"]),
}
# name -> (ranks, overrides): the memory tier of each engine
TIER = {
    **{
        f"{e} 2 ranks": (2, [f"strategy={e}"]) for e in ("ddp", "zero1", "zero2", "zero3", "fsdp2")
    },  # fmt: skip
    "zero3 4 ranks": (4, ["strategy=zero3"]),
    "fsdp2 4 ranks": (4, ["strategy=fsdp2"]),
}
TIER_STEPS, TIER_EVERY = 6, 2  # a memory checkpoint at step 4; rank 0 exits as step 6 starts


def launch(root: Path, name: str, world: int, overrides: list[str], ok=(0,)) -> Path:
    """One training run (torchrun, or one process); its run directory."""
    run_id = name.replace(" ", "-").replace(".", "_")
    train = ["-m", "launcher.train", *overrides, f"run.root={root}", f"run.id={run_id}"]
    if world > 1:
        train = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
                 *train]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, *train], capture_output=True, text=True, env=env)
    if proc.returncode not in ok:
        raise SystemExit(f"{name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return root / run_id


def fastest(root: Path, name: str, world: int, overrides: list[str], repeats: int) -> Path:
    """`repeats` runs of one shape, one after the other; the one with the shortest median
    step (on a machine shared with other work, the least disturbed)."""
    runs = [launch(root, f"{name} {k}" if repeats > 1 else name, world, overrides)
            for k in range(repeats)]  # fmt: skip
    return min(runs, key=lambda r: json.loads((r / "summary.json").read_text())["step_time_s/p50"])


def planned(overrides: list[str], world: int):
    """The checked config, its shape and its target: the plan of `overrides` at `world`
    CPU ranks on this machine."""
    cfg = compose([*overrides, "cluster.gpus_per_node=0", f"cluster.procs_per_node={world}"])
    target = forecast.target_of(cfg)
    cfg = checked(cfg, world)
    return shape_of(cfg, world), target


def written(run: Path) -> int | None:
    """The bytes of the run's last durable checkpoint, its RNG states aside."""
    last = find_resumable(run)
    meta = (read_meta(last) or {}) if last else {}
    files = meta.get("files") or {}
    return sum(int(n) for f, n in files.items() if not f.startswith("rng_")) or None


def checkpoint_row(name: str, run: Path, overrides: list[str], world: int) -> str:
    shape, _ = planned(overrides, world)
    got = written(run)
    want = forecast.checkpoint_bytes(shape.cfg, world, shape)["total"]
    ratio = f"{got / want:.3f}" if got else "-"
    return f"| {name} | {shape.cfg.strategy.name} | {world} | {got or 0:,} | {want:,} | {ratio} |"


def calibrate(args, root: Path) -> tuple[forecast.Calibration, list[str]]:
    """Run the probes; the calibration on all of them, and their checkpoint rows."""
    runs, rows = [], []
    for name, (world, overrides) in PROBES.items():
        if args.probes != "all" and name not in args.probes.split(","):
            continue
        run = fastest(root, f"probe {name}", world, [*args.common, *overrides], args.repeats)
        runs.append(run)
        rows.append(checkpoint_row(f"probe: {name}", run, [*args.common, *overrides], world))
    _, target = planned(args.common, 2)
    return forecast.calibration(runs, target), rows


def step_times(args, root: Path, cal: forecast.Calibration) -> tuple[list[str], list[str]]:
    """Each shape planned, then run: (the step-time table, their checkpoint rows)."""
    rows = [
        "| shape | ranks | predicted | measured | measured / predicted | extrapolated |",
        "|---|---:|---:|---:|---:|---|",
    ]
    ratios, bytes_rows = [], []
    for name, (world, overrides) in SHAPES.items():
        if args.shapes != "all" and name not in args.shapes.split(","):
            continue
        every = [*args.common, *overrides]
        shape, target = planned(every, world)
        plan = forecast.build(shape, target, cal, engines=False)
        run = fastest(root, name, world, every, args.repeats)
        got = json.loads((run / "summary.json").read_text())["step_time_s/p50"]
        want = plan["step"]["time_s"]
        why = plan["basis"]["step.compute_s"]["why"]
        far = why.split("EXTRAPOLATED: ", 1)[1] if "EXTRAPOLATED" in why else ""
        ratios.append(got / want)
        rows.append(f"| {name} | {world} | {want * 1e3:.1f} ms | {got * 1e3:.1f} ms | "
                    f"{got / want:.2f} | {far} |")  # fmt: skip
        bytes_rows.append(checkpoint_row(name, run, every, world))
    if ratios:
        errors = [abs(r - 1) for r in ratios]
        rows += ["", f"step time, |measured / predicted - 1| over {len(ratios)} shapes: median "
                     f"{statistics.median(errors):.1%}, worst {max(errors):.1%}"]  # fmt: skip
    return rows, bytes_rows


def tier(args, root: Path) -> list[str]:
    """Each engine's memory tier: one memory checkpoint's bytes on the node, every rank's
    folder together, beside the plan's."""
    rows = ["| engine | ranks | written | predicted | written / predicted |",
            "|---|---:|---:|---:|---:|"]  # fmt: skip
    shm = Path(tempfile.mkdtemp(prefix="plan-check-", dir="/dev/shm"))
    try:
        for name, (world, overrides) in TIER.items():
            if args.tier != "all" and name not in args.tier.split(","):
                continue
            every = [*args.common, *overrides, f"trainer.max_steps={TIER_STEPS}",
                     f"trainer.memory_checkpoint_interval={TIER_EVERY}",
                     f"trainer.memory_checkpoint_dir={shm}", "trainer.checkpoint_interval=0",
                     "fault.kind=exit", f"fault.step={TIER_STEPS}", "fault.rank=0"]  # fmt: skip
            run = launch(root, f"tier {name}", world, every, ok=range(256))
            got = 0
            for rank in range(world):
                newest = scan(memory.rank_folder(str(shm), run, rank)).complete
                meta = (read_meta(newest[0]) or {}) if newest else {}
                files = (meta.get("files") or {}).items()
                got += sum(int(n) for f, n in files if not f.startswith("rng_"))
            shape, _ = planned(every, world)
            want = memory.node_state_bytes(shape.cfg, world, world)
            ratio = f"{got / want:.3f}" if got else "- (no memory checkpoint)"
            rows.append(f"| {name} | {world} | {got:,} | {want:,} | {ratio} |")
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    return rows


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--probes", default="all", help="all, or names from PROBES")
    parser.add_argument("--shapes", default="all", help="all, or names from SHAPES")
    parser.add_argument("--tier", default="all", help="all, none, or names from TIER")
    parser.add_argument(
        "--repeats", type=int, default=1, help="runs of each probe and shape (the fastest kept)"
    )
    parser.add_argument("--keep", help="a folder to run in and keep (default: a temporary one)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    args.common = [*BASE, f"trainer.max_steps={args.steps}",
                   f"trainer.checkpoint_interval={args.steps}", *args.overrides]  # fmt: skip
    print(f"before: {load()}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.keep or tmp)
        cal, probe_rows = calibrate(args, root)
        print(f"calibration: {describe(cal)}\n")
        steps, shape_rows = step_times(args, root, cal)
        print("\n".join(steps))
        print("\n| run | engine | ranks | checkpoint written | predicted | written / predicted |")
        print("|---|---|---:|---:|---:|---:|")
        print("\n".join(probe_rows + shape_rows))
        if args.tier != "none":
            print()
            print("\n".join(tier(args, root)))
    print(f"\nafter: {load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
