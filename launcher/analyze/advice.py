"""Findings -> the knob that addresses each, with the evidence. No advice without evidence:
a rule speaks only when its figure crosses its threshold in the profiled steps, and never
recommends a setting the run already has (`RunFacts`, from the run directory)."""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass

from launcher.analyze.breakdown import StepBreakdown
from launcher.analyze.facts import RunFacts
from launcher.analyze.kernels import class_table, classify
from launcher.analyze.trace import LOOP_READ

SHARE = 0.05  # a cost worth a knob: 5% of the step
IDLE_SHARE = 0.10  # GPU idle between kernels worth compiling away
SMALL_KERNEL_US = 20.0  # a kernel this short finishes before the CPU launches the next
MATMUL_SHARE = 0.25  # matrix kernels' share of GPU compute that bf16 would speed up
MEMORY_BOUND_SHARE = 0.30  # memory-bound kernels' share of GPU compute worth fusing away
ATTENTION_SHARE = 0.20  # attention kernels' share of GPU compute worth timing SDPA's others
FUSED_ATTENTION = ("cudnn", "flash")  # SDPA's fused kernels for bf16/fp16 on a GPU
MEMORY_FULL = 0.90  # peak memory / device memory

HALF_KERNEL = re.compile(r"bf16|f16|fp16|half|h1688|h16816|e4m3|e5m2|hgemm", re.IGNORECASE)
# The next compile mode that removes more launch overhead (reduce-overhead: CUDA graphs).
NEXT_COMPILE = {"off": "default", "default": "reduce-overhead"}


ACCUM_STEPS = 4  # micro-steps per rank and step from which a larger micro-batch is advised


@dataclass
class Advice:
    finding: str
    knobs: str
    evidence: str
    kind: str = ""  # which rule found it (data_wait, exposed_comm, ...): what launcher.tune reads


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def advise(
    rows: list[StepBreakdown],
    waited_for: dict[int, int] | None = None,
    facts: RunFacts | None = None,
) -> list[Advice]:
    """Findings over every profiled (rank, step). `waited_for` counts, per rank, the
    all-reduces that waited for it (report.stragglers): exposed communication that is
    mostly waiting for one rank is a straggler, not a network, problem."""
    if not rows:
        return []
    facts = facts or RunFacts()
    gpu = [r for r in rows if r.gpu]
    # Time by kernel class over the GPU rank-steps, for the rules that read it.
    classes = class_table([r.ops for r in gpu], [r.flops for r in gpu], None) if gpu else []
    memory = _memory_pressure(rows, facts)
    found = {
        "data_wait": _data_wait(rows),
        "exposed_comm": _exposed_comm(rows, waited_for or {}),
        "pageable_copies": _pageable_copies(rows),
        "syncs": _syncs(rows),
        "launch_bound": _launch_bound(gpu, facts),
        "fp32_matmuls": _fp32_matmuls(gpu, facts),
        "memory_bound": _memory_bound(classes, facts),
        "attention": _attention(gpu, classes, facts),
        "memory_pressure": memory,
        "accumulation": None if memory else _accumulation(rows, facts),
    }
    for kind, advice in found.items():
        if advice is not None:
            advice.kind = kind
    return [a for a in found.values() if a is not None]


def _data_wait(rows: list[StepBreakdown]) -> Advice | None:
    step = _mean([r.step_s for r in rows])
    wait = _mean([r.data_wait_s for r in rows])
    if wait <= SHARE * step:
        return None
    worst = max(rows, key=lambda r: r.data_wait_s)
    return Advice(
        "the step waits for data",
        "data.num_workers (more DataLoader workers), data.pin_memory=true, "
        "data.prefetch_factor; with workers, /dev/shm large enough (docs/shared-memory.md)",
        f"{wait * 1e3:.1f} ms per step in `enumerate(DataLoader)#...__next__` "
        f"({wait / step:.0%} of {step * 1e3:.1f} ms); worst rank {worst.rank}, "
        f"step {worst.step}: {worst.data_wait_s * 1e3:.1f} ms",
    )


def _exposed_comm(rows: list[StepBreakdown], waits: dict[int, int]) -> Advice | None:
    step = _mean([r.step_s for r in rows])
    exposed = _mean([r.exposed_comm_s for r in rows])
    if exposed <= SHARE * step:
        return None
    ratios = [r.overlap_ratio for r in rows if r.overlap_ratio is not None]
    counts = sorted(
        {r.collectives.get("all_reduce", r.collectives.get("AllReduce", (0,)))[0] for r in rows}
    )
    total = sum(waits.values())
    late = max(waits, key=waits.get) if total else None
    straggler = (
        f"; {waits[late]} of {total} all-reduces waited for rank {late}, so part of "
        f"this is waiting for a slower rank, not communication"
        if total and waits[late] > 0.75 * total
        else ""
    )
    return Advice(
        "gradient communication is exposed (not hidden behind compute)",
        "strategy.bucket_cap_mb (sweep it: +exp=bucket_sweep), "
        "strategy.comm_hook=bf16 on bandwidth-bound networks, the nccl presets "
        "(docs/communication.md#tuning-guide)",
        f"{exposed * 1e3:.1f} ms per step of communication with no computation "
        f"running ({exposed / step:.0%} of the step); overlap ratio "
        f"{_mean(ratios):.2f}; {'/'.join(map(str, counts))} all-reduce(s) per step"
        f"{straggler}",
    )


