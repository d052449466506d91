"""`python -m launcher.analyze RUN_DIR [RUN_DIR...]`: analyse the per-rank traces of a run
(or of every point of a sweep directory) and write analysis/report.{md,json} and a
merged trace into each run directory. When the run logged to W&B, the report also goes to
its W&B run as tables and an artifact (launcher.analyze.to_wandb); when it wrote TensorBoard
event files, to analysis/tb/ as text and per-rank scalars (launcher.analyze.to_tensorboard)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from launcher.analyze import to_tensorboard, to_wandb
from launcher.analyze.report import analyze, markdown, write


def run_dirs(path: Path) -> list[Path]:
    """The run directory itself, or the points of a sweep directory."""
    if (path / "traces").is_dir():
        return [path]
    return sorted(p for p in path.iterdir() if (p / "traces").is_dir()) if path.is_dir() else []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.analyze", description=__doc__)
    parser.add_argument("paths", nargs="+", type=Path, help="run or sweep directories")
    parser.add_argument(
        "--no-wandb",
        dest="wandb",
        action="store_false",
        help="do not add the report to the run's W&B run (default: add it when the run "
        "logged to W&B)",
    )
    parser.add_argument(
        "--no-tensorboard",
        dest="tensorboard",
        action="store_false",
        help="do not write the report as TensorBoard events into analysis/tb/ (default: "
        "write them when the run wrote TensorBoard event files)",
    )
    args = parser.parse_args(argv)
    for path in args.paths:
        found = run_dirs(path)
        if not found:
            print(
                f"error: {path}: no traces/rank*/ here or in its sweep points; "
                "run with profiler=steps first",
                file=sys.stderr,
            )
            return 2
        for run_dir in found:
            try:
                report = analyze(run_dir)
            except FileNotFoundError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
            print(markdown(report))
            written = write(run_dir, report)
            for path in written:
                print(f"wrote {path}")
            if args.wandb:
                merged = run_dir / report["merged_trace"]
                wandb_id = to_wandb.log_report(run_dir, report, [*written, merged])
                if wandb_id:
                    print(f"logged the report to W&B run {wandb_id}")
            if args.tensorboard:
                logdir = to_tensorboard.log_report(run_dir, report)
                if logdir:
                    print(f"wrote the report as TensorBoard events to {logdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
