"""report.png: the run at a glance, drawn by rank 0 at the end of the run from the run
directory's own files (metrics.jsonl, ranks.jsonl, summary figures), so that an ordinary run
has a picture without W&B or TensorBoard. An end the run goes on from (a scheduler's stop, a
failure torchrun restarts) leaves it to the launch that ends the run (`deferred`).

Panels: training and eval loss; tokens/s; step time p50 and max with the slowest rank;
communication share; data wait; memory; and two rank x interval heatmaps (each rank's mean
step time and exposed communication per log interval): every rank is visible in one
picture however many there are, instead of a series per rank.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

from launcher.resilience import exit_codes

log = logging.getLogger("launcher")

REPORT = "report.png"
RANKS = "ranks.jsonl"


def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSONL file (unreadable lines skipped); none when it is missing."""
    rows = []
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return rows
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
    return rows


def _series(records: list[dict], key: str, scale: float = 1.0) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
    return [s for s, _ in points], [v * scale for _, v in points]


def _grid(rows: list[dict], key: str):
    """(steps, ranks x intervals array in ms) of one per-rank figure; None without data."""
    import numpy as np

    rows = [r for r in rows if isinstance(r.get(key), list) and r[key]]
    if not rows:
        return None
    width = max(len(r[key]) for r in rows)
    grid = np.full((width, len(rows)), np.nan)
    for col, row in enumerate(rows):
        for rank, value in enumerate(row[key]):
            if isinstance(value, (int, float)) and math.isfinite(value):
                grid[rank, col] = value * 1000
    if np.isnan(grid).all():
        return None
    return [r["step"] for r in rows], grid


