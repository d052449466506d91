"""The plan held against measured runs on this machine: checkpoint bytes per engine and world
size, peak host memory, and step and communication time at other shapes predicted from one
2-rank run.

    python benchmarks/plan_check.py [--steps 20] [--engines ddp,fsdp2,zero2] [--worlds 1,2,4]
                                    [--shapes all] [overrides...]

1. State bytes: each engine at each world size trains `--steps` steps with a checkpoint at
   the end; the files its ranks wrote (meta.json's sizes, RNG files aside) against
   `launcher.plan.forecast.checkpoint_bytes`.
2. Host memory: the baseline's peak resident memory per rank (mem/host_peak_gb) against
   the plan's host memory per rank on the CPU.
3. Step time: the baseline (DDP, 2 ranks) is the plan's `--from`; every other shape (a
   larger micro-batch, a longer sequence, a wider model, small buckets, the bf16 hook, 4
   ranks) runs for real and its median step time and all-reduce time are set beside the
   plan's prediction from the baseline alone. Ranks that outnumber this machine's cores
   measure the contention for them, not the plan: such a row is marked, not fitted.

Prints the ratios (measured / predicted); exits 0. The figures quoted in docs/plan.md come
from this script.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from omegaconf import OmegaConf

from launcher.checkpoint.protocol import find_resumable, read_meta
from launcher.config import compose
from launcher.plan import forecast
from launcher.plan import host as host_memory

BASE = ["trainer.global_batch_size=16", "trainer.micro_batch_size=4", "trainer.seq_len=128",
        "trainer.log_interval=5", "trainer.eval_interval=0", "data.max_bytes=400000",
        "data.bpe_vocab_size=512"]  # fmt: skip
SHAPES = {
    "micro-batch 8": ["trainer.micro_batch_size=8"],
    "sequence 256": ["trainer.seq_len=256"],
    "width 128": ["model.n_embd=128"],
    "buckets 0.05 MB": ["strategy.bucket_cap_mb=0.05"],
    "bf16 hook": ["strategy.comm_hook=bf16"],
    "4 ranks": [],
}
STATE_FILES = (".pt", ".distcp")


def launch(root: Path, run_id: str, nproc: int, overrides: list[str]) -> Path:
    """One training run under torchrun; its run directory."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", "-m", "launcher.train", *overrides,
           f"run.root={root}", f"run.id={run_id}"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{run_id} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return root / run_id


def config_of(run: Path):
    cfg = OmegaConf.load(run / "config.yaml")
    meta = read_meta(find_resumable(run)) or {}
    cfg.model.vocab_size = (meta.get("model") or {}).get("vocab_size")
    return cfg, meta


def state_bytes(args, root: Path) -> list[str]:
    rows = ["| engine | ranks | written | predicted | ratio |", "|---|---:|---:|---:|---:|"]
    for name in args.engines.split(","):
        for world in (int(w) for w in args.worlds.split(",")):
            run = launch(root, f"state-{name}-{world}", world,
                         [*args.common, f"strategy={name}",
                          f"trainer.checkpoint_interval={args.steps}"])  # fmt: skip
            cfg, meta = config_of(run)
            written = sum(n for f, n in meta["files"].items()
                          if f.endswith(STATE_FILES) and not f.startswith("rng_"))  # fmt: skip
            predicted = forecast.checkpoint_bytes(cfg, world)["total"]
            rows.append(f"| {name} | {world} | {written:,} | {predicted:,} | "
                        f"{written / predicted:.3f} |")  # fmt: skip
    return rows


def step_times(args, root: Path) -> list[str]:
    base = launch(root, "base", 2, [*args.common, f"trainer.checkpoint_interval={args.steps}"])
    measured = forecast.measured_from(base)
    summary = json.loads((base / "summary.json").read_text())
    cfg, _ = config_of(base)
    host = host_memory.host_per_node(cfg, 2, 2, on_gpu=False)
    predicted_rank = host["rank_process"]  # a rank's own pages (its workers' apart)
    peak = summary["mem/host_peak_gb"] * 1e9
    rows = [
        f"host memory per rank: measured {peak / 1e9:.3f} GB, predicted "
        f"{predicted_rank / 1e9:.3f} GB, ratio {peak / predicted_rank:.2f}",
        "",
        "| shape | step measured | step predicted | ratio | all-reduce measured | predicted "
        "| ratio | note |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]  # fmt: skip
    cores = os.cpu_count() or 1
    for shape, overrides in SHAPES.items():
        if args.shapes != "all" and shape not in args.shapes.split(","):
            continue
        world = 4 if shape == "4 ranks" else 2
        run = launch(root, shape.replace(" ", "-"), world, [*args.common, *overrides])
        got = json.loads((run / "summary.json").read_text())
        shaped = compose([*args.common, *overrides, f"cluster.procs_per_node={world}"])
        plan = forecast.build(shaped, forecast.target_of(shaped), measured,
                              vocab_size=measured.vocab_size, engines=False)  # fmt: skip
        step = plan["step"]
        note = f"{world} ranks on {cores} cores: contention" if world > cores else ""
        rows.append(
            f"| {shape} | {got['step_time_s/p50'] * 1e3:.1f} ms | {step['time_s'] * 1e3:.1f} ms "
            f"| {got['step_time_s/p50'] / step['time_s']:.2f} | "
            f"{(got.get('comm/allreduce_s') or 0) * 1e3:.1f} ms | {step['comm_s'] * 1e3:.1f} ms "
            f"| {(got.get('comm/allreduce_s') or 0) / step['comm_s']:.2f} | {note} |"
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--engines", default="ddp,fsdp2,zero2")
    parser.add_argument("--worlds", default="1,2,4")
    parser.add_argument("--shapes", default="all", help="all, or names from SHAPES")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    args.common = [*BASE, f"trainer.max_steps={args.steps}", *args.overrides]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        print("\n".join(state_bytes(args, root)))
        print()
        print("\n".join(step_times(args, root)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
