"""The hang report of `python -m launcher.analyze`: the verdict (the culprit and the
evidence, launcher.resilience.hang_verdict, which the watchdog records too) as markdown and
JSON in analysis/."""

from __future__ import annotations

import json
from pathlib import Path

from launcher.resilience.hang_verdict import analyze_hang, has_hang, load_flight_recorder

__all__ = ["analyze_hang", "has_hang", "load_flight_recorder", "markdown_hang", "write_hang_report"]


def markdown_hang(result: dict) -> str:
    lines = ["# Hang report", ""]
    if result["culprits"]:
        who = ", ".join(
            f"rank {r} (host {result['ranks'][r]['host']}, pid {result['ranks'][r]['pid']})"
            for r in result["culprits"]
        )
        lines.append(f"**Culprit: {who}** {result['reason']}.")
        for r in result["culprits"]:
            if result["ranks"][r]["where"]:
                lines.append(f"Rank {r} was at {result['ranks'][r]['where']}.")
    else:
        lines.append(f"No single culprit: {result['reason']}.")
    lines.append(f"The ranks that reported had completed step {result['step']}.")
    lines += ["", "| rank | host | step | where (main thread) | last collective per group |"]
    lines.append("| --- | --- | --- | --- | --- |")
    for r in result["ranks"]:
        colls = "; ".join(
            f"group {pg}: {c['op']} #{c['seq']} ({c['from']})"
            for pg, c in sorted(r["last_collectives"].items())
        )
        where = r["where"] or "wrote nothing (could not run)"
        if r["waiting"]:
            where += " (waiting for other ranks)"
        lines.append(f"| {r['rank']} | {r['host']} | {r['step']} | {where} | {colls or '-'} |")
    lines += [f"- skipped {why}" for why in result.get("skipped", [])]
    lines += [
        "",
        "Stacks: logs/stacks.rank<r>.txt. Flight recorder: "
        "`python -m torch.distributed.flight_recorder.fr_trace logs/fr`.",
    ]
    return "\n".join(lines) + "\n"


def write_hang_report(run_dir: Path, result: dict) -> list[Path]:
    out = run_dir / "analysis"
    out.mkdir(exist_ok=True)
    md, js = out / "hang.md", out / "hang.json"
    md.write_text(markdown_hang(result))
    js.write_text(json.dumps(result, indent=1))
    return [md, js]
