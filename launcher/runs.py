"""List the runs under a folder, and compare two of them.

    python -m launcher.runs [ROOT]                 every run under ROOT (default: runs), newest last
    python -m launcher.runs compare A B [--root ROOT] [--plot PNG|FOLDER]

A run is a folder holding config.yaml (a sweep's points are one level down). The list reads
each run's summary.json, env.json and config.yaml only, and shows a damaged file in the run's
row rather than stopping; its wall column is summary.json's `wall_time_s` (from the launch
to the last write), shown as the closing block shows it. `compare` prints every setting
that differs (config.yaml, and the launch's world size, backend, devices and versions from
env.json), the end-of-run figures side by side, and draws both loss curves into one PNG
next to the runs it compares (or where --plot says). Bad input (a folder that is not a run,
a damaged file `compare` needs, a picture it cannot write, a bad flag): one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from omegaconf import OmegaConf

from launcher.config.sweep import flatten
from launcher.observe.report import read_jsonl
from launcher.observe.sinks import wall_text
from launcher.paths import can_create_in
from launcher.resilience import exit_codes
from launcher.runtime.latest import LATEST

COLUMNS = ("id", "status", "steps", "loss", "eval loss", "tokens/s", "mfu", "wall", "engine",
           "world", "exit")  # fmt: skip

# The end-of-run figures `compare` puts side by side, as summary.json names them.
COMPARED = ("world_size", "steps", "loss", "eval/loss", "tokens_per_s", "mfu", "step_time_s/p50",
            "step_time_s/p90", "data_wait_s", "comm/exposed_s", "comm/overhead_frac",
            "mem/peak_gb", "mem/host_peak_gb", "wall_time_s")  # fmt: skip
# Keys that differ between any two runs and say nothing about them.
NOT_SETTINGS = ("run.id", "run.root")
# What env.json says about how the run was launched, compared as settings (`env.<key>`).
LAUNCH_KEYS = ("world_size", "backend", "hostname", "cpu_count", "devices", "versions")
NO_SUMMARY = "no summary (running, or killed)"
STATUS_WIDTH = 40


class NotARun(ValueError):
    """A path given that is not a run directory, worded as the one line the user sees."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is the one line the other front doors give (exit 2)."""

    def error(self, message: str):
        raise NotARun(f"{message}; see `{self.prog} --help`")


def is_run(folder: Path) -> bool:
    return (folder / "config.yaml").is_file()


def find_runs(root: Path) -> list[Path]:
    """The run directories under `root` (a sweep's points included), oldest first; the
    `latest` link is not a run of its own, and a folder that cannot be listed is left out."""
    found = []
    for child in root.iterdir() if root.is_dir() else ():
        if child.name == LATEST or child.name.startswith(".") or not child.is_dir():
            continue
        if is_run(child):
            found.append(child)
            continue
        try:
            found.extend(p for p in child.iterdir() if p.is_dir() and is_run(p))
        except OSError:
            continue
    return sorted(found, key=_started)


def _started(run: Path) -> float:
    try:
        return (run / "config.yaml").stat().st_mtime
    except OSError:
        return 0.0


def read_json(path: Path) -> tuple[dict, str | None]:
    """A JSON object file: (its content, None); ({}, None) when it does not exist; ({}, why)
    when it exists and cannot be read as a JSON object."""
    if not path.exists() and not path.is_symlink():
        return {}, None
    try:
        value = json.loads(path.read_text())
    except IsADirectoryError:
        return {}, f"{path.name} is a folder"
    except OSError as exc:
        return {}, f"{path.name} unreadable ({exc.strerror or type(exc).__name__})"
    except ValueError:  # not text, or not JSON
        return {}, f"{path.name} is not JSON"
    if not isinstance(value, dict):
        return {}, f"{path.name} is not a JSON object"
    return value, None


def settings(run: Path) -> tuple[dict, str | None]:
    """config.yaml as flat `section.key: value` pairs, or ({}, why it cannot be read)."""
    try:
        node = OmegaConf.to_container(OmegaConf.load(run / "config.yaml"))
    except Exception as exc:  # noqa: BLE001 - yaml, OmegaConf and OS errors alike: one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return {}, f"config.yaml unreadable ({first[:80]})"
    if not isinstance(node, dict):
        return {}, "config.yaml is not a mapping of settings"
    return flatten(node), None