def _pageable_copies(rows: list[StepBreakdown]) -> Advice | None:
    pageable = sum(r.h2d_pageable for r in rows)
    if not pageable:
        return None
    return Advice(
        "host-to-device copies from pageable memory",
        "data.pin_memory=true (pinned buffers make copies asynchronous with "
        "non_blocking=True, which the trainer uses)",
        f"{pageable} `Memcpy HtoD (Pageable -> Device)` in {len(rows)} profiled "
        f"rank-steps; {_mean([r.h2d_s for r in rows]) * 1e3:.2f} ms of copies per step",
    )


def _syncs(rows: list[StepBreakdown]) -> Advice | None:
    # On a CPU trace only the loop's own reads are worth a finding (inside operators they
    # read host memory); on a GPU every scalar read waits for the device.
    loop_reads: dict[str, int] = {}
    for r in rows:
        for name, count in r.syncs.items():
            if name == LOOP_READ or r.gpu:
                loop_reads[name] = loop_reads.get(name, 0) + count
    if not loop_reads:
        return None
    calls = ", ".join(f"`{n}` x{c / len(rows):.1f}" for n, c in sorted(loop_reads.items()))
    return Advice(
        "synchronisations inside the step",
        "remove the host reads that cause them: `.item()`, `float(t)`, `bool(t)`, "
        "`print(t)` of device tensors in the loop, or data-dependent Python control "
        "flow in the model; read metrics only at log steps",
        f"per rank-step: {calls}; {_mean([r.sync_s for r in rows]) * 1e3:.2f} ms",
    )


def _launch_bound(gpu: list[StepBreakdown], facts: RunFacts) -> Advice | None:
    """Many short kernels with the GPU idle between them: the CPU cannot launch them as
    fast as the GPU runs them. Compilation fuses them (fewer launches); CUDA graphs
    (reduce-overhead) replay the whole step with one launch."""
    mode = NEXT_COMPILE.get(facts.compile or "off")
    if not gpu or mode is None:
        return None
    step = _mean([r.step_s for r in gpu])
    idle = _mean([r.idle_s for r in gpu])
    kernels = [d for r in gpu for durs in r.ops.values() for d in durs]
    if not kernels or idle <= IDLE_SHARE * step:
        return None
    median_us = statistics.median(kernels)
    if median_us >= SMALL_KERNEL_US:
        return None
    return Advice(
        "many small kernels with the GPU idle between them (launch-bound)",
        f"trainer.compile={mode} (fuses kernels"
        + ("; reduce-overhead replays the step as one CUDA graph)" if mode != "default" else ")")
        + ", or a larger trainer.micro_batch_size (more work per kernel)",
        f"{len(kernels) / len(gpu):.0f} kernels per step, median {median_us:.1f} us; the GPU "
        f"idles {idle * 1e3:.2f} ms per step ({idle / step:.0%} of the step) between them",
    )


def _fp32_matmuls(gpu: list[StepBreakdown], facts: RunFacts) -> Advice | None:
    """Matrix multiplications that dominate GPU time without running in bf16/fp16: tensor
    cores do several times the fp32 (even TF32) rate in bf16."""
    if not gpu or facts.precision in ("bf16", "fp16"):
        return None
    compute = sum(r.compute_s for r in gpu)
    matmul: dict[str, float] = {}
    for r in gpu:
        for name, durs in r.ops.items():
            if classify(name).name == "matmul":
                matmul[name] = matmul.get(name, 0.0) + sum(durs) * 1e-6
    total = sum(matmul.values())
    half = sum(t for name, t in matmul.items() if HALF_KERNEL.search(name))
    if not compute or total <= MATMUL_SHARE * compute or half > SHARE * total:
        return None
    top = max(matmul, key=matmul.get)
    said = f"; trainer.precision={facts.precision}" if facts.precision else ""
    return Advice(
        "matrix multiplications run in fp32 (no bf16 tensor-core work)",
        "trainer.precision=bf16 (autocast: matmuls in bf16, weights and optimizer in fp32)",
        f"{total / len(gpu) * 1e3:.2f} ms per step in matrix kernels ({total / compute:.0%} of "
        f"GPU compute), {half / total:.0%} of it in bf16/fp16; largest `{top[:80]}`{said}",
    )


