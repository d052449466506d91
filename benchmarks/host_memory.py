"""Host memory: the model build's peak per rank before and after building on the device,
and the plan's host memory per rank and per DataLoader worker against real runs' peaks.

    python benchmarks/host_memory.py [--build gpt2-tiny,gpt2,gpt2-medium,gpt2-large]
                                     [--pretrained gpt2] [--runs all|NAME,...] [--impl native]

1. The build, per model size, each in a fresh process, one at a time: a rank's process
   (torch and the launcher imported, a gloo process group, gpt2-tiny built once so that
   the build's own machinery is loaded) is the baseline (VmRSS); the peak (VmHWM, reset by
   /proc/self/clear_refs at the baseline) while it builds the model
   - before: constructed on the CPU, as every rank did (then moved to its device);
   - after, CPU: `build_model(..., device="cpu")`, the weights written in place;
   - after, device: `build_model(..., device="meta")`: the path a GPU rank takes (each
     parameter drawn on the CPU, copied to the device), its host side alone.
   The done-when: after (CPU), peak - baseline <= the model's own bytes.
   `--pretrained`: the same for `model.init_from` (a save_pretrained folder, native),
   before (transformers' model, then the native one built and loaded from it) and after;
   the process's own pages (RssAnon) beside all it maps (VmHWM: the weights file's page
   cache, which the node's ranks share, included).
2. Runs: real training launches of a few steps (torchrun for 2 ranks), every process
   sampled from outside every 50 ms: each rank's VmHWM (start-up, build, loop and end), each
   DataLoader worker's own pages (Private_Clean + Private_Dirty of smaps_rollup: what it
   does not share copy-on-write with its rank). Set beside `launcher.plan.host`'s figures
   for the same config: a rank's process, a worker's own pages.

Prints two tables (measured / planned ratios); exits 0. The figures quoted in docs/plan.md
come from this script. Big sizes take memory: the build rows run one process at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from launcher.config import compose
from launcher.plan import host

GB = 1e9
BUILD_SIZES = "gpt2-tiny,gpt2,gpt2-medium,gpt2-large"
SHORT = ["trainer.seq_len=64", "trainer.log_interval=1", "trainer.eval_interval=0",
         "trainer.checkpoint_interval=0", "data.max_bytes=400000", "data.bpe_vocab_size=512",
         "trainer.warmup_steps=1"]  # fmt: skip
VOCAB = 512  # data.bpe_vocab_size: the runs' real vocabulary, which the plan is given
# name -> (ranks, overrides): every engine at the smallest size (the process itself), then
# the training state growing with the model, and a checkpoint's host copy (memory tier).
RUNS = {
    "tiny ddp": (2, ["trainer.max_steps=6", "trainer.global_batch_size=4",
                     "trainer.micro_batch_size=2"]),
    "tiny ddp 4 workers": (2, ["trainer.max_steps=6", "trainer.global_batch_size=4",
                               "trainer.micro_batch_size=2", "data.num_workers=4"]),
    "tiny fsdp2": (2, ["strategy=fsdp2", "trainer.max_steps=6", "trainer.global_batch_size=4",
                       "trainer.micro_batch_size=2"]),
    "tiny zero2": (2, ["strategy=deepspeed", "strategy.zero_stage=2", "trainer.max_steps=6",
                       "trainer.global_batch_size=4", "trainer.micro_batch_size=2"]),
    "gpt2 ddp": (1, ["model=gpt2", "trainer.max_steps=3", "trainer.global_batch_size=2",
                     "trainer.micro_batch_size=2"]),
    "gpt2 ddp tier": (1, ["model=gpt2", "trainer.max_steps=4", "trainer.global_batch_size=2",
                          "trainer.micro_batch_size=2", "trainer.memory_checkpoint_interval=2"]),
    "gpt2-medium ddp": (1, ["model=gpt2-medium", "trainer.max_steps=2",
                            "trainer.global_batch_size=1", "trainer.micro_batch_size=1"]),
}  # fmt: skip


# -- 1. the build, in a child process ------------------------------------------------------
def _status(pid: int | str = "self") -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon and (another process's) Pss_Anon of smaps_rollup, in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("VmRSS", "VmHWM", "RssAnon"):
                out[key] = int(line.split()[1]) * 1024
    if pid != "self":
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss_Anon:"):
                    out["Pss_Anon"] = int(line.split()[1]) * 1024
    return out


def _plain_cpu_build(cfg, vocab: int):
    """The model as every rank constructed it before the build moved to the device."""
    from launcher.model.build import padded_vocab_size
    from launcher.model.gpt2 import GPT2, GPT2Config

    m = cfg.model
    padded = padded_vocab_size(vocab, m.vocab_multiple)
    if m.impl == "native":
        return GPT2(GPT2Config(padded, m.n_layer, m.n_head, m.n_embd, m.n_positions,
                               m.dropout, m.bias))  # fmt: skip
    from transformers import GPT2Config as HFConfig
    from transformers import GPT2LMHeadModel

    shape = HFConfig(vocab_size=padded, n_positions=m.n_positions, n_embd=m.n_embd,
                     n_layer=m.n_layer, n_head=m.n_head, use_cache=False)  # fmt: skip
    return GPT2LMHeadModel(shape)


def child_build(size: str, mode: str, impl: str) -> None:
    """One build row, printed as JSON: the baseline, the peak, the model's bytes."""
    import ctypes
    import gc

    import torch.distributed as dist

    import launcher.train.job  # noqa: F401  (a rank's imports)
    from launcher.model.build import build_model

    store = Path(tempfile.mkdtemp()) / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)

    def build(model_name: str):
        cfg = compose([f"model={model_name}", f"model.impl={impl}"])
        if mode == "before":
            return _plain_cpu_build(cfg, 50257)
        return build_model(cfg.model, 50257, device="meta" if mode == "device" else "cpu")

    del_me = build("gpt2-tiny")  # the build's machinery loaded: part of every rank
    del del_me
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    baseline = _status()["VmRSS"]
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    model = build(size)
    peak = _status()["VmHWM"]
    params = {id(p): p for p in model.parameters()}.values()
    own = sum(p.numel() * p.element_size() for p in params)
    print(json.dumps({"baseline": baseline, "peak": peak, "model": own}))
    dist.destroy_process_group()  # the file store removes its file


