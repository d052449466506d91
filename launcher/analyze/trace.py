"""One rank's Chrome trace (`*.pt.trace.json`) as the analyser sees it: training steps,
communication spans and computation spans, on CPU/gloo and CUDA/NCCL traces alike.

- Steps are the trainer's `launcher/step <n>` regions (see launcher.profiling).
- Communication is every `gloo:all_reduce` on gloo's worker threads (CPU), or on a GPU
  every NCCL kernel and every other GPU activity launched from inside an NCCL call (with
  one rank NCCL's all-reduce is a device-to-device copy). The trainer's own control traffic
  uses all-gathers on a separate gloo group, so all-reduces are gradient communication.
- Computation is, on a GPU trace, every other kernel; on a CPU-only trace, every operator
  on the threads that are not gloo's, apart from the operators that only hand work to the
  communication backend.

On a GPU a kernel belongs to the step whose region contains the CPU call that launched it
(matched by correlation id), since kernels run after their launch.
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

STEP = re.compile(r"^launcher/step (\d+)$")
COMM_LAUNCH_OPS = ("c10d::", "record_param_comms", "nccl:", "gloo:")
NCCL_CALLS = ("nccl:", "record_param_comms")
GPU_KERNEL_CATS = ("kernel",)
GPU_ACTIVITY_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")


def is_nccl_kernel(name: str) -> bool:
    return name.startswith(("ncclKernel", "ncclDevKernel"))


@dataclass
class Step:
    number: int
    start: float  # microseconds, the trace's clock
    end: float
    comm: list[tuple[float, float]] = field(default_factory=list)
    compute: list[tuple[float, float]] = field(default_factory=list)


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
        regions = [
            Step(int(m.group(1)), e["ts"], e["ts"] + e["dur"])
            for e in self.events
            if e.get("ph") == "X"
            and e.get("cat") == "user_annotation"  # the CPU region, not its GPU mirror
            and (m := STEP.match(str(e.get("name", ""))))
        ]
        regions.sort(key=lambda s: s.start)
        if self.has_gpu:
            self._fill_gpu(regions)
        else:
            self._fill_cpu(regions)
        return regions

    def _fill_cpu(self, steps: list[Step]) -> None:
        names = self.thread_names()
        gloo = {key for key, name in names.items() if "gloo" in name}
        for e in self.events:
            if e.get("ph") != "X":
                continue
            span = (e["ts"], e["ts"] + e["dur"])
            name = str(e.get("name", ""))
            if name == "gloo:all_reduce":
                kind = "comm"
            elif (
                e.get("cat") == "cpu_op"
                and (e.get("pid"), e.get("tid")) not in gloo
                and not name.startswith(COMM_LAUNCH_OPS)
            ):
                kind = "compute"
            else:
                continue
            step = _containing(steps, span[0])
            if step is not None:
                getattr(step, kind).append(span)

    def _fill_gpu(self, steps: list[Step]) -> None:
        launches = {
            e["args"]["correlation"]: (e["ts"], e.get("tid"))
            for e in self.events
            if e.get("cat") in ("cuda_runtime", "cuda_driver")
            and "correlation" in e.get("args", {})
        }
        nccl_calls: dict = {}
        for e in self.events:
            if e.get("ph") == "X" and str(e.get("name", "")).startswith(NCCL_CALLS):
                nccl_calls.setdefault(e.get("tid"), []).append((e["ts"], e["ts"] + e["dur"]))
        for e in self.events:
            if e.get("cat") not in GPU_ACTIVITY_CATS or e.get("ph") != "X":
                continue
            launch = launches.get(e.get("args", {}).get("correlation"))
            step = _containing(steps, launch[0]) if launch is not None else None
            if step is None:
                continue
            span = (e["ts"], e["ts"] + e["dur"])
            name = str(e.get("name", ""))
            from_nccl = any(lo <= launch[0] <= hi for lo, hi in nccl_calls.get(launch[1], ()))
            if is_nccl_kernel(name) or from_nccl:
                step.comm.append(span)
            elif e.get("cat") in GPU_KERNEL_CATS:
                step.compute.append(span)


def _containing(steps: list[Step], ts: float) -> Step | None:
    for step in steps:
        if step.start <= ts <= step.end:
            return step
    return None


def load(path: Path) -> RankTrace:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
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
