"""One rank's Chrome trace (`*.pt.trace.json`) as the analyser sees it: training steps,
communication spans and computation spans, on CPU/gloo and CUDA/NCCL traces alike.

- Steps are the trainer's `launcher/step <n>` regions (see launcher.observe.profiling).
- Communication is every `gloo:all_reduce` on gloo's worker threads (CPU), or on a GPU
  every NCCL kernel and every other GPU activity launched from inside an NCCL call (with
  one rank NCCL's all-reduce is a device-to-device copy). The trainer's own control traffic
  uses all-gathers, gathers and broadcasts on a separate gloo group, so all-reduces are
  gradient communication.
- Computation is, on a GPU trace, every other kernel; on a CPU-only trace, every operator
  on the threads that are not gloo's, apart from the operators that only hand work to the
  communication backend.
- Data wait is the DataLoader's `enumerate(DataLoader)#...__next__` region on the CPU;
  host-to-device copies are `Memcpy HtoD` activities; synchronisations are scalar reads
  (`aten::_local_scalar_dense`, what `.item()`, `float()` and `bool()` of a tensor run)
  and CUDA's stream, device and event synchronise calls; `cudaMalloc`/`cudaFree` calls
  inside a step are the caching allocator running out of cached memory.
- FLOPs are counted on the operators that carry them (matrix products, SDPA's kernels; on
  any thread but gloo's, backward's included), by kernel class (launcher.analyze.kernels).

On a GPU a kernel belongs to the step whose region contains the CPU call that launched it
(matched by correlation id), since kernels run after their launch.
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from launcher.analyze.kernels import classify, op_flops

STEP = re.compile(r"^launcher/step (\d+)$")
DATA_WAIT = "enumerate(DataLoader)"
SYNC_OPS = ("aten::_local_scalar_dense",)
LOOP_READ = "scalar read in the training loop (.item())"
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
# The caching allocator calls the driver only when its cache cannot serve a request; in a
# steady step that means it is freeing cached blocks to retry an allocation: memory pressure.
ALLOC_CALLS = ("cudaMalloc", "cudaFree")
NCCL_KERNEL = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
COMM_LAUNCH_OPS = ("c10d::", "record_param_comms", "nccl:", "gloo:")
NCCL_CALLS = ("nccl:", "record_param_comms")
GPU_KERNEL_CATS = ("kernel",)
GPU_ACTIVITY_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")


Span = tuple[float, float]


@dataclass
class Step:
    """One training step of one rank: its spans by kind, in the trace's microseconds."""

    number: int
    start: float
    end: float
    comm: list[Span] = field(default_factory=list)  # gradient communication
    compute: list[Span] = field(default_factory=list)
    collectives: dict[str, list[Span]] = field(default_factory=dict)  # every collective
    data_wait: list[Span] = field(default_factory=list)
    h2d: list[Span] = field(default_factory=list)
    h2d_pageable: int = 0
    syncs: dict[str, list[Span]] = field(default_factory=dict)
    device_allocs: dict[str, int] = field(default_factory=dict)  # cudaMalloc/cudaFree calls
    ops: dict[str, list[float]] = field(default_factory=dict)  # name -> durations (us)
    flops: dict[str, float] = field(default_factory=dict)  # kernel class -> FLOPs

    def add_op(self, name: str, dur: float) -> None:
        self.ops.setdefault(name, []).append(dur)

    def add_flops(self, name: str, args: dict) -> None:
        work = op_flops(name, args)
        if work:
            cls = classify(name).name
            self.flops[cls] = self.flops.get(cls, 0.0) + work


