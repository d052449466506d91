"""The analysis of a run directory's traces: per rank and step breakdown, overlap,
stragglers, top operators, compute by kernel class, advice; written as
analysis/report.{md,json} and a merged trace."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict
from pathlib import Path

from launcher.analyze.advice import advise
from launcher.analyze.breakdown import StepBreakdown, run_breakdown
from launcher.analyze.facts import read_facts
from launcher.analyze.kernels import bound_shares, class_table
from launcher.analyze.merge import clock_offsets, write_merged_trace
from launcher.observe.peaks import peak_for_name

TOP = 10
COLUMNS = (
    ("step_s", "step time"),
    ("compute_s", "compute"),
    ("comm_s", "comm"),
    ("exposed_comm_s", "exposed"),
    ("data_wait_s", "data wait"),
    ("h2d_s", "H2D"),
    ("sync_s", "sync"),
    ("idle_s", "idle"),
)


def stragglers(rows: list[StepBreakdown], offsets: dict[int, float]) -> list[dict]:
    """Per step: the slowest rank and by how much; at each gradient all-reduce, the rank
    that started it last (on rank 0's clock), whom the others waited for."""
    out = []
    for step in sorted({r.step for r in rows}):
        ranks = [r for r in rows if r.step == step]
        if len(ranks) < 2:
            continue
        slowest = max(ranks, key=lambda r: r.step_s)
        median = statistics.median(r.step_s for r in ranks)
        waited: dict[int, int] = {}
        for k in range(min(len(r.comm_starts) for r in ranks)):
            last = max(ranks, key=lambda r: r.comm_starts[k] - offsets.get(r.rank, 0.0))
            waited[last.rank] = waited.get(last.rank, 0) + 1
        out.append(
            {
                "step": step,
                "slowest_rank": slowest.rank,
                "step_s": slowest.step_s,
                "behind_median_s": slowest.step_s - median,
                "waited_for": dict(sorted(waited.items())),
            }
        )
    return out


def top_ops(rows: list[StepBreakdown]) -> list[dict]:
    totals: dict[str, list[float]] = {}
    for r in rows:
        for name, durs in r.ops.items():
            totals.setdefault(name, []).extend(durs)
    ranked = sorted(totals.items(), key=lambda kv: -sum(kv[1]))[:TOP]
    steps = max(len(rows), 1)
    return [
        {"name": n, "seconds_per_step": sum(d) * 1e-6 / steps, "calls_per_step": len(d) / steps}
        for n, d in ranked
    ]


def analyze(run_dir: Path) -> dict:
    rows = run_breakdown(run_dir)
    if not rows:
        raise FileNotFoundError(
            f"{run_dir}: no profiled steps in traces/rank*/; run with profiler=steps"
        )
    offsets = clock_offsets(rows)
    late = stragglers(rows, offsets)
    waited: dict[int, int] = {}
    for s in late:
        for rank, count in s["waited_for"].items():
            waited[rank] = waited.get(rank, 0) + count
    out = run_dir / "analysis"
    out.mkdir(exist_ok=True)
    merged = write_merged_trace(run_dir, offsets, out / "merged_trace.json")
    per_step = [
        {
            k: v
            for k, v in asdict(r).items()
            if k not in ("ops", "flops", "comm_starts", "comm_ends")
        }
        for r in rows
    ]
    facts = read_facts(run_dir)
    peak = peak_for_name(facts.device_name) if rows[0].gpu else None
    classes = class_table([r.ops for r in rows], [r.flops for r in rows], peak)
    return {
        "run_dir": str(run_dir),
        "device": "gpu" if rows[0].gpu else "cpu",
        "ranks": sorted({r.rank for r in rows}),
        "steps": sorted({r.step for r in rows}),
        "per_step": per_step,
        "per_rank": {
            rank: {
                key: statistics.mean(getattr(r, key) for r in rows if r.rank == rank)
                for key, _ in COLUMNS
            }
            for rank in sorted({r.rank for r in rows})
        },
        "stragglers": late,
        "top_ops": top_ops(rows),
        "kernel_classes": classes,
        "bound_shares": bound_shares(classes),
        "peak_flops": peak,
        "advice": [asdict(a) for a in advise(rows, waited, facts)],
        "clock_offsets_us": offsets,
        "merged_trace": str(merged.relative_to(run_dir)),
        "skipped": facts.skipped,
    }


def _ms(value) -> str:
    return "-" if value is None else f"{value * 1e3:.2f}"


def markdown(report: dict) -> str:
    lines = [
        f"# Trace analysis: {report['run_dir']}",
        "",
        f"{report['device'].upper()} traces of ranks {report['ranks']}, profiled steps "
        f"{report['steps']}. Milliseconds per step; overlap: time computing while "
        "communicating / time communicating.",
        "",
        "## Where each rank's step went",
        "",
        "| rank | step | "
        + " | ".join(label for _, label in COLUMNS)
        + " | overlap | collectives | syncs |",
        "|" + " --- |" * (len(COLUMNS) + 5),
    ]
    for r in report["per_step"]:
        colls = ", ".join(f"{n} x{c}" for n, (c, _) in r["collectives"].items()) or "-"
        syncs = ", ".join(f"{n} x{c}" for n, c in r["syncs"].items()) or "-"
        overlap = "-" if r["overlap_ratio"] is None else f"{r['overlap_ratio']:.2f}"
        cells = " | ".join(_ms(r[key]) for key, _ in COLUMNS)
        lines.append(f"| {r['rank']} | {r['step']} | {cells} | {overlap} | {colls} | {syncs} |")
    lines += ["", "## Stragglers", ""]
    if report["stragglers"]:
        lines += [
            "| step | slowest rank | its step | behind the median | all-reduces waiting for rank |",
            "| --- | --- | --- | --- | --- |",
        ]
        for s in report["stragglers"]:
            waited = ", ".join(f"rank {k}: {v}" for k, v in s["waited_for"].items()) or "-"
            lines.append(
                f"| {s['step']} | {s['slowest_rank']} | {_ms(s['step_s'])} | "
                f"{_ms(s['behind_median_s'])} | {waited} |"
            )
    else:
        lines.append("One rank profiled: no comparison.")
    lines += [
        "",
        "## Top operators (top-level CPU operators, or GPU kernels)",
        "",
        "| operator | ms per step | calls per step |",
        "| --- | --- | --- |",
    ]
    lines += [
        f"| `{o['name'][:90]}` | {_ms(o['seconds_per_step'])} | {o['calls_per_step']:.1f} |"
        for o in report["top_ops"]
    ]
    lines += kernel_class_lines(report)
    lines += ["", "## Advice", ""]
    if report["advice"]:
        for a in report["advice"]:
            lines += [f"- **{a['finding']}**: turn {a['knobs']}.", f"  Evidence: {a['evidence']}."]
    else:
        lines.append("Nothing crossed a threshold in the profiled steps: no advice.")
    lines += [
        "",
        f"Merged trace of all ranks, clock-aligned: `{report['merged_trace']}` "
        "(open in https://ui.perfetto.dev).",
    ]
    lines += ["", *(f"Skipped {why}." for why in report.get("skipped", []))]
    return "\n".join(lines) + "\n"


def kernel_class_lines(report: dict) -> list[str]:
    """The "compute by kernel class" section: time, bound, achieved FLOP/s."""
    table, gpu = report["kernel_classes"], report["device"] == "gpu"
    unit = "GPU kernels" if gpu else "top-level CPU operators"
    shares = report["bound_shares"]
    lines = [
        "",
        f"## Compute by kernel class ({unit})",
        "",
        f"Compute-bound (matmul, attention) {shares['compute']:.0%}, memory-bound "
        f"{shares['memory']:.0%}, other {shares['other']:.0%} of the classified time. "
        "FLOPs from the operators' input shapes (profiler.with_flops); "
        + (
            f"peak: {report['peak_flops'] / 1e12:.0f} TFLOP/s dense bf16."
            if report["peak_flops"]
            else "no known peak for this device."
        ),
        "",
        "| class | bound | ms per step | share | calls per step | achieved TFLOP/s | of peak |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in table:
        tflops = "-" if r["tflops"] is None else f"{r['tflops']:.3g}"
        of_peak = "-" if r["peak_share"] is None else f"{r['peak_share']:.0%}"
        lines.append(
            f"| {r['class']} | {r['bound'] or '-'} | {_ms(r['seconds_per_step'])} | "
            f"{r['share']:.0%} | {r['calls_per_step']:.1f} | {tflops} | {of_peak} |"
        )
    return lines


def write(run_dir: Path, report: dict) -> list[Path]:
    out = run_dir / "analysis"
    paths = [out / "report.json", out / "report.md"]
    paths[0].write_text(json.dumps(report, indent=1))
    paths[1].write_text(markdown(report))
    return paths
