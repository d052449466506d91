"""The analysis into the run's W&B run, when the run logged to W&B: the per-(rank, step)
breakdown and the advice as tables, and report.{md,json} plus the merged trace as one
artifact (`trace-analysis-<run>`), so the trace that explains a slow run sits next to its
curves. The run is resumed by its id (launcher.observe.wandb_sink.wandb_run_id), so this works
after training ended, offline runs included (`wandb sync` uploads both parts together)."""

from __future__ import annotations

import json
from pathlib import Path

from launcher.analyze.facts import logger_config
from launcher.analyze.report import COLUMNS
from launcher.observe.wandb_sink import add_to_run, wandb_run_id


def run_id_of(run_dir: Path) -> str:
    """The run id the trainer used (summary.json records it; a sweep point's holds a /)."""
    try:
        return json.loads((run_dir / "summary.json").read_text())["run_id"]
    except (OSError, ValueError, KeyError, TypeError):  # a summary.json of another shape
        return run_dir.name


def log_report(run_dir: Path, report: dict, files: list[Path]) -> str | None:
    """Send the report to the run's W&B run; None when that run did not use W&B."""
    logger = logger_config(run_dir)
    if logger is None:
        return None
    run_id = run_id_of(run_dir)
    keys = [key for key, _ in COLUMNS]
    breakdown = (
        ["rank", "step", *keys, "overlap_ratio"],
        [
            [r["rank"], r["step"], *(r[k] for k in keys), r["overlap_ratio"]]
            for r in report["per_step"]
        ],
    )
    advice = (
        ["finding", "knobs", "evidence"],
        [[a["finding"], a["knobs"], a["evidence"]] for a in report["advice"]],
    )
    tables = {"analysis/breakdown": breakdown, "analysis/advice": advice}
    name = f"trace-analysis-{wandb_run_id(run_id)}"
    return add_to_run(logger, run_dir, run_id, tables, (name, "trace-analysis", files))
