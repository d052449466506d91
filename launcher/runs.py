"""List the runs under a folder, and compare two of them.

    python -m launcher.runs [ROOT]                 every run under ROOT (default: runs), newest last
    python -m launcher.runs compare A B [--plot PNG]

A run is a folder holding config.yaml (a sweep's points are one level down). The list reads
each run's summary.json and config.yaml only; `compare` prints the config keys whose values
differ and the end-of-run figures side by side, and draws both loss curves into one PNG.
Bad input (a folder that is not a run): one line, exit 2.
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


class NotARun(ValueError):
    """A path given that is not a run directory, worded as the one line the user sees."""


def is_run(folder: Path) -> bool:
    return (folder / "config.yaml").is_file()


def find_runs(root: Path) -> list[Path]:
    """The run directories under `root` (a sweep's points included), oldest first; the
    `latest` link is not a run of its own."""
    found = []
    for child in root.iterdir() if root.is_dir() else ():
        if child.name == LATEST or child.name.startswith(".") or not child.is_dir():
            continue
        if is_run(child):
            found.append(child)
        else:
            found.extend(p for p in child.iterdir() if p.is_dir() and is_run(p))
    return sorted(found, key=lambda p: (p / "config.yaml").stat().st_mtime)


def read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def settings(run: Path) -> dict:
    """config.yaml as flat `section.key: value` pairs ({} when unreadable)."""
    try:
        node = OmegaConf.to_container(OmegaConf.load(run / "config.yaml"))
    except Exception:  # noqa: BLE001 - an unreadable config lists as blanks, not a crash
        return {}
    return flatten(node) if isinstance(node, dict) else {}


def _num(value, fmt: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return "-"
    return format(value, fmt)


def _wall(seconds) -> str:
    if not isinstance(seconds, (int, float)):
        return "-"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, s = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{s:02d}" if hours else f"{minutes}:{s:02d}"


def row(run: Path, root: Path) -> list[str]:
    """One run's line of the list."""
    summary = read_json(run / "summary.json")
    env = read_json(run / "env.json")
    config = settings(run)
    status = str(summary.get("status") or "no summary (running, or killed)")
    mfu = summary.get("mfu")
    return [
        run.relative_to(root).as_posix(),
        status if len(status) <= 40 else status[:39] + "…",
        _num(summary.get("steps"), "d"),
        _num(summary.get("loss"), ".4f"),
        _num(summary.get("eval/loss"), ".4f"),
        _num(summary.get("tokens_per_s"), ",.0f"),
        f"{mfu * 100:.1f}%" if isinstance(mfu, float) else "-",
        _wall(summary.get("wall_time_s")),
        str(config.get("strategy.name", "-")),
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
        raise NotARun(f"{root}: no such folder; give the run.root the runs were written to")
    runs = find_runs(root)
    if not runs:
        print(f"no runs under {root} (a run is a folder holding config.yaml)")
        return exit_codes.DONE
    print(table(COLUMNS, [row(r, root) for r in runs]))
    return exit_codes.DONE


def resolve(name: str, root: Path) -> Path:
    """A run given as a path, or as an id under `root`."""
    for candidate in (Path(name), root / name):
        if is_run(candidate):
            return candidate
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


def plot_losses(runs: list[Path], names: list[str], out: Path) -> Path:
    """Both runs' training (solid) and eval (dashed) loss against the step, in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for run, name in zip(runs, names, strict=True):
        records = read_jsonl(run / "metrics.jsonl")
        for key, style in (("loss", "-"), ("eval/loss", "--")):
            points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), float)]
            if points:
                ax.plot(*zip(*points, strict=True), style, label=f"{name} {key}")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(" vs ".join(names))
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def compare(a_name: str, b_name: str, root: Path, plot: Path | None) -> int:
    a, b = resolve(a_name, root), resolve(b_name, root)
    names = [a.name, b.name] if a.name != b.name else [str(a), str(b)]
    changes = config_changes(settings(a), settings(b))
    print(f"settings that differ ({len(changes)}):")
    print(table(["key", *names], changes) if changes else "  none")
    print()
    figures = figure_changes(read_json(a / "summary.json"), read_json(b / "summary.json"))
    print(table(["figure", *names, f"{names[1]} vs {names[0]}"], figures))
    out = plot or a.parent / f"compare_{a.name}_vs_{b.name}.png"
    print(f"\nloss curves: {plot_losses([a, b], names, out)}")
    return exit_codes.DONE


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["compare"]:
            parser = argparse.ArgumentParser(prog="python -m launcher.runs compare")
            parser.add_argument("a", help="a run directory, or a run id under --root")
            parser.add_argument("b", help="the run to compare with A")
            parser.add_argument("--root", type=Path, default=Path("runs"))
            parser.add_argument("--plot", type=Path, help="where to draw the loss curves")
            args = parser.parse_args(argv[1:])
            return compare(args.a, args.b, args.root, args.plot)
        parser = argparse.ArgumentParser(
            prog="python -m launcher.runs", description=__doc__.splitlines()[0]
        )
        parser.add_argument("root", nargs="?", type=Path, default=Path("runs"))
        return list_runs(parser.parse_args(argv).root)
    except NotARun as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
