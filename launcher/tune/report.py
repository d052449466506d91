"""What a tuning launch leaves in `<run dir>/tune/`: report.json and report.md (one row per
round, then each round's evidence and candidates), tokens_per_s.png (tokens/s per round),
and tuned.yaml, the winner as an experiment file; the same table and plot go to W&B when
the experiment logs there.

tuned.yaml holds the user's overrides and the kept changes (the tuning run's own keys,
`run.*`, `resume` and `tune.*`, left out), as a `_global_` experiment with the user's group
choices as `override` defaults, so that

    torchrun ... -m launcher.train 'hydra.searchpath=[file://RUN_DIR]' +tune=tuned

(or `--config-dir DIR +exp=tuned` after copying it into DIR/exp/) composes the winner.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from launcher.config.compose import config_groups
from launcher.observe import wandb_sink
from launcher.tune.trials import merged

# Keys of the tuning launch that are not the experiment: where it ran, how it tuned, and a
# rehearsed fault (`fault.*`, such as slow storage planted to tune against).
NOT_TUNED = ("run", "resume", "tune", "hydra", "fault")


def tuned_experiment(user_overrides: list[str], kept: dict[str, Any]) -> dict:
    """The experiment file's content: group choices as defaults, values nested."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from launcher.tune.trials import as_overrides

    groups = config_groups()
    defaults: list[Any] = []
    values = OmegaConf.create({})
    parsed = OverridesParser.create().parse_overrides(merged(user_overrides, as_overrides(kept)))
    for o in parsed:
        key = o.key_or_group
        if key.split(".")[0] in NOT_TUNED or o.is_delete():
            continue
        if key in groups:
            defaults.append({f"override /{key}" if not o.is_add() else f"/{key}": o.value()})
        else:
            OmegaConf.update(values, key, o.value(), force_add=True)
    return {"defaults": [*defaults, "_self_"], **OmegaConf.to_container(values)}


def write_tuned_yaml(path: Path, user_overrides: list[str], kept: dict, run_dir: Path) -> None:
    where = run_dir.resolve()
    head = (
        "# @package _global_\n"
        f"# Written by launcher.tune ({where}): the experiment it started from with the\n"
        "# changes it kept. Use it with:\n"
        f"#   torchrun ... -m launcher.train 'hydra.searchpath=[file://{where}]' +tune=tuned\n"
        "# or copy it into DIR/exp/ and use --config-dir DIR +exp=tuned.\n"
    )
    body = yaml.safe_dump(tuned_experiment(user_overrides, kept), sort_keys=False)
    path.write_text(head + body)


def report_dict(tuner, run_dir: Path, user_overrides: list[str]) -> dict:
    return {
        "run_dir": str(run_dir),
        "overrides": list(user_overrides),
        "tune": OmegaConf.to_container(tuner.tune),
        "kept": tuner.kept,
        "ended_because": tuner.ended_because,
        "stopped": tuner.stopped,
        "baseline_tokens_per_s": tuner.baseline_tokens_per_s,
        "rounds": tuner.rounds,
        "confirmation": tuner.confirmation,
    }


def _ms(value, spread=None) -> str:
    if value is None:
        return "-"
    return f"{value * 1e3:.1f}" + (f" ±{spread * 1e3 / 2:.1f}" if spread is not None else "")


