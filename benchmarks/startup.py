"""Start-up: the default job run for one step against a bare loop of the same shape, whole
processes under torchrun, side by side in one run.

    python benchmarks/startup.py [--pairs 4] [--nproc 2] [--judge wall|cpu] [--out FILE] [overrides]

The launcher's side is what a user types, into a fresh run.root each time:

    torchrun --standalone --nproc_per_node=N -m launcher.train trainer.max_steps=1 [overrides]

The bare side is this file under the same torchrun with `--bare`: nanoGPT's train.py cut
down to the same work, and nothing else. It imports torch and the launcher's GPT-2 module
(which imports only torch), joins the process group, builds the model of the same shape,
AdamW and DDP, runs one optimizer step of the same batch (micro-batches x accumulation
over the ranks) on random tokens, evaluates the same number of held-out micro-batches,
writes the model and optimizer state on rank 0 as the job's final checkpoint does, and
leaves the process group. What the launcher does on top (Hydra composition and checks,
data preparation from the token cache, DataLoader workers, run directory, lock, metrics,
sinks, stop vote, watchdog, replica check) is the overhead measured.

Each side's figures are the whole launch, torchrun included: wall seconds from start to
exit, and CPU seconds (user + system) of torchrun and every process under it, from
getrusage of the reaped children. The sides alternate, `--pairs` times, each pair in the
opposite order of the last, after `--warmup` untimed pairs (page cache, token cache); the
verdict is the median over pairs of launcher / bare wall time (`--judge cpu`: CPU time, on
a machine too busy for wall seconds to mean the launch's own), against TARGET, printed with
the pairs' spread and the load average. Only the
model shape, batch, precision and device are mirrored: give the bare loop's knobs
(`trainer.compile`, another strategy) no weight in the comparison.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 1.1  # the launcher's start-up may take at most 1.1x the bare loop's
HERE = Path(__file__).resolve()
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]


# -- the bare loop (run by torchrun, one process per rank) --------------------------------


def bare(args: argparse.Namespace) -> None:
    """One step, one eval, one checkpoint, nanoGPT-style: no config system, no data files."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from launcher.model.gpt2 import GPT2, GPT2Config

    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    cuda = args.device != "cpu" and torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    torch.manual_seed(args.seed)
    shape = GPT2Config(args.vocab, args.layers, args.heads, args.embd, args.positions)
    model = GPT2(shape).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "fp16")

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(args.vocab, (args.micro, args.seq + 1), device=device)
        return tokens[:, :-1], tokens[:, 1:]

    def loss_of(module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            return module(x, y)

    for micro in range(args.accum):
        x, y = batch()
        if micro < args.accum - 1:
            with ddp.no_sync():
                scaler.scale(loss_of(ddp, x, y) / args.accum).backward()
        else:
            scaler.scale(loss_of(ddp, x, y) / args.accum).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    ddp.eval()
    with torch.no_grad():
        losses = [loss_of(ddp, *batch()) for _ in range(args.eval_micro_batches)]
        total = torch.stack(losses).mean()
        dist.all_reduce(total)
    if rank == 0:
        print(f"bare: eval loss {total.item() / dist.get_world_size():.4f}")
        folder = Path(args.out_dir)
        torch.save(model.state_dict(), folder / "model.pt")
        torch.save({"optimizer": optimizer.state_dict()}, folder / "optimizer.pt")
    dist.barrier()
    del ddp  # a DDP reducer alive when the group is destroyed can hang the exit on gloo
    gc.collect()
    dist.destroy_process_group()


# -- the comparison ------------------------------------------------------------------------


def launch(cmd: list[str], log: Path, env: dict | None = None) -> tuple[float, float]:
    """Run one launch to its end: (wall seconds, CPU seconds of every process under it,
    those it left for this process to reap among them: benchmarks/warm_start.py adopts them)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    begin = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, check=False)
    wall = time.perf_counter() - begin
    reap_all()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-30:])
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{tail}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def reap_all() -> None:
    """Wait for every process left under this one."""
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def bare_command(cfg, nproc: int, vocab: int, out_dir: Path) -> list[str]:
    """The bare loop of `cfg`'s shape: model, batch over `nproc` ranks, eval, precision."""
    from launcher.config.batch import BatchPlan

    t, m = cfg.trainer, cfg.model
    accum = BatchPlan.of(t, nproc).accum
    shape = {
        "vocab": vocab,
        "layers": m.n_layer,
        "heads": m.n_head,
        "embd": m.n_embd,
        "positions": m.n_positions,
        "seq": t.seq_len,
        "micro": t.micro_batch_size,
        "accum": accum,
        "eval-micro-batches": t.eval_batches * accum,
        "precision": t.precision,
        "device": t.device,
        "seed": t.seed,
        "out-dir": out_dir,
    }
    flags = [f"--{k}={v}" for k, v in shape.items()]
    return [*TORCHRUN, f"--nproc_per_node={nproc}", str(HERE), "--bare", *flags]


def model_vocab(run_root: Path) -> int:
    """The vocabulary the job's model was built with (its data's, padded), from the
    checkpoint it wrote: the bare loop's embedding is the same size."""
    import torch

    run_dirs = [p for p in run_root.iterdir() if p.is_dir() and not p.is_symlink()]  # not latest
    (model_file,) = [f for d in run_dirs for f in d.glob("checkpoints/step_*/model.pt")]
    state = torch.load(model_file, map_location="cpu", weights_only=True)
    return state["transformer.wte.weight"].shape[0]


def compare(args: argparse.Namespace) -> int:
    """The paired launches, their table and the verdict: 0 within TARGET, 1 over it."""
    from launcher.config import compose, normalize

    job = ["trainer.max_steps=1", *args.overrides]
    cfg = compose(job)
    normalize(cfg, args.nproc)
    with tempfile.TemporaryDirectory(prefix="launcher-startup-") as tmp:
        pairs, vocab = measure(args, job, cfg, Path(tmp))
    return report(args, pairs, vocab)


def measure(args: argparse.Namespace, job: list[str], cfg, work: Path):
    """`--pairs` pairs of (wall, CPU) per side, after one untimed run of each; the vocab."""
    runs = itertools.count()

    def launcher_side() -> tuple[float, float]:
        root = work / f"runs{next(runs)}"
        cmd = [*TORCHRUN, f"--nproc_per_node={args.nproc}", "-m", "launcher.train", *job]
        return launch([*cmd, f"run.root={root}"], work / "launcher.log")

    def bare_side() -> tuple[float, float]:
        vocab = model_vocab(work / "runs0")  # the first launch's (every pair starts with one)
        return launch(bare_command(cfg, args.nproc, vocab, work), work / "bare.log")

    sides = {"launcher": launcher_side, "bare": bare_side}
    for _ in range(args.warmup):  # untimed: the token cache and the page cache warm
        launcher_side()
        bare_side()
    pairs = []
    for n in range(args.pairs):
        order = ("launcher", "bare") if (args.warmup + n) % 2 == 0 else ("bare", "launcher")
        got = {side: sides[side]() for side in order}
        pairs.append(got)
        print(
            f"pair {n + 1}: launcher {got['launcher'][0]:.2f} s wall, {got['launcher'][1]:.2f} "
            f"s CPU; bare {got['bare'][0]:.2f} s wall, {got['bare'][1]:.2f} s CPU "
            f"(load {os.getloadavg()[0]:.1f})",
            file=sys.stderr,
        )
    return pairs, model_vocab(work / "runs0")


def report(args: argparse.Namespace, pairs: list[dict], vocab: int) -> int:
    from overhead import spread  # benchmarks/ is on the path

    print(f"\n{args.nproc} ranks, one step, {args.pairs} pairs; medians (whole launch); "
          f"load average {args.load:.1f} at the start, {os.getloadavg()[0]:.1f} now")  # fmt: skip
    print("| side     | wall s | CPU s |")
    print("|----------|--------|-------|")
    for side in ("bare", "launcher"):
        wall = statistics.median(p[side][0] for p in pairs)
        cpu = statistics.median(p[side][1] for p in pairs)
        print(f"| {side:<8} | {wall:6.2f} | {cpu:5.2f} |")
    ratios = {
        what: [p["launcher"][i] / p["bare"][i] for p in pairs]
        for i, what in enumerate(("wall", "cpu"))
    }
    ratio = {what: statistics.median(values) for what, values in ratios.items()}
    within = ratio[args.judge] <= TARGET
    if args.out:
        figures = {"nproc": args.nproc, "overrides": args.overrides, "vocab": vocab}
        figures |= {"pairs_s": pairs, "ratio": ratio, "ratios": ratios, "judged": args.judge}
        figures |= {"target": TARGET, "within": within, "load": [args.load, os.getloadavg()[0]]}
        args.out.write_text(json.dumps(figures, indent=1))
    print()
    for what, values in ratios.items():
        print(f"launcher / bare, {what} seconds: median {ratio[what]:.2f}x ({spread(values)})")
    print(f"Judged on {args.judge} seconds: {ratio[args.judge]:.2f}x. "
          f"{'Within' if within else 'OVER'} the {TARGET}x target.")  # fmt: skip
    return 0 if within else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4, help="launcher/bare pairs of launches")
    parser.add_argument("--nproc", type=int, default=2, help="ranks per launch")
    parser.add_argument("--warmup", type=int, default=1, help="untimed pairs first")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    parser.add_argument(
        "--judge", choices=("wall", "cpu"), default="wall", help="the verdict's seconds"
    )
    parser.add_argument("overrides", nargs="*", help="overrides of the job (and its shape)")
    parser.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    for name in ("vocab", "layers", "heads", "embd", "positions", "seq", "micro", "accum"):
        parser.add_argument(f"--{name}", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--eval-micro-batches", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--precision", help=argparse.SUPPRESS)
    parser.add_argument("--device", help=argparse.SUPPRESS)
    parser.add_argument("--out-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare:
        bare(args)
        return 0
    args.load = os.getloadavg()[0]
    return compare(args)


if __name__ == "__main__":
    sys.exit(main())