def build_rows(sizes: list[str], impl: str) -> list[str]:
    rows = [
        f"model.impl={impl}; peak - baseline per rank while building (GB), and over the "
        "model's own bytes",
        "",
        "| size | model | baseline | before | after, CPU | after, device (host side) | "
        "before / model | after CPU / model | after device / model |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for size in sizes:
        got = {}
        for mode in ("before", "cpu", "device"):
            got[mode] = _child("--child-build", size, mode, impl)
        model = got["cpu"]["model"]
        over = {m: (g["peak"] - g["baseline"]) for m, g in got.items()}
        rows.append(
            f"| {size} | {model / GB:.3f} | {got['cpu']['baseline'] / GB:.3f} | "
            f"{over['before'] / GB:.3f} | {over['cpu'] / GB:.3f} | {over['device'] / GB:.3f} | "
            f"{over['before'] / model:.3f} | {over['cpu'] / model:.3f} | "
            f"{over['device'] / model:.3f} |"
        )
    return rows


# -- 1b. a pretrained folder (model.init_from, native), in a child process -----------------
class AnonPeak:
    """The peak of this process's anonymous resident pages (RssAnon), sampled every 5 ms by
    a thread: VmHWM counts the weights file's page cache too, which a node's ranks share."""

    def __init__(self):
        import threading

        self.peak, self.done = 0, threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while not self.done.is_set():
            with open("/proc/self/status") as f:
                anon = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("RssAnon"))
            self.peak = max(self.peak, anon)
            time.sleep(0.005)

    def stop(self) -> int:
        self.done.set()
        self.thread.join()
        return self.peak


def child_save(size: str, folder: str) -> None:
    from launcher.model.build import build_model

    build_model(compose([f"model={size}", "model.impl=hf"]).model, 50257).save_pretrained(folder)


def child_pretrained(size: str, mode: str, folder: str) -> None:
    """One pretrained row, printed as JSON: the baseline and the peaks while loading."""
    import ctypes
    import gc

    from transformers import GPT2LMHeadModel

    import launcher.train.job  # noqa: F401  (a rank's imports)
    from launcher.model.build import build_model
    from launcher.model.gpt2 import GPT2, GPT2Config, from_hf_state_dict

    def before():  # transformers' model, then the native one built and loaded from it
        hf = GPT2LMHeadModel.from_pretrained(folder, attn_implementation="sdpa")
        c = hf.config
        model = GPT2(GPT2Config(c.vocab_size, c.n_layer, c.n_head, c.n_embd, c.n_positions))
        model.load_state_dict(from_hf_state_dict(hf.state_dict()))
        return model

    cfg = compose([f"model={size}", "model.impl=native", f"model.init_from={folder}"])
    build_model(compose([]).model, 512)  # the build's machinery, as in child_build
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    status = _status()
    with open("/proc/self/status") as f:
        anon = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("RssAnon"))
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    sampler = AnonPeak()
    model = before() if mode == "before" else build_model(cfg.model, 50257)
    anon_peak = sampler.stop()
    own = sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())
    print(json.dumps({"baseline": status["VmRSS"], "peak": _status()["VmHWM"],
                      "anon": anon, "anon_peak": anon_peak, "model": own}))  # fmt: skip