def _rate(value, spread=None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" + (f" ±{spread / 2:,.0f}" if spread is not None else "")


def headline(report: dict) -> str:
    c = report["confirmation"]
    kept = ", ".join(f"`{k}={v}`" for k, v in report["kept"].items())
    if c and c["speedup"]:
        base, win = c["baseline"], c["winner"]
        ratio = c["speedup"] if c["speedup"] >= 1 else 1 / c["speedup"]
        more = "the tokens/s" if c["speedup"] >= 1 else "FEWER tokens/s (the gain did not hold)"
        return (
            f"**{ratio:.2f}x {more}** in the confirmation runs of {c['steps']} steps: "
            f"{_rate(base['tokens_per_s'])} -> {_rate(win['tokens_per_s'])} tokens/s, "
            f"step {_ms(base['p50_s'])} ms -> {_ms(win['p50_s'])} ms (p50), with {kept}."
        )
    if report["kept"]:
        return f"Kept {kept}; no confirmation run ({report['ended_because']})."
    return f"No change kept: {report['ended_because']}."


def _outliers(figures: dict) -> str:
    """The repeats left out of the test and the noise, by their repeat number."""
    far = [label.rsplit("-", 1)[-1] for label in figures.get("outliers") or ()]
    return f" (outlier: repeat {', '.join(far)})" if far else ""


def markdown(report: dict) -> str:
    lines = [
        f"# Tuning report: {report['run_dir']}",
        "",
        headline(report),
        "",
        f"Ended: {report['ended_because']}. Tokens/s and step times are medians of the "
        "repeats ± half the spread of the trusted ones (an outlier repeat is named and left "
        "out); a change is kept when its repeats give more tokens/s than the incumbent's in a "
        "rank test, by more than the noise and tune.min_gain.",
        "",
        "| round | evidence | candidates | incumbent tokens/s | incumbent p50 | kept | "
        "tokens/s after | gain so far |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in report["rounds"]:
        inc = r.get("incumbent") or {}
        evidence = ", ".join(a["kind"] for a in r.get("evidence", [])) or "none"
        speedup = r.get("cumulative_speedup")
        lines.append(
            f"| {r['round']} | {evidence} | {len(r.get('candidates', []))} | "
            f"{_rate(inc.get('tokens_per_s'), inc.get('tokens_per_s_spread'))}{_outliers(inc)} | "
            f"{_ms(inc.get('step_time_p50_s'), inc.get('step_time_p50_spread_s'))} | "
            f"{'`' + r['kept'] + '`' if r.get('kept') else '-'} | "
            f"{_rate(r.get('tokens_per_s'))} | {f'{speedup:.2f}x' if speedup else '-'} |"
        )
    for r in report["rounds"]:
        lines += ["", f"## Round {r['round']}", ""]
        changes = ", ".join(f"`{k}={v}`" for k, v in r["incumbent_changes"].items())
        lines.append(f"Incumbent: {changes or 'the experiment as given'}.")
        lines += ["", "Evidence (profiled trial `" + r["profile"] + "`):"]
        for a in r.get("evidence", []):
            lines.append(f"- **{a['finding']}** ({a['kind']}): {a['evidence']}.")
        if not r.get("evidence"):
            lines.append("- " + r.get("evidence_error", "nothing crossed a threshold"))
        if r.get("candidates"):
            lines += [
                "",
                "| candidate | from | tokens/s | p50 | p90 | mean loss | verdict | reason |",
                "| --- | --- | --- | --- | --- | --- | --- | --- |",
            ]
            inc = r.get("incumbent") or {}
            for c in [{"name": "incumbent", "evidence": "", **inc}, *r["candidates"]]:
                loss = c.get("mean_loss")
                lines.append(
                    f"| `{c['name']}` | {c['evidence']} | "
                    f"{_rate(c.get('tokens_per_s'), c.get('tokens_per_s_spread'))}"
                    f"{_outliers(c)} | "
                    f"{_ms(c.get('step_time_p50_s'), c.get('step_time_p50_spread_s'))} | "
                    f"{_ms(c.get('step_time_p90_s'))} | "
                    f"{'-' if loss is None else f'{loss:.5f}'} | {c.get('verdict', '')} | "
                    f"{c.get('reason', '')} |"
                )
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    """Tokens/s (median of the repeats) of the incumbent in each round and of the change it
    kept, and the confirmation runs, each with the spread of its trusted repeats."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, values, spreads = [], [], []
    for r in report["rounds"]:
        inc = r.get("incumbent") or {}
        labels.append(f"round {r['round']}\nincumbent")
        values.append(inc.get("tokens_per_s") or r.get("tokens_per_s") or 0)
        spreads.append((inc.get("tokens_per_s_spread") or 0) / 2)
        if r.get("kept"):
            kept = next(c for c in r["candidates"] if c["name"] == r["kept"])
            labels.append(f"round {r['round']}\n{r['kept']}")
            values.append(kept["tokens_per_s"])
            spreads.append((kept.get("tokens_per_s_spread") or 0) / 2)
    c = report["confirmation"]
    for side in ("baseline", "winner") if c else ():
        labels.append(f"confirm\n{side}")
        values.append(c[side]["tokens_per_s"] or 0)
        spreads.append(0.0)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(labels)), 4.0))
    colors = ["#de2d26" if "confirm" in lb else "#3182bd" for lb in labels]
    ax.bar(range(len(labels)), values, yerr=spreads, capsize=4, color=colors)
    ax.set_xticks(range(len(labels)), labels, fontsize="small", rotation=15, ha="right")
    ax.set_ylabel("tokens/s (median of the repeats)")
    ax.set_title("tokens/s per tuning round")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table_rows(report: dict) -> list[dict]:
    """One flat row per round, for W&B."""
    return [
        {
            "round": r["round"],
            "evidence": ", ".join(a["kind"] for a in r.get("evidence", [])),
            "candidates": ", ".join(c["name"] for c in r.get("candidates", [])),
            "incumbent_tokens_per_s": (r.get("incumbent") or {}).get("tokens_per_s"),
            "incumbent_tokens_per_s_spread": (r.get("incumbent") or {}).get("tokens_per_s_spread"),
            "kept": r.get("kept") or "",
            "tokens_per_s": r.get("tokens_per_s"),
            "cumulative_speedup": r.get("cumulative_speedup"),
        }
        for r in report["rounds"]
    ]


def write_all(tuner, run_dir: Path, user_overrides: list[str], logger_cfg) -> list[Path]:
    """Every file of tune/ (rank 0), and the W&B table and image when W&B is on."""
    out = run_dir / "tune"
    out.mkdir(parents=True, exist_ok=True)
    report = report_dict(tuner, run_dir, user_overrides)
    paths = [out / "report.json", out / "report.md", out / "tokens_per_s.png", out / "tuned.yaml"]
    paths[0].write_text(json.dumps(report, indent=1))
    paths[1].write_text(markdown(report))
    plot(report, paths[2])
    write_tuned_yaml(paths[3], user_overrides, tuner.kept, run_dir)
    wandb_sink.log_sweep_summary(
        logger_cfg,
        run_dir.parent,
        run_dir.name,
        table_rows(report),
        paths[2],
        job_type="tune_report",
        name=f"{run_dir.name} tune",
        plot_key="tune_plot",
    )
    return paths
