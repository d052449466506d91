"""Sweeps: which points a multirun has, what each point is called, and the summary of them.

A sweep inside one launch is Hydra's multirun (`+exp=bucket_sweep`, or `-m key=a,b`): every
rank runs the same points in the same order, reusing one process group. Each point trains
into `runs/<sweep_id>/<label>/`, an ordinary run directory; afterwards rank 0 reads them
back and writes `sweep_summary.{csv,md,png}` next to them.

The summary is built from run directories alone, so runs of separate launches (NCCL
settings, which a process reads only once, need one launch each) are compared the same way:

    python -m launcher.config.sweep runs/nccl/ring runs/nccl/tree --out runs/nccl
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from launcher.config import ConfigError, compose
from launcher.config.compose import config_loader
from launcher.paths import writable_dir_problem

# Summary columns after the point's label and varied keys: (column, summary.json key).
FIGURES = (
    ("step_time_p50_s", "step_time_s/p50"),
    ("step_time_p90_s", "step_time_s/p90"),
    ("tokens_per_s", "tokens_per_s"),
    ("allreduce_s", "comm/allreduce_s"),
    ("exposed_s", "comm/exposed_s"),
    ("overhead_frac", "comm/overhead_frac"),
    ("busbw_gbps", "comm/busbw_gbps"),
    ("buckets", "comm/buckets"),
    ("peak_mem_gb", "mem/peak_gb"),  # GPU memory, max over ranks (null on a CPU)
    ("host_peak_gb", "mem/host_peak_gb"),  # peak resident memory, max over ranks
    ("final_loss", "loss"),
)
IGNORED_KEYS = ("run.id", "run.root", "resume")


@dataclass
class Plan:
    """What a launch will run: every point's overrides, the keys the sweep varies, and
    whether Hydra runs it as a multirun (a sweep, even of one point)."""

    points: list[list[str]]
    swept_keys: list[str]
    multirun: bool = False


def plan(overrides: list[str], multirun: bool, hydra_cfg) -> Plan:
    """The points as Hydra's basic sweeper will run them, in its order.

    `hydra_cfg` is the `hydra` node of the config composed for a sweep (for `hydra.mode`
    and `hydra.sweeper.params`). A single run is one point with the overrides as given.
    """
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if not (multirun or str(hydra_cfg.mode) == "RunMode.MULTIRUN"):
        return Plan([list(overrides)], [])
    params = [f"{k}={v}" for k, v in (hydra_cfg.sweeper.params or {}).items()]
    # A glob over a group's options (`strategy=glob(*,exclude=*_schema)`: every engine
    # installed) is expanded from the options the config loader finds, as Hydra's does.
    with config_loader() as loader:
        parsed = OverridesParser.create(config_loader=loader).parse_overrides([*params, *overrides])
        points = BasicSweeper.split_arguments(parsed, None)[0]
    swept = [o.get_key_element() for o in parsed if o.is_sweep_override()]
    return Plan(points, swept, multirun=True)


def compose_points(overrides: list[str], multirun: bool) -> tuple[Plan, list[DictConfig]]:
    """The launch's plan and every point's config, composed as Hydra will (ConfigError).

    A single run is composed once: the composition that finds out whether the launch is a
    sweep (sweep mode, keeping the `hydra` node) is that run's config too, without the node,
    wherever composing in sweep mode gives what a single run's composition would: no
    override sweeps a value and every config group has an option (sweep mode accepts
    either; a single run refuses them, in the line `compose` gives). Each composition
    costs 0.2-0.5 s of Hydra's, on every rank.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    composed = compose(overrides, sweep=True)
    found = plan(overrides, multirun, composed.hydra)
    if not found.multirun:
        sweeps = any(
            o.is_sweep_override() for o in OverridesParser.create().parse_overrides(overrides)
        )
        choices = composed.hydra.runtime.choices
        if not sweeps and not any(OmegaConf.is_missing(choices, k) for k in choices):
            with open_dict(composed):
                del composed["hydra"]
            return found, [composed]
    return found, [compose(point) for point in found.points]


