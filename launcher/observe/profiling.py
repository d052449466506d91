"""Per-rank torch.profiler: which ranks, which steps, and where each rank's traces go.

Each profiled rank writes only into `runs/<id>/traces/rank<r>/`, one
`*.pt.trace.json` per recorded cycle, the Chrome trace format that TensorBoard's profiler
plugin, Perfetto and `launcher.analyze` read. Each training step is a `launcher/step <n>`
region in the trace (n counted as in metrics.jsonl: the step's number once completed), so
a trace says which steps it holds even after a resume. With `profiler.memory_snapshot`
on a GPU, the rank also writes `memory_snapshot.step<n>.pickle` there
(launcher.observe.memory_snapshot).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from torch import profiler as tp

from launcher.observe import memory_snapshot
from launcher.runtime.process import Runtime

if TYPE_CHECKING:
    from launcher.config.schema import ProfilerConfig


def trace_dir(rt: Runtime):
    return rt.run_dir / "traces" / f"rank{rt.rank}"


def build_profiler(pcfg: ProfilerConfig, rt: Runtime) -> tp.profile | None:
    """A started-on-enter profiler for this rank, or None when it is not profiled."""
    if pcfg.name == "off" or (pcfg.ranks and rt.rank not in pcfg.ranks):
        return None
    activities = [tp.ProfilerActivity.CPU]
    if rt.device.type == "cuda":
        activities.append(tp.ProfilerActivity.CUDA)
    folder = trace_dir(rt)
    folder.mkdir(parents=True, exist_ok=True)
    write_trace = tp.tensorboard_trace_handler(str(folder), worker_name=f"rank{rt.rank}")
    on_trace_ready = write_trace
    if pcfg.memory_snapshot and rt.device.type == "cuda":
        memory_snapshot.start_history()

        def on_trace_ready(prof: tp.profile) -> None:
            write_trace(prof)
            memory_snapshot.dump(folder / f"memory_snapshot.step{prof.step_num}.pickle")

    prof = tp.profile(
        activities=activities,
        schedule=tp.schedule(
            skip_first=pcfg.skip_first,
            wait=pcfg.wait,
            warmup=pcfg.warmup,
            active=pcfg.active,
            repeat=pcfg.repeat,
        ),
        on_trace_ready=on_trace_ready,
        record_shapes=pcfg.record_shapes,
        with_flops=pcfg.with_flops,
        profile_memory=pcfg.profile_memory,
        with_stack=pcfg.with_stack,
    )
    return prof


STEP_REGION = "launcher/step "


def step_region(prof: tp.profile | None, step: int):
    """Marks training step `step` in the trace (nothing when this rank is not profiled)."""
    if prof is None:
        return contextlib.nullcontext()
    return tp.record_function(f"{STEP_REGION}{step}")