def _memory_bound(classes: list[dict], facts: RunFacts) -> Advice | None:
    """Memory-bound kernels (elementwise, normalisation, softmax and loss, reductions, the
    optimizer) taking a large share of GPU compute: each is a pass over memory for little
    arithmetic, and compilation fuses them into fewer passes. Compiled already, with
    transformers' GPT-2, the loss stays outside the compiled region on fp32 logits; the
    native GPT-2 computes it inside."""
    memory = [r for r in classes if r["bound"] == "memory"]
    share = sum(r["share"] for r in memory)
    if share <= MEMORY_BOUND_SHARE:
        return None
    if (facts.compile or "off") == "off":
        knobs = "trainer.compile=default (fuses elementwise, normalisation and loss kernels)"
    elif facts.impl == "hf":
        knobs = "model.impl=native (its loss runs inside the compiled region)"
    else:
        return None
    top = ", ".join(f"{r['class']} {r['share']:.0%}" for r in memory[:3])
    per_step = sum(r["seconds_per_step"] for r in memory)
    return Advice(
        "memory-bound kernels take a large share of GPU compute",
        knobs,
        f"{per_step * 1e3:.2f} ms per step ({share:.0%} of kernel time) in memory-bound "
        f"kernels: {top}",
    )


def _attention(gpu: list[StepBreakdown], classes: list[dict], facts: RunFacts) -> Advice | None:
    """Attention kernels taking a large share of GPU compute: SDPA's fused kernels (cuDNN's,
    FlashAttention-2) differ in speed by GPU generation and torch and cuDNN version, so the
    one the run used is worth timing against the other. Both take bf16/fp16 only."""
    if facts.precision not in ("bf16", "fp16"):
        return None
    row = next((r for r in classes if r["class"] == "attention"), None)
    if row is None or row["share"] <= ATTENTION_SHARE:
        return None
    others = [k for k in FUSED_ATTENTION if k != facts.attention]
    spent: dict[str, float] = {}
    for r in gpu:
        for name, durations in r.ops.items():
            if classify(name).name == "attention":
                spent[name] = spent.get(name, 0.0) + sum(durations)
    names = ", ".join(f"`{n}`" for n in sorted(spent, key=lambda n: -spent[n])[:2])
    rate = "" if row["tflops"] is None else f", {row['tflops']:.3g} TFLOP/s achieved"
    return Advice(
        "attention kernels take a large share of GPU compute",
        " or ".join(f"model.attention={k}" for k in others) + " (SDPA's other fused "
        "kernel: which is faster depends on the GPU and the torch and cuDNN versions; "
        "compare tokens/s)",
        f"{row['seconds_per_step'] * 1e3:.2f} ms per step ({row['share']:.0%} of kernel "
        f"time) in attention kernels{rate}: {names}",
    )


def _memory_pressure(rows: list[StepBreakdown], facts: RunFacts) -> Advice | None:
    """Peak memory close to the device's size, or the caching allocator going to the driver
    inside steady steps (it frees its cache to retry an allocation that did not fit)."""
    calls: dict[str, int] = {}
    for r in rows:
        for name, count in r.device_allocs.items():
            calls[name] = calls.get(name, 0) + count
    full = (
        facts.peak_mem_gb / facts.device_mem_gb
        if facts.peak_mem_gb and facts.device_mem_gb
        else None
    )
    if not calls.get("cudaFree") and (full is None or full < MEMORY_FULL):
        return None
    evidence = []
    if full is not None:
        evidence.append(
            f"peak {facts.peak_mem_gb:.1f} GB of the device's {facts.device_mem_gb:.1f} GB "
            f"({full:.0%})"
        )
    if calls:
        per = ", ".join(f"`{n}` x{c / len(rows):.1f}" for n, c in sorted(calls.items()))
        evidence.append(f"allocator calls to the driver per profiled step: {per}")
    knobs = []
    if not facts.grad_checkpointing:
        knobs.append("trainer.grad_checkpointing=true (recompute activations in backward)")
    micro = facts.micro_batch_size
    smaller = f"={micro // 2}" if micro and micro > 1 else ""
    knobs.append(
        f"a smaller trainer.micro_batch_size{smaller} with the same "
        "trainer.global_batch_size (gradient accumulation makes up the rest)"
    )
    return Advice("memory pressure", ", or ".join(knobs), "; ".join(evidence))


def _accumulation(rows: list[StepBreakdown], facts: RunFacts) -> Advice | None:
    """Many micro-steps per optimizer step with memory to spare: each runs the model on a
    small batch (per-call overhead, small kernels) where fewer, larger micro-batches do the
    same work; the global batch stays, so accumulation still makes it up. (Under memory
    pressure the memory rule asks for the opposite, so this one is silent then.)"""
    batch = facts.batch
    if batch is None:
        return None
    micro, world, accum = batch.micro_batch, batch.world_size, batch.accum
    if accum < ACCUM_STEPS:
        return None
    step = _mean([r.step_s for r in rows])
    return Advice(
        "gradient accumulation far beyond need: many small micro-batches per step",
        f"a larger trainer.micro_batch_size (up to {micro * accum}, no accumulation) with "
        f"the same trainer.global_batch_size={facts.global_batch_size}",
        f"{accum} micro-steps of {micro} sequence(s) per rank in every {step * 1e3:.1f} ms "
        f"step (global batch {facts.global_batch_size} over {world} ranks), no memory pressure",
    )
