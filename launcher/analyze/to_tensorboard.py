"""The analysis in TensorBoard, when the run wrote TensorBoard event files: report.md as the
text `analysis/report`, and every rank's per-step breakdown (report.json's numbers, in
seconds; the overlap ratio) as the scalars `analysis/<figure>`, one TensorBoard run per rank
(`analysis/tb/rank<r>/`), so each figure's chart overlays the ranks. It goes to the
analyser's own folder, `analysis/tb/`, which `tensorboard --logdir runs/<id>` shows beside
the training curves of `tb/`; analysing again replaces it."""

from __future__ import annotations

from pathlib import Path

from launcher.analyze.facts import logger_config
from launcher.analyze.report import COLUMNS, markdown
from launcher.observe.tensorboard_sink import TB_DIR, add_analysis, tensorboard_enabled

FIGURES = (*(key for key, _ in COLUMNS), "overlap_ratio")


def log_report(run_dir: Path, report: dict) -> Path | None:
    """Write the report into `<run_dir>/analysis/tb/`; None when the run had TensorBoard off."""
    logger = logger_config(run_dir)
    if logger is None or not tensorboard_enabled(logger):
        return None
    per_rank: dict[str, dict[int, dict[str, float]]] = {}
    for row in report["per_step"]:
        by_step = per_rank.setdefault(f"rank{row['rank']}", {})
        by_step[row["step"]] = {f"analysis/{key}": row[key] for key in FIGURES}
    texts = {"analysis/report": markdown(report)}
    step = max(report["steps"], default=0)
    return add_analysis(run_dir / "analysis" / TB_DIR, texts, per_rank, step)