def launch_settings(env: dict, summary: dict) -> dict:
    """How the run was launched, from env.json (the world size also from summary.json), as
    flat `env.<key>` settings; a device list as its names."""
    picked = {k: env[k] for k in LAUNCH_KEYS if k in env}
    if "devices" in picked and isinstance(picked["devices"], list):
        names = [d.get("name", "?") if isinstance(d, dict) else str(d) for d in picked["devices"]]
        picked["devices"] = ", ".join(names) or "none (CPU)"
    if "world_size" not in picked and "world_size" in summary:
        picked["world_size"] = summary["world_size"]
    return flatten({"env": picked})


def _num(value, fmt: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return "-"
    return format(value, fmt)


def _status(summary: dict, problem: str | None) -> str:
    if problem:
        status = problem
    elif not summary:
        status = NO_SUMMARY
    else:
        status = str(summary.get("status") or "summary.json holds no status")
    return status if len(status) <= STATUS_WIDTH else status[: STATUS_WIDTH - 1] + "…"


def row(run: Path, root: Path) -> list[str]:
    """One run's line of the list (a damaged file shows in its place, never stops it)."""
    summary, summary_problem = read_json(run / "summary.json")
    env, _ = read_json(run / "env.json")
    config, config_problem = settings(run)
    mfu = summary.get("mfu")
    engine = "?" if config_problem else str(config.get("strategy.name", "-"))
    return [
        run.relative_to(root).as_posix(),
        _status(summary, summary_problem),
        _num(summary.get("steps"), "d"),
        _num(summary.get("loss"), ".4f"),
        _num(summary.get("eval/loss"), ".4f"),
        _num(summary.get("tokens_per_s"), ",.0f"),
        f"{mfu * 100:.1f}%" if isinstance(mfu, float) and math.isfinite(mfu) else "-",
        wall_text(summary.get("wall_time_s"), missing="-"),
        engine,
        _num(summary.get("world_size") or env.get("world_size"), "d"),
        _num(summary.get("exit_code"), "d"),
    ]


def table(header: tuple[str, ...] | list[str], rows: list[list[str]]) -> str:
    """Columns padded to their widest cell, two spaces apart."""
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=True)]
    lines = [header, *rows]
    return "\n".join(
        "  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def list_runs(root: Path) -> int:
    if not root.is_dir():
        what = "not a folder" if root.exists() else "no such folder"
        raise NotARun(f"{root}: {what}; give the run.root the runs were written to")
    try:
        runs = find_runs(root)
    except OSError as exc:
        raise NotARun(f"{root}: cannot be listed ({exc.strerror}); give a readable folder") from exc
    if not runs:
        print(f"no runs under {root} (a run is a folder holding config.yaml)")
        return exit_codes.DONE
    print(table(COLUMNS, [row(r, root) for r in runs]))
    return exit_codes.DONE


def resolve(name: str, root: Path) -> Path:
    """A run given as a path, or as an id under `root`; a link (`runs/latest`) as the run
    it names."""
    for candidate in (Path(name), root / name):
        if is_run(candidate):
            return candidate.resolve() if candidate.is_symlink() else candidate
    raise NotARun(
        f"{name}: not a run directory (no config.yaml there nor under {root}); "
        f"`python -m launcher.runs {root}` lists the runs"
    )


def config_changes(a: dict, b: dict) -> list[list[str]]:
    """[key, A's value, B's value] for each setting that differs ('(unset)' where one lacks
    it)."""
    unset = "(unset)"
    keys = sorted((set(a) | set(b)) - set(NOT_SETTINGS))
    return [
        [k, str(a.get(k, unset)), str(b.get(k, unset))]
        for k in keys
        if a.get(k, unset) != b.get(k, unset)
    ]


def figure_changes(a: dict, b: dict) -> list[list[str]]:
    """[figure, A, B, B vs A] for each end-of-run figure either run has."""
    rows = []
    for key in COMPARED:
        x, y = a.get(key), b.get(key)
        if x is None and y is None:
            continue
        both = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (x, y))
        change = f"{(y - x) / abs(x) * 100:+.1f}%" if both and x else "-"
        rows.append([key, _num(x, ".4g"), _num(y, ".4g"), change])
    return rows


