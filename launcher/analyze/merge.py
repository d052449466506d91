"""One trace holding every rank, clock-aligned, each rank in its own lane (Perfetto,
chrome://tracing).

Ranks on different hosts do not share a clock. Every rank leaves a gradient all-reduce at
nearly the same moment (none can finish before all have contributed), so the offset of
rank r is the median, over the profiled all-reduces, of its end time minus rank 0's.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from launcher.analyze.breakdown import StepBreakdown
from launcher.analyze.trace import load, rank_trace_files


def clock_offsets(rows: list[StepBreakdown]) -> dict[int, float]:
    """Microseconds to subtract from each rank's timestamps to put it on rank 0's clock."""
    ends = {(r.rank, r.step): r.comm_ends for r in rows}
    ranks = sorted({r.rank for r in rows})
    base = min(ranks)
    offsets = {base: 0.0}
    for rank in ranks:
        if rank == base:
            continue
        diffs = [
            mine - theirs
            for (rk, step), mine_ends in ends.items()
            if rk == rank and (base, step) in ends
            for mine, theirs in zip(mine_ends, ends[(base, step)], strict=False)
        ]
        offsets[rank] = statistics.median(diffs) if diffs else 0.0
    return offsets


def write_merged_trace(run_dir: Path, offsets: dict[int, float], out: Path) -> Path:
    events = []
    for rank, files in rank_trace_files(run_dir).items():
        shift = offsets.get(rank, 0.0)
        events.append(
            {"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}}
        )
        events.append(
            {"ph": "M", "name": "process_sort_index", "pid": rank, "args": {"sort_index": rank}}
        )
        for path in files:
            for e in load(path).events:
                if e.get("cat") == "ac2g" or (
                    e.get("ph") == "M" and e.get("name") in ("process_name", "process_sort_index")
                ):
                    continue  # flow arrows would join ranks whose ids collide
                moved = dict(e, pid=rank)
                if "ts" in moved:
                    moved["ts"] = moved["ts"] - shift
                events.append(moved)
    out.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    return out