@dataclass
class RankTrace:
    path: Path
    rank: int
    events: list[dict]
    meta: dict

    @property
    def has_gpu(self) -> bool:
        return any(e.get("cat") in GPU_KERNEL_CATS for e in self.events)

    def thread_names(self) -> dict[tuple, str]:
        return {
            (e.get("pid"), e.get("tid")): e.get("args", {}).get("name", "")
            for e in self.events
            if e.get("ph") == "M" and e.get("name") == "thread_name"
        }

    def steps(self) -> list[Step]:
        """Training steps in this trace, with their communication and computation spans."""
        regions = [  # the CPU region (_is_step), not its GPU mirror
            Step(int(STEP.match(e["name"]).group(1)), e["ts"], e["ts"] + e["dur"])
            for e in self.events
            if _is_step(e)
        ]
        regions.sort(key=lambda s: s.start)
        gpu = self.has_gpu
        self._fill_host(regions, cpu_compute=not gpu)
        if gpu:
            self._fill_gpu(regions)
        return regions

    def _fill_host(self, steps: list[Step], cpu_compute: bool) -> None:
        """CPU-side events: gloo collectives, data wait, synchronisations, top-level
        operators and, on a CPU-only trace, computation.

        Every scalar read goes through `aten::_local_scalar_dense`; it is named by the
        top-level operator it ran inside (`scalar read in aten::is_nonzero`), or
        `LOOP_READ` when the training loop itself read a scalar (`.item()`, `float(t)`).

        An event belongs to the step it starts in, and only its part inside that step
        counts: gloo's worker thread completes an all-reduce's future (which lets the
        training thread go on and end the step) before it closes the `gloo:all_reduce`
        event, so on a busy machine the recorded event can end well after the step that
        waited for it; unclipped, a step's communication could exceed the step itself.
        """
        gloo = {key for key, name in self.thread_names().items() if "gloo" in name}
        main = {(e.get("pid"), e.get("tid")) for e in self.events if _is_step(e)}
        top: dict = {}  # thread -> (name, end) of the top-level operator running there
        for e in sorted(self.events, key=lambda e: e.get("ts", 0)):
            if e.get("ph") != "X" or e.get("cat") in GPU_ACTIVITY_CATS:
                continue
            step = _containing(steps, e["ts"])
            if step is None:
                continue
            span = (e["ts"], min(e["ts"] + e["dur"], step.end))
            name, cat, thread = str(e.get("name", "")), e.get("cat"), (e.get("pid"), e.get("tid"))
            if name.startswith("gloo:"):
                step.collectives.setdefault(name.removeprefix("gloo:"), []).append(span)
                if name == "gloo:all_reduce":
                    step.comm.append(span)
            elif name.startswith(DATA_WAIT) and thread in main:
                step.data_wait.append(span)
            elif cat in LAUNCH_CATS and name.startswith(SYNC_CALLS):
                step.syncs.setdefault(name, []).append(span)
            elif cat in LAUNCH_CATS and name in ALLOC_CALLS:
                step.device_allocs[name] = step.device_allocs.get(name, 0) + 1
            elif cat == "cpu_op" and thread not in gloo:
                parent, parent_end = top.get(thread, ("", 0.0))
                nested = span[0] < parent_end
                if not nested and thread in main:
                    top[thread] = (name, span[1])
                    if cpu_compute:  # on a GPU trace the operators that count are kernels
                        step.add_op(name, e["dur"])
                if name.startswith(SYNC_OPS):
                    inside = nested and parent != "aten::item"
                    label = f"scalar read in {parent}" if inside else LOOP_READ
                    step.syncs.setdefault(label, []).append(span)
                if cpu_compute and not name.startswith(COMM_LAUNCH_OPS):
                    step.compute.append(span)
                step.add_flops(name, e.get("args") or {})

    def _fill_gpu(self, steps: list[Step]) -> None:
        """GPU activities, each in the step whose region holds the call that launched it."""
        launches = {
            e["args"]["correlation"]: (e["ts"], e.get("tid"))
            for e in self.events
            if e.get("cat") in LAUNCH_CATS and "correlation" in e.get("args", {})
        }
        nccl_calls: dict = {}
        for e in self.events:
            if e.get("ph") == "X" and str(e.get("name", "")).startswith(NCCL_CALLS):
                nccl_calls.setdefault(e.get("tid"), []).append((e["ts"], e["ts"] + e["dur"]))
        for e in self.events:
            if e.get("ph") != "X" or e.get("cat") not in GPU_ACTIVITY_CATS:
                continue
            launch = launches.get(e.get("args", {}).get("correlation"))
            step = _containing(steps, launch[0]) if launch is not None else None
            if step is None:
                continue
            from_nccl = any(lo <= launch[0] <= hi for lo, hi in nccl_calls.get(launch[1], ()))
            span = (e["ts"], e["ts"] + e["dur"])
            _place_gpu_activity(step, str(e.get("name", "")), e.get("cat"), span, from_nccl)


def _place_gpu_activity(step: Step, name: str, cat: str, span: Span, from_nccl: bool) -> None:
    match = NCCL_KERNEL.match(name)
    if match or from_nccl:
        step.comm.append(span)
        step.collectives.setdefault(match.group(1) if match else "nccl", []).append(span)
    elif cat == "gpu_memcpy" and "HtoD" in name:
        step.h2d.append(span)
        step.h2d_pageable += "Pageable" in name
    elif cat in GPU_KERNEL_CATS:
        step.compute.append(span)
        step.add_op(name, span[1] - span[0])


def _is_step(e: dict) -> bool:
    return (
        e.get("ph") == "X"
        and e.get("cat") == "user_annotation"
        and STEP.match(str(e.get("name", ""))) is not None
    )


def _containing(steps: list[Step], ts: float) -> Step | None:
    for step in steps:
        if step.start <= ts <= step.end:
            return step
    return None


class TraceError(ValueError):
    """A trace file that cannot be read as a profiler trace, worded as one line."""

    def __init__(self, path: Path, reason: str):
        super().__init__(
            f"{path}: not a readable profiler trace ({reason}); record it again "
            "(profiler=steps) or move it out of traces/"
        )


def load(path: Path) -> RankTrace:
    """One trace file; raises TraceError when it is truncated, not JSON or not a trace."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt") as f:
            data = json.load(f)
    except (OSError, EOFError, ValueError) as exc:  # ValueError: bad JSON or encoding
        raise TraceError(path, f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents", []), list):
        raise TraceError(path, "no traceEvents list")
    info = data.get("distributedInfo") or {}
    rank = info.get("rank")
    if rank is None:  # a trace written without a process group: take it from the folder
        match = re.search(r"rank(\d+)", str(path))
        rank = int(match.group(1)) if match else 0
    meta = {k: v for k, v in data.items() if k != "traceEvents"}
    return RankTrace(path, int(rank), data.get("traceEvents", []), meta)


def rank_trace_files(run_dir: Path) -> dict[int, list[Path]]:
    """Each rank's trace files under run_dir/traces/rank<r>/."""
    out: dict[int, list[Path]] = {}
    for folder in sorted((run_dir / "traces").glob("rank*")):
        files = sorted(folder.glob("*.pt.trace.json*"))
        if files:
            out[int(folder.name.removeprefix("rank"))] = files
    return out