# Each run its own colour, line style and marker shape (the second's hollow and larger), so
# that two runs with the same curve, or one run's curve under the other's, both show.
STYLES = (
    {"color": "#1f77b4", "linestyle": "-", "marker": "o", "markersize": 4},
    {"color": "#d62728", "linestyle": "--", "marker": "s", "markersize": 7,
     "markerfacecolor": "none", "markeredgewidth": 1.3},
)  # fmt: skip


def plot_losses(runs: list[Path], names: list[str], out: Path) -> Path:
    """Both runs' training loss (lines with markers) and eval loss (markers alone) against
    the step, in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for run, name, style in zip(runs, names, STYLES, strict=True):
        records = read_jsonl(run / "metrics.jsonl")
        for key in ("loss", "eval/loss"):
            points = [(r["step"], r[key]) for r in records if _finite(r.get(key))]
            if not points:
                continue
            shown = dict(style) if key == "loss" else {**style, "linestyle": "none"}
            if key == "eval/loss":
                shown["marker"] = "D" if style is STYLES[0] else "^"
            ax.plot(*zip(*points, strict=True), label=f"{name} {key}", **shown)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(" vs ".join(names))
    if ax.lines:
        ax.legend(fontsize="small")
    fig.tight_layout()
    try:
        fig.savefig(out, dpi=90)
    finally:
        plt.close(fig)
    return out


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def picture_path(plot: Path | None, a: Path, b: Path) -> Path:
    """Where the comparison's picture goes: --plot (a folder: the default name in it), else
    next to the runs it compares (A's folder's parent), named after both."""
    name = f"compare_{a.name}_vs_{b.name}.png"
    if plot is None:
        return a.parent / name
    out = plot / name if plot.is_dir() else plot
    if out.suffix.lower() != ".png":
        raise NotARun(f"--plot {plot}: give a .png file name or a folder to write it into")
    if out.is_dir() or (out.exists() and not out.is_file()):
        raise NotARun(f"--plot {out}: exists and is not a file; give another path")
    if not can_create_in(out.parent):
        raise NotARun(f"--plot {plot}: cannot write in {out.parent}; give a folder you can write")
    return out


def readable_run(run: Path) -> tuple[dict, dict, dict]:
    """A run's settings (config.yaml and env.json's launch keys) and its summary, or one
    line naming the damaged file. A run with no summary yet (running, or killed) compares
    on its settings and curve."""
    config, problem = settings(run)
    summary, summary_problem = read_json(run / "summary.json")
    env, env_problem = read_json(run / "env.json")
    problem = problem or summary_problem or env_problem
    if problem:
        raise NotARun(f"{run}: {problem}; compare needs it whole (rerun, or compare another run)")
    return config, launch_settings(env, summary), summary


def compare(a_name: str, b_name: str, root: Path, plot: Path | None) -> int:
    a, b = resolve(a_name, root), resolve(b_name, root)
    (a_config, a_env, a_summary), (b_config, b_env, b_summary) = readable_run(a), readable_run(b)
    out = picture_path(plot, a, b)
    names = [a.name, b.name] if a.name != b.name else [str(a), str(b)]
    changes = config_changes({**a_config, **a_env}, {**b_config, **b_env})
    print(f"settings that differ ({len(changes)}):")
    print(table(["key", *names], changes) if changes else "  none")
    print()
    figures = figure_changes(a_summary, b_summary)
    print(table(["figure", *names, f"{names[1]} vs {names[0]}"], figures) if figures else
          "figures: neither run has a summary yet")  # fmt: skip
    try:
        plot_losses([a, b], names, out)
    except OSError as exc:
        raise NotARun(f"--plot {out}: cannot be written ({exc.strerror or exc})") from exc
    print(f"\nloss curves: {out}")
    return exit_codes.DONE


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["compare"]:
            parser = OneLineParser(prog="python -m launcher.runs compare")
            parser.add_argument("a", help="a run directory, or a run id under --root")
            parser.add_argument("b", help="the run to compare with A")
            parser.add_argument("--root", type=Path, default=Path("runs"))
            parser.add_argument("--plot", type=Path,
                                help="the PNG to draw the loss curves into, or a folder for it "
                                "(default: beside the runs)")  # fmt: skip
            args = parser.parse_args(argv[1:])
            return compare(args.a, args.b, args.root, args.plot)
        parser = OneLineParser(prog="python -m launcher.runs", description=__doc__.splitlines()[0])
        parser.add_argument("root", nargs="?", type=Path, default=Path("runs"))
        return list_runs(parser.parse_args(argv).root)
    except NotARun as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