def check_launch_wide(configs: list) -> None:
    """Raise ConfigError if sweep points differ in what a launch reads only once.

    `nccl.*` and `dist.*` take effect when the process group is created, by the first point.
    """
    for group in ("nccl", "dist"):
        if len({repr(OmegaConf.to_container(c[group])) for c in configs}) > 1:
            raise ConfigError(
                f"{group}.* differs between sweep points, but it takes effect only when "
                "the process group is created, once per launch: run one launch per "
                "setting and compare them with python -m launcher.config.sweep "
                "(see docs/sweeps.md)"
            )


def point_label(job_overrides: list[str], swept_keys: list[str]) -> str:
    """The point's name: the values the sweep chose for it, by leaf key.

    `strategy.bucket_cap_mb=0.25` -> `bucket_cap_mb=0.25`; several are joined with `,`.
    """
    parts = []
    for override in job_overrides:
        key, _, value = override.partition("=")
        if key in swept_keys:
            parts.append(f"{key.lstrip('+~').rsplit('.', 1)[-1]}={value}".replace("/", "_"))
    return ",".join(parts) or "point"


@dataclass
class Point:
    """One run directory of a sweep: its label, flattened config and summary."""

    label: str
    config: dict
    summary: dict


class DamagedRunError(ValueError):
    """A run directory whose summary.json or config.yaml cannot be read (one line)."""


def read_point(run_dir: Path) -> Point:
    """One run directory's figures; DamagedRunError names the file that cannot be read."""
    summary_file, config_file = run_dir / "summary.json", run_dir / "config.yaml"
    if not summary_file.is_file():
        raise FileNotFoundError(f"{run_dir}: no summary.json; is this a finished run directory?")
    try:
        summary = json.loads(summary_file.read_text())
    except (OSError, ValueError) as exc:
        raise DamagedRunError(f"{summary_file}: not readable JSON ({exc})") from exc
    try:
        config = OmegaConf.to_container(OmegaConf.load(config_file))
    except (OSError, ValueError, yaml.YAMLError, OmegaConfBaseException) as exc:
        reason = " ".join(str(exc).split())
        raise DamagedRunError(f"{config_file}: not a readable config ({reason})") from exc
    if not isinstance(summary, dict) or not isinstance(config, dict):
        raise DamagedRunError(
            f"{run_dir}: summary.json or config.yaml does not hold a mapping; "
            "is this a run directory?"
        )
    return Point(run_dir.name, flatten(config), summary)


