"""The rehearsal's verdict table and the stop checkpoint's extrapolation: what
`rehearse/report.{md,json}` hold, and what `launcher.submit` reads back (stop_time).

A row passes only when everything its case expects was observed; the report exits 0 only
when every row passes, so a CI job or a person about to spend GPU hours reads one code.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from launcher.paths import atomic_write
from launcher.submit.stop_time import REHEARSAL_REPORT

COLUMNS = ("fault", "expected", "observed", "verdict", "evidence path")


@dataclass
class Row:
    """One case's outcome; `evidence` is a path relative to the run directory."""

    case: str
    fault: str
    expected: str
    observed: str
    passed: bool
    evidence: str
    wall_s: float = 0.0

    @property
    def verdict(self) -> str:
        return "pass" if self.passed else "FAIL"


@dataclass
class StopCheckpoint:
    """The stop checkpoint as measured at the shrunk size, and what that predicts for the
    real model: the write time scaled by the state's bytes (parameters and AdamW's two
    moments, as launcher.submit estimates them). At a few MB a write is mostly fixed cost
    (files, fsync, rename), so the linear figure errs long: on the side a grace period
    must."""

    measured_s: float
    shrunk_bytes: int
    real_bytes: int
    model: str
    extrapolated_s: float = field(init=False)

    def __post_init__(self) -> None:
        self.extrapolated_s = round(
            extrapolate(self.measured_s, self.shrunk_bytes, self.real_bytes), 3
        )

    @property
    def why(self) -> str:
        """How the figure was obtained, in the words launcher.submit's refusal quotes."""
        return (
            f"rehearsed: the stop checkpoint took {self.measured_s:g} s for "
            f"{self.shrunk_bytes / 1e6:.1f} MB, scaled to {self.real_bytes / 1e9:.2f} GB of "
            f"{self.model} state"
        )


def extrapolate(measured_s: float, shrunk_bytes: int, real_bytes: int) -> float:
    """Seconds to write `real_bytes` at the rate `shrunk_bytes` took `measured_s` (a write
    timed as 0 at millisecond resolution counts as 1 ms)."""
    if shrunk_bytes <= 0:
        raise ValueError("the measured checkpoint holds no bytes")
    return max(measured_s, 0.001) * real_bytes / shrunk_bytes


def markdown_table(rows: list[Row]) -> str:
    """The verdict table, one row per case, in the order the cases ran."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    for r in rows:
        cells = (r.fault, r.expected, r.observed, r.verdict, f"`{r.evidence}`")
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def all_passed(rows: list[Row]) -> bool:
    return bool(rows) and all(r.passed for r in rows)


def report_dict(rows: list[Row], checkpoint: StopCheckpoint | None, facts: dict) -> dict:
    return {
        "passed": all_passed(rows),
        **facts,
        "rows": [{**asdict(r), "verdict": r.verdict} for r in rows],
        "stop_checkpoint": asdict(checkpoint) | {"why": checkpoint.why} if checkpoint else None,
    }


def markdown(report: dict) -> str:
    rows = [Row(**{k: v for k, v in r.items() if k != "verdict"}) for r in report["rows"]]
    verdict = "every row passed" if report["passed"] else "FAILED: see the rows marked FAIL"
    lines = [
        f"# Rehearsal of {report['run_dir']}",
        "",
        f"{len(rows)} case(s) on {report['nproc']} ranks in {report['wall_s']:.0f} s: {verdict}.",
        "",
        markdown_table(rows),
        "",
    ]
    ckpt = report["stop_checkpoint"]
    if ckpt:
        lines += [
            f"Stop checkpoint: {ckpt['measured_s']:g} s for {ckpt['shrunk_bytes'] / 1e6:.1f} MB "
            f"at the shrunk size; {ckpt['model']}'s state is {ckpt['real_bytes'] / 1e9:.2f} GB, "
            f"so about {ckpt['extrapolated_s']:.1f} s (linear in bytes: an upper bound). "
            "`launcher.submit` checks the grace period and signal lead against it.",
            "",
        ]
    lines += ["Kept from the experiment: " + ", ".join(report["kept"]) + ".", ""]
    lines += ["Shrunk: `" + " ".join(report["shrunk"]) + "`.", ""]
    lines += [f"- {note}" for note in report["notes"]]
    return "\n".join(lines).rstrip() + "\n"


def write(run_dir: Path, report: dict) -> list[Path]:
    """rehearse/report.json (what launcher.submit reads) and report.md, written whole."""
    json_path = run_dir / REHEARSAL_REPORT
    md_path = json_path.with_suffix(".md")
    atomic_write(json_path, json.dumps(report, indent=1) + "\n")
    atomic_write(md_path, markdown(report))
    return [md_path, json_path]
