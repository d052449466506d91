"""`python -m launcher.analyze RUN_DIR [RUN_DIR...]`: analyse the per-rank traces of a run
(or of every point of a sweep directory) and write analysis/report.{md,json} and a
merged trace into each run directory, with two pictures beside them: each rank's step
broken down (analysis/breakdown.png) and one step per rank on a timeline
(analysis/timeline.png). A run that ended in a detected hang is explained first: which rank
stopped, where, and what the others waited on (analysis/hang.md). When the run logged to
W&B, the report also goes to its W&B run as tables and an artifact
(launcher.analyze.to_wandb); when it wrote TensorBoard event files, to analysis/tb/ as text
and per-rank scalars (launcher.analyze.to_tensorboard).

A damaged trace or an analysis/ folder that cannot be written is one line and exit code 2."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from launcher.analyze import to_tensorboard, to_wandb
from launcher.analyze.hang import analyze_hang, has_hang, markdown_hang, write_hang_report
from launcher.analyze.images import write_images
from launcher.analyze.report import analyze, markdown, write
from launcher.analyze.trace import TraceError
from launcher.flags import FlagParser
from launcher.paths import writable_dir_problem
from launcher.runtime.lock import LockHeld, tool_lock


def run_dirs(path: Path) -> list[Path]:
    """The run directory itself, or the points of a sweep directory."""
    if (path / "traces").is_dir():
        return [path]
    return sorted(p for p in path.iterdir() if (p / "traces").is_dir()) if path.is_dir() else []


def unwritable_analysis(run_dir: Path) -> bool:
    """Says so in one line when analysis/ cannot be written."""
    out = run_dir / "analysis"
    problem = writable_dir_problem(out, str(out), "make the run directory writable")
    if problem:
        print(f"error: {problem}", file=sys.stderr)
    return problem is not None


def say_skipped(skipped: list[str]) -> None:
    """One warning line for each file the analysis could not use."""
    for why in skipped:
        print(f"warning: skipped {why}", file=sys.stderr)


def explain_hang(run_dir: Path) -> int:
    """Print and write the hang report; 2 when its files are damaged or cannot be written."""
    try:
        result = analyze_hang(run_dir)
        written = write_hang_report(run_dir, result)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        print(f"error: {run_dir / 'logs'}: a damaged hang report ({exc})", file=sys.stderr)
        return 2
    say_skipped(result["skipped"])
    print(markdown_hang(result))
    for path in written:
        print(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = FlagParser(
        prog="python -m launcher.analyze",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
        if has_hang(path):  # the watchdog's evidence: name the culprit first
            code = holding_lock(path, explain_hang)
            if code:
                return code
            if not (path / "traces").is_dir():
                continue
        found = run_dirs(path)
        if not path.is_dir():
            print(f"error: {path}: no such folder; give a run directory (runs/<id>)",
                  file=sys.stderr)  # fmt: skip
            return 2
        if not found:
            print(
                f"error: {path}: no traces/rank*/ here or in its sweep points; "
                "run with profiler=steps first",
                file=sys.stderr,
            )
            return 2
        for run_dir in found:
            code = holding_lock(run_dir, lambda d: analyze_run(d, args))
            if code:
                return code
    return 0


def holding_lock(run_dir: Path, work) -> int:
    """`work(run_dir)` holding the run directory's `.analyze.lock`: a second analysis of it
    at the same time stops in one line rather than overwrite this one's files."""
    if unwritable_analysis(run_dir):
        return 2
    try:
        with tool_lock(run_dir, "analyze", "wait for it to end"):
            return work(run_dir)
    except LockHeld as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def analyze_run(run_dir: Path, args: argparse.Namespace) -> int:
    """The trace analysis of one run directory, written into its analysis/."""
    try:
        report = analyze(run_dir)
        written = write(run_dir, report)
        written += write_images(run_dir, report)
    except (OSError, TraceError) as exc:  # FileNotFoundError: no profiled steps
        print(f"error: {exc}", file=sys.stderr)
        return 2
    say_skipped(report["skipped"])
    print(markdown(report))
    for file in written:
        print(f"wrote {file}")
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
