"""The analysis as pictures beside its tables: each rank's step broken down (compute,
exposed communication, data wait, idle) and a timeline of one profiled step per rank, so a
straggler or an unhidden all-reduce shows at a glance without opening the merged trace.
"""

from __future__ import annotations

from pathlib import Path

from launcher.analyze.trace import Step, load, rank_trace_files

US_TO_MS = 1e-3
# (report key, label, colour) of the breakdown's parts, in the order they are stacked
PARTS = (
    ("compute_s", "compute", "#3182bd"),
    ("exposed_comm_s", "communication (exposed)", "#de2d26"),
    ("data_wait_s", "data wait", "#fd8d3c"),
    ("idle_s", "idle", "#bdbdbd"),
)
SPANS = (("compute", "#3182bd"), ("comm", "#de2d26"), ("data_wait", "#fd8d3c"))


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def breakdown_png(report: dict, out: Path) -> Path:
    """Stacked bars, one per rank: the mean profiled step's parts in ms."""
    plt = _pyplot()
    ranks = sorted(report["per_rank"], key=int)
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.45 * len(ranks)))
    left = [0.0] * len(ranks)
    for key, label, colour in PARTS:
        widths = [report["per_rank"][r][key] * 1000 for r in ranks]
        ax.barh([str(r) for r in ranks], widths, left=left, color=colour, label=label)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    steps = [report["per_rank"][r]["step_s"] * 1000 for r in ranks]
    ax.scatter(steps, [str(r) for r in ranks], marker="|", s=300, color="black", label="step")
    ax.invert_yaxis()
    ax.set_xlabel("ms per profiled step (mean)")
    ax.set_ylabel("rank")
    ax.set_title("where each rank's step went")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.savefig(out, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return out


def one_step(run_dir: Path, number: int) -> dict[int, Step]:
    """Each rank's profiled step `number`, from its traces."""
    found = {}
    for rank, files in rank_trace_files(run_dir).items():
        for path in files:
            step = next((s for s in load(path).steps() if s.number == number), None)
            if step is not None:
                found[rank] = step
                break
    return found


def timeline_png(run_dir: Path, number: int, out: Path) -> Path:
    """Step `number` on every rank, from that rank's step start: compute, gradient
    communication and data wait as spans (each rank on its own clock)."""
    plt = _pyplot()
    steps = one_step(run_dir, number)
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.5 * len(steps)))
    for row, rank in enumerate(sorted(steps)):
        step = steps[rank]
        for kind, colour in SPANS:
            bars = [((lo - step.start) * US_TO_MS, (hi - lo) * US_TO_MS)
                    for lo, hi in getattr(step, kind)]  # fmt: skip
            ax.broken_barh(bars, (row - 0.35, 0.7), color=colour, label=kind if row == 0 else None)
        ax.plot([(step.end - step.start) * US_TO_MS] * 2, [row - 0.45, row + 0.45], color="black")
    ax.set_yticks(range(len(steps)), [str(r) for r in sorted(steps)])
    ax.invert_yaxis()
    ax.set_xlabel("ms from the rank's step start (black: step end)")
    ax.set_ylabel("rank")
    ax.set_title(f"step {number} on every rank")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.savefig(out, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return out


def write_images(run_dir: Path, report: dict) -> list[Path]:
    """analysis/breakdown.png and analysis/timeline.png (the middle profiled step)."""
    out = run_dir / "analysis"
    middle = report["steps"][len(report["steps"]) // 2]
    return [
        breakdown_png(report, out / "breakdown.png"),
        timeline_png(run_dir, middle, out / "timeline.png"),
    ]