def _heatmap(fig, ax, rows: list[dict], key: str, title: str) -> None:
    found = _grid(rows, key)
    ax.set_title(title, fontsize="medium")
    if found is None:
        ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    steps, grid = found
    image = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis")
    ax.set_xlabel("log interval ending at step")
    ax.set_ylabel("rank")
    ticks = sorted({0, len(steps) // 2, len(steps) - 1})
    ax.set_xticks(ticks, [str(steps[i]) for i in ticks])
    ranks = grid.shape[0]
    ax.set_yticks(sorted({0, ranks // 2, ranks - 1}))
    fig.colorbar(image, ax=ax, label="ms per step")


def _line(ax, records, keys_labels, title, ylabel, scale=1.0) -> None:
    ax.set_title(title, fontsize="medium")
    drawn = False
    for key, label in keys_labels:
        xs, ys = _series(records, key, scale)
        if xs:
            ax.plot(xs, ys, marker="." if len(xs) < 30 else None, label=label)
            drawn = True
    if not drawn:
        ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    if len(keys_labels) > 1:
        ax.legend(fontsize="small")


def _step_time(ax, records) -> None:
    _line(ax, records, [("step_time_s/p50", "p50"), ("step_time_s/max", "max")],
          "step time (max: the slowest rank's)", "ms", scale=1000)  # fmt: skip
    slow = [(r["step"], r["step_time_s/max"] * 1000, r.get("step_time_s/slowest_rank"))
            for r in records if isinstance(r.get("step_time_s/max"), (int, float))]  # fmt: skip
    if slow:
        ax.margins(y=0.15)
        step, worst, rank = max(slow, key=lambda s: s[1])
        if rank is not None:
            ax.annotate(f"rank {rank}", (step, worst), xytext=(0, 6),
                        textcoords="offset points", ha="center", fontsize="small")  # fmt: skip


def _figures(ax, records: list[dict]) -> None:
    """The last interval's figures as text, for the numbers behind the curves."""
    ax.set_axis_off()
    last = next((r for r in reversed(records) if "loss" in r), {})
    evals = [r["eval/loss"] for r in records if isinstance(r.get("eval/loss"), (int, float))]
    rows = [
        ("step", last.get("step")),
        ("loss", last.get("loss")),
        ("eval loss", evals[-1] if evals else None),
        ("tokens/s", last.get("tokens_per_s")),
        ("mfu", last.get("mfu")),
        ("step time p50 (s)", last.get("step_time_s/p50")),
        ("slowest rank", last.get("step_time_s/slowest_rank")),
        ("comm share", last.get("comm/overhead_frac")),
    ]
    shown = [(n, f"{v:.4g}" if isinstance(v, float) else v) for n, v in rows]
    shown = [(n, "none" if v is None else v) for n, v in shown]
    text = "\n".join(f"{name:<20}{value}" for name, value in shown)
    ax.text(0, 1, "last interval\n\n" + text, va="top", family="monospace")


def draw(run_dir: Path, title: str, out: Path) -> Path:
    """Draw `run_dir`'s report into `out` (PNG) from its files; returns `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_jsonl(run_dir / "metrics.jsonl")
    ranks = read_jsonl(run_dir / RANKS)
    fig, axes = plt.subplots(3, 3, figsize=(15, 11))
    (loss, tps, step), (comm, data, mem), (heat_step, heat_comm, _) = axes
    _line(loss, records, [("loss", "train"), ("eval/loss", "eval")], "loss", "loss")
    _line(tps, records, [("tokens_per_s", "tokens/s")], "throughput (whole job)", "tokens/s")
    _step_time(step, records)
    _line(comm, records, [("comm/overhead_frac", "exposed / step")],
          "communication share (exposed)", "% of step time", scale=100)  # fmt: skip
    _line(data, records, [("data_wait_s", "mean")], "data wait", "ms per step", scale=1000)
    _line(mem, records, [("mem/peak_gb", "device peak"), ("mem/host_peak_gb", "host peak RSS")],
          "memory", "GB")  # fmt: skip
    _heatmap(fig, heat_step, ranks, "step_time_s", "step time per rank")
    _heatmap(fig, heat_comm, ranks, "comm/exposed_s", "exposed communication per rank")
    _figures(axes[2][2], records)
    fig.suptitle(title)
    # fixed margins: tight_layout measured every label again, a third of the drawing's time
    fig.subplots_adjust(left=0.06, right=0.97, bottom=0.06, top=0.93, wspace=0.35, hspace=0.4)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out


def caption(summary: dict) -> str:
    """The run's one-line identity under the report's title."""
    parts = [str(summary.get("run_id", "")), str(summary.get("status", ""))]
    if summary.get("steps") is not None:
        parts.append(f"{summary['steps']} steps")
    if summary.get("world_size"):
        parts.append(f"{summary['world_size']} ranks")
    return " | ".join(p for p in parts if p)


def deferred(code: int, stopped_by: str | None, environ=os.environ) -> str | None:
    """Why this end of the job draws no report.png, where the run goes on after it (None:
    draw it). Drawing is a second or more of rank 0's CPU (matplotlib's import and the
    figure), and every rank of a restart waits for rank 0 to end: a stop a scheduler asked
    for (a preemption, whose grace time goes to the checkpoint and the exit) and a failure
    that torchrun restarts in place end without it; the run's last launch draws it. A stop
    from the terminal (SIGINT, Ctrl-C) is a person who may look at it: drawn."""
    if code in (exit_codes.STOPPED, exit_codes.STOPPED_NO_CHECKPOINT) and stopped_by != "SIGINT":
        by = stopped_by or "a stop request"
        return f"at the run's end (stopped by {by}: the launch that resumes it draws it)"
    attempt = int(environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    left = int(environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0) - attempt
    if code != 0 and left > 0:
        return f"at the run's end (torchrun restarts the job: {left} restart(s) left)"
    return None


def write_report(run_dir: Path, summary: dict) -> dict[str, Path]:
    """report.png in the run directory, by name for the sinks to log ({} when it could not
    be drawn: one warning, the run's ending goes on)."""
    try:
        return {"report": draw(run_dir, caption(summary), run_dir / REPORT)}
    except Exception as exc:  # noqa: BLE001 - a picture must never fail a finished run
        log.warning("could not draw %s: %s", run_dir / REPORT, exc)
        return {}
