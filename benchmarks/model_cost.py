"""The model's own cost: the native GPT-2 against transformers' GPT2LMHeadModel, in one run.

    python benchmarks/model_cost.py [--iters N] [--steps N] [--threads N] [--out FILE] [overrides]

Three measurements, both implementations side by side and interleaved (so that a noisy
neighbour slows both alike), at issue 16's shape (4 layers x 128, 4 heads, sequence 64,
micro-batch 12, vocabulary 256), fp32; overrides (`model.n_layer=1`, ...) change the shape
(the suite runs it on one layer: compiling is most of its time):

  1. forward + backward + loss of one micro-batch, eager and torch.compile'd: the native
     module computes the loss inside its forward; GPT2LMHeadModel's logits go through
     launcher.model.lm_loss, as the trainer does it;
  2. the trainer's step (launcher.train.job.run with model.impl=hf and =native: the real loop,
     optimizer and data), step_time_s/p50 of summary.json (wall clock, as the trainer
     measures its steps; runs interleaved);
  3. peak memory of one micro-batch's forward + backward (GPT-2's vocabulary, 50,304, where
     the logits matter), each path in a fresh process: on a GPU torch.cuda's peak allocated
     bytes, on the CPU the rise of the process's peak resident memory (VmHWM) over the
     resident memory before the step. Paths: GPT2LMHeadModel with the loss outside, the
     native module compiled with the loss outside the compiled region (the old path), and
     inside it.

Times are medians over --iters micro-batches after warm-up: CUDA events on a GPU, the
process's CPU time on the CPU (wall time on a shared machine measures the neighbours).
Prints the tables and ratios; --out writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from launcher.config import compose
from launcher.model.build import build_model, lm_loss, model_loss

SHAPE = [
    "model=gpt2-tiny",
    "model.n_layer=4",
    "model.n_head=4",
    "model.n_embd=128",
    "model.n_positions=64",
    "trainer.seq_len=64",
    "trainer.micro_batch_size=12",
]
VOCAB = 256
MEM_VOCAB = 50304  # GPT-2's padded vocabulary: the logits' share of memory at full size
IMPLS = ("hf", "native")
MEM_PATHS = ("hf eager", "native compiled, loss outside", "native compiled, loss inside")


def make(shape: list[str], impl: str, vocab: int, device: torch.device, compiled: bool):
    torch.manual_seed(0)
    cfg = compose([*shape, f"model.impl={impl}"])
    model = build_model(cfg.model, vocab).to(device).train()
    return (torch.compile(model) if compiled else model), cfg


def batch(shape: list[str], vocab: int, device: torch.device):
    trainer = compose(shape).trainer
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, (trainer.micro_batch_size, trainer.seq_len + 1), generator=g)
    return x[:, :-1].contiguous().to(device), x[:, 1:].contiguous().to(device)


def fwd_bwd(model, impl: str, x, y) -> None:
    model_loss(model, impl, x, y).backward()


def clock(device: torch.device):
    """A start/stop timer in seconds: CUDA events on a GPU; on the CPU this process's CPU
    time, which a machine shared with other work inflates far less than wall time."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()

        def stop() -> float:
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3

        return stop
    begin = time.process_time()
    return lambda: time.process_time() - begin


def micro_batch_times(shape: list[str], device: torch.device, iters: int) -> dict[str, float]:
    """Median seconds of forward + backward + loss per (impl, eager/compiled)."""
    x, y = batch(shape, VOCAB, device)
    runs = {}
    for mode in ("eager", "compiled"):
        for impl in IMPLS:
            model, _ = make(shape, impl, VOCAB, device, mode == "compiled")
            for _ in range(5):  # warm-up (and compilation)
                fwd_bwd(model, impl, x, y)
            runs[f"{impl} {mode}"] = model
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(iters):
        for name, model in runs.items():  # interleaved: noise hits every row alike
            model.zero_grad(set_to_none=True)
            stop = clock(device)
            fwd_bwd(model, name.split()[0], x, y)
            times[name].append(stop())
    return {name: statistics.median(ts) for name, ts in times.items()}


