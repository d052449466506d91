"""TensorBoard: event files beside metrics.jsonl (rank 0 only), the sweep summary, and the
analyser's report.

The writer is tensorboardX's `SummaryWriter` (it needs numpy, packaging and protobuf; the
`tensorboard` package is the viewer), imported inside the functions that write, never at
module level, so a run without `logger.tensorboard` does not import it. Every record gets
the names and values metrics.jsonl has: scalars at TensorBoard step = the record's `step`.
TensorBoard stores a scalar as a 32-bit float, so a value equals metrics.jsonl's at float32
precision.

Restarts: metrics.jsonl drops the records of the steps a resumed run redoes; the event file
of the new attempt starts with `purge_step` = the resumed step + 1, which makes TensorBoard
drop the earlier attempt's events from that step on, so every step shows once. Writers that
replace what they wrote before (the sweep summary, the analysis) purge from step 0.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Mapping
from pathlib import Path

from launcher.observe.sinks import Sink, finite_or_none
from launcher.resilience.preemption import stop_for_full_disk
from launcher.runtime import disk

log = logging.getLogger("launcher")

TB_DIR = "tb"  # the event directory inside a run directory (and inside a sweep's directory)
WRITER_PACKAGE = "tensorboardX"


def tensorboard_enabled(logger_cfg) -> bool:
    """Whether this config asks for TensorBoard event files (`logger=tensorboard`, or
    `logger.tensorboard=true`). A run directory written before the key existed has none."""
    return bool(getattr(logger_cfg, "tensorboard", False))


def _writer(logdir: Path, purge_step: int):
    from tensorboardX import SummaryWriter

    logdir.mkdir(parents=True, exist_ok=True)
    return SummaryWriter(logdir=str(logdir), purge_step=purge_step)


def _abandon(writer) -> None:
    """Stop tensorboardX's writer thread without the final flush that a full disk fails:
    its close (also run at exit) would flush, fail, and leave a traceback from the thread
    on a closed queue. tensorboardX offers no public way to drop what it buffered."""
    events = getattr(getattr(writer, "file_writer", None), "event_writer", None)
    if events is None or events._closed:
        return
    with contextlib.suppress(Exception):
        events._worker.stop()
    events._closed = True


def scalars(record: Mapping) -> dict[str, float]:
    """A record's figures as TensorBoard scalars: every number but `step` (the x axis).
    A figure metrics.jsonl writes as null (none measured, NaN, inf) is left out."""
    return {
        key: float(value)
        for key, value in record.items()
        if key != "step" and isinstance(finite_or_none(value), (int, float))
    }


def code_block(text: str, language: str = "") -> str:
    """Text shown verbatim by TensorBoard's text plugin (which renders markdown)."""
    return f"```{language}\n{text.rstrip()}\n```"


def markdown_table(columns: list[str], rows: list[list]) -> str:
    """A markdown table for TensorBoard's text plugin; null, NaN and inf show as `-`."""

    def cell(value) -> str:
        value = finite_or_none(value)
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.6g}"
        return str(value).replace("|", "\\|")

    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