def flatten(node, prefix: str = "") -> dict:
    """A nested config as `{"trainer.max_steps": 8, ...}` (lists as JSON), so two configs
    compare key by key: a sweep's points, or a resumed run's settings then and now."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): json.dumps(node) if isinstance(node, list) else node}


def varied_keys(points: list[Point]) -> list[str]:
    """Config keys whose values differ between the points that have them: what the sweep
    compared. A key only some points have (one engine's, in a sweep over `strategy`) is
    not a difference by itself; it is blank in the points without it."""
    keys = sorted({k for p in points for k in p.config} - set(IGNORED_KEYS))
    return [k for k in keys if len({repr(p.config[k]) for p in points if k in p.config}) > 1]


def summary_rows(points: list[Point]) -> list[dict]:
    """One row per point, the fastest completed point marked best.

    When `strategy.comm_hook` is compared and `none` is among the points, each row also
    gets its final loss minus `none`'s (what compression cost in accuracy).
    """
    keys = varied_keys(points)
    rows = []
    for p in points:
        row = {"point": p.label, **{k: p.config.get(k) for k in keys}}
        row["status"] = p.summary.get("status")
        row.update({col: p.summary.get(key) for col, key in FIGURES})
        rows.append(row)
    baseline = [
        r["final_loss"] for r in rows if r.get("strategy.comm_hook") == "none" and r["final_loss"]
    ]
    if "strategy.comm_hook" in keys and baseline:
        for r in rows:
            loss = r["final_loss"]
            r["loss_diff_vs_none"] = None if loss is None else loss - baseline[0]
    done = [r for r in rows if r["status"] == "completed" and r["step_time_p50_s"] is not None]
    best = min(done, key=lambda r: r["step_time_p50_s"]) if done else None
    for r in rows:
        r["best"] = r is best
    return rows


def write_summary(out_dir: Path, rows: list[dict], title: str) -> list[Path]:
    """sweep_summary.csv, .md and .png in `out_dir`; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"sweep_summary.{ext}" for ext in ("csv", "md", "png")]
    with open(paths[0], "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    paths[1].write_text(markdown_table(rows, title))
    plot(rows, title, paths[2])
    return paths


def _cell(value, column: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):  # the best marker, or a swept boolean key
        if column != "best":
            return str(value).lower()
        return "**best**" if value else ""
    if isinstance(value, float):
        if not math.isfinite(value):
            return "-"
        return f"{value:.4g}"
    return str(value)


def markdown_table(rows: list[dict], title: str) -> str:
    columns = list(rows[0])
    lines = [
        f"# {title}",
        "",
        "Times are seconds per step (p50/p90 over every rank and step; all-reduce and exposed",
        "are means); the fastest completed point by p50 step time is marked **best**.",
        "",
        "| " + " | ".join(columns) + " |",
        "| " + " | ".join("---" for _ in columns) + " |",
    ]
    lines += ["| " + " | ".join(_cell(r[c], c) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], title: str, path: Path) -> None:
    """Step time p50 per point (p90 as a whisker), its exposed-communication part shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r["point"] for r in rows]
    p50 = [r["step_time_p50_s"] or 0.0 for r in rows]
    p90 = [r["step_time_p90_s"] or 0.0 for r in rows]
    exposed = [r["exposed_s"] or 0.0 for r in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(rows)), 4.0))
    ax.bar(x, p50, color="#9ecae1", label="step time p50")
    ax.bar(x, exposed, color="#de2d26", label="exposed communication")
    ax.errorbar(
        x,
        p50,
        yerr=[[0] * len(rows), [max(h - m, 0) for h, m in zip(p90, p50, strict=True)]],
        fmt="none",
        ecolor="black",
        capsize=4,
        label="p90",
    )
    for i, r in enumerate(rows):
        if r["best"]:
            top = max(p50[i], p90[i])
            ax.annotate("best", (i, top), xytext=(0, 6), textcoords="offset points",
                        ha="center", va="bottom", fontweight="bold")  # fmt: skip
    ax.set_xticks(list(x), labels, rotation=20, ha="right")
    ax.set_ylabel("seconds per step")
    ax.set_title(title)
    ax.margins(y=0.12)  # room for the "best" label above the tallest whisker
    # beside the axes, not over them: inside, the legend covered the first bars
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # the legend beside the axes included
    plt.close(fig)


def summarize(run_dirs: list[Path], out_dir: Path, title: str) -> tuple[list[dict], list[Path]]:
    """Read the points' run directories and write the sweep summary beside them."""
    rows = summary_rows([read_point(d) for d in run_dirs])
    return rows, write_summary(out_dir, rows, title)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m launcher.config.sweep",
        description="Compare finished run directories (e.g. one launch per NCCL setting) "
        "in the sweep summary format: sweep_summary.{csv,md,png}.",
    )
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run directories to compare")
    parser.add_argument("--out", type=Path, required=True, help="where the summary goes")
    parser.add_argument("--title", default="comparison", help="title of the table and plot")
    args = parser.parse_args(argv)
    problem = writable_dir_problem(args.out, f"--out {args.out}", "choose a folder you can write")
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        rows, paths = summarize(args.run_dirs, args.out, args.title)
    except (OSError, DamagedRunError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(markdown_table(rows, args.title))
    for path in paths:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