def trainer_step_times(shape: list[str], steps: int, rounds: int) -> dict[str, float]:
    """Seconds per step of the real trainer for each impl: `step_time_s/p50` of each run's
    summary.json (the trainer's own wall-clock step, first step left out), runs of both
    impls interleaved over `rounds`, the median per impl."""
    from launcher.runtime.launch_state import LaunchState
    from launcher.train.bad_input import check_or_exit
    from launcher.train.job import run

    common = [
        *shape,
        "data=synthetic",
        f"data.vocab_size={VOCAB}",
        f"trainer.global_batch_size={compose(shape).trainer.micro_batch_size}",
        f"trainer.max_steps={steps}",
        f"trainer.log_interval={steps}",
        "trainer.eval_interval=0",
        "trainer.checkpoint_interval=0",
        "data.num_workers=0",
        "data.persistent_workers=false",
        "logger=none",
        "resume=never",
    ]
    found: dict[str, list[float]] = {impl: [] for impl in IMPLS}
    with tempfile.TemporaryDirectory() as root:
        for r in range(rounds):
            for impl in IMPLS:
                cfg = compose(
                    [*common, f"model.impl={impl}", f"run.root={root}", f"run.id={impl}{r}"]
                )
                check_or_exit(cfg)
                if run(cfg, LaunchState()) != 0:
                    raise SystemExit(f"the trainer run with model.impl={impl} failed")
                summary = json.loads((Path(root) / f"{impl}{r}" / "summary.json").read_text())
                found[impl].append(summary["step_time_s/p50"])
    return {impl: statistics.median(ts) for impl, ts in found.items()}


def peak_memory(shape: list[str], path: str, device: torch.device) -> float:
    """Bytes one micro-batch's forward + backward adds at its peak (this process only)."""
    from launcher.observe.metrics import host_peak_rss_gb, reset_host_peak

    impl = "hf" if path.startswith("hf") else "native"
    model, _ = make(shape, impl, MEM_VOCAB, device, "compiled" in path)
    x, y = batch(shape, MEM_VOCAB, device)

    def step():
        if path.endswith("loss outside"):  # the compiled module returns logits
            lm_loss(model(x), y).backward()
        else:
            fwd_bwd(model, impl, x, y)

    for _ in range(3):
        step()
        model.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    reset_host_peak()
    base = host_peak_rss_gb()
    step()
    return (host_peak_rss_gb() - base) * 1e9


def memory_rows(overrides: list[str]) -> dict[str, float]:
    """Each path's peak in a fresh process, so that no path inherits another's heap."""
    rows = {}
    for path in MEM_PATHS:
        cmd = [sys.executable, __file__, "--memory-path", path, *overrides]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise SystemExit(f"memory run {path!r} failed:\n{done.stderr[-3000:]}")
        rows[path] = float(done.stdout.strip().splitlines()[-1])
    return rows


def describe(shape: list[str]) -> str:
    """The shape as the report's title gives it: `4 x 128, 4 heads, seq 64, micro-batch 12`."""
    cfg = compose(shape)
    m, t = cfg.model, cfg.trainer
    heads = f"{m.n_head} heads"
    return f"{m.n_layer} x {m.n_embd}, {heads}, seq {t.seq_len}, micro-batch {t.micro_batch_size}"


def report(shape: list[str], micro: dict, step: dict, memory: dict, device_name: str) -> str:
    lines = [f"model cost on {device_name} ({describe(shape)}, fp32)", ""]
    lines.append("| forward + backward + loss | hf ms | native ms | native speed-up |")
    lines.append("|---|---|---|---|")
    for mode in ("eager", "compiled"):
        hf, nat = micro[f"hf {mode}"], micro[f"native {mode}"]
        lines.append(f"| {mode} | {hf * 1e3:.1f} | {nat * 1e3:.1f} | {hf / nat:.2f}x |")
    if step:
        hf, nat = step["hf"], step["native"]
        lines.append(
            f"| trainer step (launcher.train.job.run, eager, with the optimizer) | {hf * 1e3:.1f} "
            f"| {nat * 1e3:.1f} | {hf / nat:.2f}x |"
        )
    if memory:
        lines += ["", f"peak memory of one micro-batch, vocabulary {MEM_VOCAB}:", ""]
        lines += ["| path | peak MB |", "|---|---|"]
        lines += [f"| {path} | {b / 1e6:.1f} |" for path, b in memory.items()]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=30, help="timed micro-batches per row")
    parser.add_argument("--steps", type=int, default=20, help="trainer steps per run")
    parser.add_argument("--rounds", type=int, default=3, help="trainer runs per impl")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (torch)")
    parser.add_argument("--skip-trainer", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    parser.add_argument("--memory-path", choices=MEM_PATHS, help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="config overrides that change SHAPE")
    args = parser.parse_args()
    shape = [*SHAPE, *args.overrides]
    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    if not gpu:
        torch.set_num_threads(args.threads)
    if args.memory_path:
        print(peak_memory(shape, args.memory_path, device))
        return 0
    micro = micro_batch_times(shape, device, args.iters)
    step = {} if args.skip_trainer else trainer_step_times(shape, args.steps, args.rounds)
    memory = {} if args.skip_memory else memory_rows(args.overrides)
    device_name = torch.cuda.get_device_name(0) if gpu else f"CPU, {args.threads} thread(s)"
    print(report(shape, micro, step, memory, device_name))
    if args.out:
        figures = {"device": device_name, "shape": describe(shape), "micro_batch_s": micro}
        figures["trainer_step_s"] = step
        args.out.write_text(json.dumps({**figures, "peak_bytes": memory}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