class TensorBoardSink(Sink):
    """Writes rank 0's records into `<run_dir>/tb/`: the same names and values as
    metrics.jsonl at step = the record's `step`; `texts` (the resolved config, the
    environment) at the step the run starts from; the end-of-run summary as a table."""

    def __init__(self, run_dir: Path, *, start_step: int, texts: Mapping[str, str]):
        self.logdir = Path(run_dir) / TB_DIR
        # metrics.jsonl keeps the records up to start_step and drops later ones; TensorBoard
        # drops the earlier attempts' events from start_step + 1 on.
        self.writer = _writer(self.logdir, purge_step=start_step + 1)
        self.last_step = start_step
        for tag, text in texts.items():
            self.writer.add_text(tag, text, start_step)
        self.writer.flush()
        log.info("TensorBoard event files in %s/", self.logdir.as_posix())

    def log(self, record: dict) -> None:
        if self.writer is None:
            return  # the disk filled up: the run is stopping
        step = self.last_step = record["step"]
        try:
            for tag, value in scalars(record).items():
                self.writer.add_scalar(tag, value, step)
            self.writer.flush()  # as metrics.jsonl: a crash loses nothing already logged
        except OSError as exc:
            if not disk.is_full(exc, self.logdir):
                raise
            _abandon(self.writer)
            self.writer = None
            stop_for_full_disk(disk.no_space_line("TensorBoard event files", self.logdir, None))

    def log_images(self, images: dict[str, Path]) -> None:
        """The run's pictures (report.png, with its rank x interval heatmaps) as images at
        the last step. A failure is logged, not raised."""
        if self.writer is None:
            return
        try:
            for name, path in images.items():
                self.writer.add_image(name, _rgb(path), self.last_step, dataformats="HWC")
            self.writer.flush()
        except Exception as exc:  # noqa: BLE001 - a picture must never fail the run's end
            log.warning("TensorBoard: could not add %s: %s", list(images), exc)

    def close(self, summary: dict) -> None:
        """summary.json's figures as a table at the last step. A failure here is logged,
        not raised: summary.json and the teardown that follow matter more."""
        if self.writer is None:
            return
        try:
            if summary:
                table = markdown_table(["figure", "value"], [list(kv) for kv in summary.items()])
                self.writer.add_text("summary", table, int(summary.get("steps") or 0))
            self.writer.close()
        except Exception as exc:  # noqa: BLE001 - see the docstring
            log.warning("TensorBoard: could not finish %s: %s", self.logdir, exc)


def log_sweep_summary(
    logger_cfg, run_root_dir, sweep_id: str, rows: list[dict], png_path=None
) -> Path | None:
    """The sweep's table as the text `sweep/summary` and its plot as the image `sweep/plot`,
    in `<run_root_dir>/<sweep_id>/tb/`, beside the points' own `<point>/tb/` (so that
    `tensorboard --logdir runs/<sweep_id>` overlays the points and shows the summary).
    A requeued sweep that writes its summary again replaces the earlier one. Returns the
    event directory, or None when TensorBoard is off."""
    if not tensorboard_enabled(logger_cfg):
        return None
    from launcher.config.sweep import markdown_table as sweep_table

    logdir = Path(run_root_dir) / sweep_id / TB_DIR
    writer = _writer(logdir, purge_step=0)
    try:
        writer.add_text("sweep/summary", sweep_table(rows, f"sweep {sweep_id}"), 0)
        if png_path is not None and Path(png_path).is_file():
            writer.add_image("sweep/plot", _rgb(Path(png_path)), 0, dataformats="HWC")
        elif png_path is not None:
            log.warning("sweep plot %s not found; TensorBoard has the table only", png_path)
    finally:
        writer.close()
    return logdir


def _rgb(png: Path):
    """The image's pixels, height x width x RGB (Pillow comes with matplotlib)."""
    import numpy as np
    from PIL import Image

    with Image.open(png) as image:
        return np.asarray(image.convert("RGB"))


def add_analysis(
    logdir: Path,
    texts: Mapping[str, str],
    per_run_scalars: Mapping[str, Mapping[int, Mapping[str, float]]],
    step: int,
) -> Path:
    """Write an analysis into `logdir`, replacing an earlier one there: `texts` at `step`,
    and for each sub-run name (a rank, say) its scalars {step: {tag: value}} into
    `logdir/<name>/`, one TensorBoard run each, so TensorBoard overlays them."""
    writer = _writer(logdir, purge_step=0)
    try:
        for tag, text in texts.items():
            writer.add_text(tag, text, step)
    finally:
        writer.close()
    for name, by_step in per_run_scalars.items():
        run_writer = _writer(logdir / name, purge_step=0)
        try:
            for at, values in sorted(by_step.items()):
                for tag, value in values.items():
                    if value is not None and math.isfinite(value):
                        run_writer.add_scalar(tag, value, at)
        finally:
            run_writer.close()
    return logdir