def pretrained_rows(sizes: list[str]) -> list[str]:
    rows = [
        "model.init_from (a save_pretrained folder), model.impl=native, on the CPU: peak - "
        "baseline while loading (GB), all resident pages (VmHWM: the weights file's page "
        "cache included) and the process's own (RssAnon, sampled every 5 ms)",
        "",
        "| size | model | before: resident | before: own | after: resident | after: own | "
        "own before / model | own after / model |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for size in sizes:
        with tempfile.TemporaryDirectory() as folder:
            _child("--child-save", size, folder)
            got = {m: _child("--child-pretrained", size, m, folder) for m in ("before", "after")}
        model = got["after"]["model"]
        res = {m: g["peak"] - g["baseline"] for m, g in got.items()}
        own = {m: g["anon_peak"] - g["anon"] for m, g in got.items()}
        rows.append(
            f"| {size} | {model / GB:.3f} | {res['before'] / GB:.3f} | {own['before'] / GB:.3f} "
            f"| {res['after'] / GB:.3f} | {own['after'] / GB:.3f} | {own['before'] / model:.3f} "
            f"| {own['after'] / model:.3f} |"
        )
    return rows


def _child(*args: str) -> dict:
    """This file run as a child process with `args`; the JSON it prints last, if any."""
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    lines = proc.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}


# -- 2. runs, sampled from outside ---------------------------------------------------------
def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids += [int(k) for k in f.read().split()]
    except OSError:
        pass
    return kids


def _is_train(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"launcher.train" in f.read()
    except OSError:
        return False


def sample(cmd: list[str], env: dict, agent: bool, log: Path) -> dict[int, dict]:
    """Run `cmd` (`agent`: torchrun, whose children are the ranks; else the rank itself),
    its output to `log`; for each rank (by pid) its peak VmHWM, and the peak of what its
    DataLoader workers add: the anonymous pages of the rank and its workers (Pss_Anon,
    which splits each page over the processes that map it, so the sum counts it once)
    less the rank's own (RssAnon). Anonymous pages are shared within that fork family only."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    ranks: dict[int, dict] = {}
    while proc.poll() is None:
        for rank in _children(proc.pid) if agent else [proc.pid]:
            try:
                mine = _status(rank)
                workers = [_status(w) for w in _children(rank) if _is_train(w)]
            except OSError:
                continue
            peak = ranks.setdefault(rank, {"VmHWM": 0, "workers": 0, "count": 0})
            peak["VmHWM"] = max(peak["VmHWM"], mine["VmHWM"])
            if workers:
                family = mine["Pss_Anon"] + sum(w["Pss_Anon"] for w in workers)
                peak["workers"] = max(peak["workers"], family - mine["RssAnon"])
                peak["count"] = max(peak["count"], len(workers))
        time.sleep(0.05)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{tail}")
    return ranks


def run_rows(names: list[str], root: Path) -> list[str]:
    rows = [
        "| run | ranks | rank peak measured | planned | ratio | loop peak (mem/host_peak_gb) "
        "| workers add, measured | planned | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in names:
        nproc, overrides = RUNS[name]
        run_id = name.replace(" ", "-")
        args = [*SHORT, *overrides, f"run.root={root}", f"run.id={run_id}"]
        if nproc > 1:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc_per_node={nproc}", "-m", "launcher.train", *args]  # fmt: skip
        else:
            cmd = [sys.executable, "-m", "launcher.train", *args]
        ranks = sample(cmd, env, nproc > 1, root / f"{run_id}.log")
        summary = json.loads((root / run_id / "summary.json").read_text())
        cfg = compose([*SHORT, *overrides, f"cluster.procs_per_node={nproc}"])
        cfg.model.vocab_size = VOCAB
        rank = host.rank_bytes(cfg, nproc, nproc, on_gpu=False)["total"]
        workers = host.workers_bytes(cfg, nproc, on_gpu=False)
        measured = max(r["VmHWM"] for r in ranks.values())
        added = max(r["workers"] for r in ranks.values())
        rows.append(
            f"| {name} | {nproc} | {measured / GB:.3f} | {rank / GB:.3f} | "
            f"{measured / rank:.2f} | {summary['mem/host_peak_gb']:.3f} | "
            f"{added / GB:.3f} | {workers / GB:.3f} | {added / workers:.2f} |"
        )
    return rows


def main() -> int:
    children = {"--child-build": child_build, "--child-save": child_save,
                "--child-pretrained": child_pretrained}  # fmt: skip
    if len(sys.argv) > 1 and sys.argv[1] in children:
        children[sys.argv[1]](*sys.argv[2:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=BUILD_SIZES, help="sizes, comma-separated, or none")
    parser.add_argument("--runs", default="all", help="all, none, or names from RUNS")
    parser.add_argument("--impl", default="native", choices=["native", "hf"])
    parser.add_argument("--pretrained", default="gpt2", help="sizes, comma-separated, or none")
    args = parser.parse_args()
    print(f"load: {os.getloadavg()[0]:.2f} (1 min) on {os.cpu_count()} cores\n")
    if args.build != "none":
        print("\n".join(build_rows(args.build.split(","), args.impl)))
        print()
    if args.pretrained != "none":
        print("\n".join(pretrained_rows(args.pretrained.split(","))))
        print()
    names = {"all": list(RUNS), "none": []}.get(args.runs, args.runs.split(","))
    if names:
        with tempfile.TemporaryDirectory() as tmp:
            print("\n".join(run_rows(names, Path(tmp))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
