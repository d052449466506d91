"""Findings -> the knob that addresses each, with the evidence. No advice without evidence:
a rule speaks only when its figure crosses its threshold in the profiled steps."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.analyze.breakdown import StepBreakdown
from launcher.analyze.trace import LOOP_READ

SHARE = 0.05  # a cost worth a knob: 5% of the step


@dataclass
class Advice:
    finding: str
    knobs: str
    evidence: str


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def advise(rows: list[StepBreakdown], waited_for: dict[int, int] | None = None) -> list[Advice]:
    """Findings over every profiled (rank, step). `waited_for` counts, per rank, the
    all-reduces that waited for it (report.stragglers): exposed communication that is
    mostly waiting for one rank is a straggler, not a network, problem."""
    if not rows:
        return []
    step = _mean([r.step_s for r in rows])
    out = []
    wait = _mean([r.data_wait_s for r in rows])
    if wait > SHARE * step:
        worst = max(rows, key=lambda r: r.data_wait_s)
        out.append(
            Advice(
                "the step waits for data",
                "data.num_workers (more DataLoader workers), data.pin_memory=true, "
                "data.prefetch_factor; with workers, /dev/shm large enough (docs/shared-memory.md)",
                f"{wait * 1e3:.1f} ms per step in `enumerate(DataLoader)#...__next__` "
                f"({wait / step:.0%} of {step * 1e3:.1f} ms); worst rank {worst.rank}, "
                f"step {worst.step}: {worst.data_wait_s * 1e3:.1f} ms",
            )
        )
    exposed = _mean([r.exposed_comm_s for r in rows])
    if exposed > SHARE * step:
        ratios = [r.overlap_ratio for r in rows if r.overlap_ratio is not None]
        counts = sorted(
            {r.collectives.get("all_reduce", r.collectives.get("AllReduce", (0,)))[0] for r in rows}
        )
        waits = waited_for or {}
        total = sum(waits.values())
        late = max(waits, key=waits.get) if total else None
        straggler = (
            f"; {waits[late]} of {total} all-reduces waited for rank {late}, so part of "
            f"this is waiting for a slower rank, not communication"
            if total and waits[late] > 0.75 * total
            else ""
        )
        out.append(
            Advice(
                "gradient communication is exposed (not hidden behind compute)",
                "strategy.bucket_cap_mb (sweep it: +exp=bucket_sweep), "
                "strategy.comm_hook=bf16 on bandwidth-bound networks, the nccl presets "
                "(docs/communication.md#tuning-guide)",
                f"{exposed * 1e3:.1f} ms per step of communication with no computation "
                f"running ({exposed / step:.0%} of the step); overlap ratio "
                f"{_mean(ratios):.2f}; {'/'.join(map(str, counts))} all-reduce(s) per step"
                f"{straggler}",
            )
        )
    pageable = sum(r.h2d_pageable for r in rows)
    h2d = _mean([r.h2d_s for r in rows])
    if pageable:
        out.append(
            Advice(
                "host-to-device copies from pageable memory",
                "data.pin_memory=true (pinned buffers make copies asynchronous with "
                "non_blocking=True, which the trainer uses)",
                f"{pageable} `Memcpy HtoD (Pageable -> Device)` in {len(rows)} profiled "
                f"rank-steps; {h2d * 1e3:.2f} ms of copies per step",
            )
        )
    # On a CPU trace only the loop's own reads are worth a finding (inside operators they
    # read host memory); on a GPU every scalar read waits for the device.
    loop_reads = {}
    for r in rows:
        for name, count in r.syncs.items():
            if name == LOOP_READ or r.gpu:
                loop_reads[name] = loop_reads.get(name, 0) + count
    if loop_reads:
        calls = ", ".join(f"`{n}` x{c / len(rows):.1f}" for n, c in sorted(loop_reads.items()))
        out.append(
            Advice(
                "synchronisations inside the step",
                "remove the host reads that cause them: `.item()`, `float(t)`, `bool(t)`, "
                "`print(t)` of device tensors in the loop, or data-dependent Python control "
                "flow in the model; read metrics only at log steps",
                f"per rank-step: {calls}; {_mean([r.sync_s for r in rows]) * 1e3:.2f} ms",
            )
        )
    return out
