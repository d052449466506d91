"""Where rank 0 sends each interval's metrics: metrics.jsonl (always) and the console.

Every sink receives the same dict with the same `/`-grouped names, so the file, the
console and W&B (`launcher.observe.wandb_sink`, with `logger=wandb`) can never disagree about a
figure.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from launcher.observe.report import deferred
from launcher.paths import atomic_write
from launcher.resilience.preemption import stop_for_full_disk, stopped_by
from launcher.runtime import disk
from launcher.runtime.run_history import record_step

log = logging.getLogger("launcher")


def finite_or_none(value):
    """JSON has no NaN/inf: such figures are written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class Sink:
    def log(self, record: dict) -> None: ...

    def log_ranks(self, step: int, per_rank: dict[str, list[float]]) -> None:
        """Each rank's figures of the interval ending at `step` (one value per rank per
        name): kept out of `log`, so that no sink draws a series per rank."""

    def log_images(self, images: dict[str, Path]) -> None:
        """The run's pictures at its end (launcher.observe.report), by name."""

    def close(self, summary: dict) -> None: ...


class JsonlSink(Sink):
    """One JSON object per line, flushed at once so a crash loses nothing already logged."""

    def __init__(self, path: Path, resume_step: int | None):
        self.path = path
        if resume_step is not None:
            self._truncate_after(resume_step)
        self.file = open(path, "a")  # noqa: SIM115 - held open for the whole run

    def _truncate_after(self, step: int) -> None:
        """Drop records of steps that a restart is about to redo, so each step appears once.

        Lines that are not a record (a line half-written when the run was killed, bytes a
        person or a disk left) are dropped too, with one warning that counts them.
        """
        if not self.path.is_file():
            return
        kept, bad = [], []
        text = self.path.read_bytes().decode("utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            step_of_line = record_step(line)
            if step_of_line is None:
                bad.append(number)
            elif step_of_line <= step:
                kept.append(line)
        if bad:
            log.warning(
                "%s: dropped %d unreadable line(s) (line %s%s: not a JSON record with a step)",
                self.path,
                len(bad),
                bad[0],
                ", ..." if len(bad) > 1 else "",
            )
        atomic_write(self.path, "".join(ln + "\n" for ln in kept))

    def log(self, record: dict) -> None:
        if self.file is None:
            return  # the disk filled up: the run is stopping
        try:
            self.file.write(json.dumps({k: finite_or_none(v) for k, v in record.items()}) + "\n")
            self.file.flush()
        except OSError as exc:
            if not disk.is_full(exc, self.path):
                raise
            self._disk_full()

    def _disk_full(self) -> None:
        """Stop writing, and ask every rank to stop at the next step boundary with a
        checkpoint (the vote a stop signal starts): training on would lose its records."""
        with contextlib.suppress(OSError):  # its buffer cannot be flushed either
            self.file.close()
        self.file = None
        stop_for_full_disk(disk.no_space_line("metrics.jsonl", self.path, None))

    def close(self, summary: dict) -> None:
        if self.file is not None:
            with contextlib.suppress(OSError):
                self.file.close()


class RankFileSink(JsonlSink):
    """ranks.jsonl: each log interval's per-rank figures (one value per rank per name), the
    rank x interval heatmaps of report.png; cut back on resume as metrics.jsonl is."""

    def log(self, record: dict) -> None:
        return None

    def log_ranks(self, step: int, per_rank: dict[str, list[float]]) -> None:
        row = {name: [finite_or_none(v) for v in values] for name, values in per_rank.items()}
        super().log({"step": step, **row})


def write_summary(run_dir: Path, summary: dict) -> None:
    """summary.json, written whole under another name first so a reader never sees half."""
    text = json.dumps({k: finite_or_none(v) for k, v in summary.items()}, indent=1)
    atomic_write(run_dir / "summary.json", text)


def _fmt_eta(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def progress_line(record: dict, max_steps: int, world_size: int = 2) -> str:
    """The plain progress line: step, loss, tokens/s, step time (with the slowest rank when
    there are several), ETA (and eval when present)."""
    parts = [f"step {record['step']}/{max_steps}"]
    if "loss" in record:
        parts.append(f"loss {record['loss']:.4f}")
        parts.append(f"tok/s {record['tokens_per_s']:,.0f}")
        slowest = f", slowest rank {record['step_time_s/slowest_rank']}" if world_size > 1 else ""
        parts.append(
            f"step {record['step_time_s/p50'] * 1000:.1f} ms "
            f"(p90 {record['step_time_s/p90'] * 1000:.1f}{slowest})"
        )
        if record.get("comm/allreduce_s") is not None:
            parts.append(
                f"comm {record['comm/allreduce_s'] * 1000:.1f} ms, exposed "
                f"{record['comm/exposed_s'] * 1000:.1f} ms "
                f"({record['comm/overhead_frac'] * 100:.1f}%)"
            )
        if record.get("mfu") is not None:
            parts.append(f"mfu {record['mfu'] * 100:.1f}%")
        parts.append(f"eta {_fmt_eta(record['eta_s'])}")
    if "eval/loss" in record:
        parts.append(f"eval loss {record['eval/loss']:.4f} ppl {record['eval/ppl']:.1f}")
    return " | ".join(parts)


class ConsoleSink(Sink):
    """A progress bar on a terminal; plain lines when output goes to a file or a pipe."""

    def __init__(
        self,
        max_steps: int,
        start_step: int,
        stream=None,
        run_dir: Path | None = None,
        what_next: Callable[[dict], list[str]] | None = None,
        world_size: int = 2,
        brief: bool = False,
        quiet: bool = False,
        report: bool = True,
    ):
        self.run_dir = run_dir  # for the closing block
        self.report = report  # run.report: whether report.png is drawn
        self.picture: Path | None = None  # the report drawn (log_images)
        self.what_next = what_next  # summary -> the closing block's commands
        self.brief = brief  # a sweep point or tuning trial: its closing block's first line
        self.quiet = quiet  # progress lines into the rank's log only, no bar
        self.world_size = world_size  # one process has no slowest rank to name
        self.max_steps = max_steps
        self.stream = stream or sys.stderr
        self.bar = None
        self._redirect = contextlib.ExitStack()
        if self.stream.isatty() and not quiet:
            from tqdm import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm

            self.bar = tqdm(
                total=max_steps, initial=start_step, file=self.stream, dynamic_ncols=True
            )
            # log lines ("checkpoint saved") go above the bar instead of onto its line
            self._redirect.enter_context(logging_redirect_tqdm())

    def log(self, record: dict) -> None:
        line = progress_line(record, self.max_steps, self.world_size)
        if self.bar is None:
            log.info(line, extra={"file_only": self.quiet})
            return
        self.bar.update(record["step"] - self.bar.n)
        if "loss" in record:  # tqdm shows its own time left: no second, stale "eta"
            parts = [p for p in line.split(" | ")[1:] if not p.startswith("eta ")]
            self.bar.set_postfix_str(" | ".join(parts), refresh=True)

    def log_images(self, images: dict[str, Path]) -> None:
        self.picture = images.get("report")

    def close(self, summary: dict) -> None:
        if self.bar is not None:
            self.bar.close()
            self._redirect.close()
        if self.run_dir is not None and summary:
            if self.brief:  # a sweep point or tuning trial: its first line
                log.info("%s", closing_block(self.run_dir, summary).splitlines()[0])
                return
            offered = self.what_next(summary) if self.what_next else []
            picture = self.picture or (
                "off (run.report=false)" if not self.report
                else deferred(summary.get("exit_code", 0), stopped_by())
                or "not drawn (the warning above says why)"
            )  # fmt: skip
            log.info("%s", closing_block(self.run_dir, summary, offered, picture))


def wall_text(seconds, missing: str = "?") -> str:
    """A wall time as the closing block and `launcher.runs` both show it: `7.5 s` under a
    minute, `m:ss` (`h:mm:ss`) from a minute on."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        return missing
    if not math.isfinite(seconds):
        return missing
    return f"{seconds:.1f} s" if seconds < 60 else _fmt_eta(seconds)


def _figure(value, fmt: str) -> str:
    return format(value, fmt) if isinstance(value, (int, float)) else "none"


def closing_block(
    run_dir: Path, summary: dict, next_lines: Sequence[str] = (), picture: Path | str = ""
) -> str:
    """What a person reads at the end of a run: where it is, how long it took (summary.json's
    `wall_time_s`: from the launch to the last write, launcher.runtime.launch_clock), what it
    reached, its picture (`picture`: the report drawn, or why there is none; report.png by
    default), and `next_lines`: the commands that will work on it (the training front door's
    launcher.train.next_steps). A failed run: one line; the error above says why."""
    status = str(summary.get("status", "?"))
    steps = summary.get("steps")
    head = f"run {run_dir}: {status.split(':')[0]}"
    lines = [f"{head}, {steps} steps in {wall_text(summary.get('wall_time_s'))} wall time"]
    if not status.startswith(("completed", "stopped")):  # the error above says why
        return f"{lines[0]}; summary.json names the first failing rank, logs in {run_dir}/logs"
    lines.append(
        f"  loss {_figure(summary.get('loss'), '.4f')}, eval loss "
        f"{_figure(summary.get('eval/loss'), '.4f')}, "
        f"tokens/s {_figure(summary.get('tokens_per_s'), ',.0f')}, mfu "
        + (
            f"{summary['mfu'] * 100:.1f}%"
            if isinstance(summary.get("mfu"), float)
            else "none (no known peak FLOPs for this device: docs/metrics.md)"
        )
    )
    lines.append(f"  report: {picture or run_dir / 'report.png'}")
    lines += next_lines
    return "\n".join(lines)
