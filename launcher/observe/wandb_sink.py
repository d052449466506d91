"""Weights & Biases: one W&B run per training run (rank 0 only), and one per sweep summary.

`wandb` is imported inside the functions that use it, never at module level, so a run with
`logger.mode=disabled` (the default, `logger=none`) does not import it. Its files go into
the run directory (`runs/<run_id>/wandb/`) unless `logger.dir` says otherwise. The API key
is read by wandb itself from `WANDB_API_KEY` (or `wandb login`); the launcher never holds
it, so it cannot reach config.yaml, env.json, the logs or the W&B config.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
from collections.abc import Mapping
from pathlib import Path

from launcher.config.errors import ConfigError
from launcher.observe.sinks import Sink, finite_or_none
from launcher.resilience.preemption import stop_for_full_disk
from launcher.runtime import disk

log = logging.getLogger("launcher")

_ID_MAX = 64
_NOT_ID_CHAR = re.compile(r"[^A-Za-z0-9_-]")


def wandb_enabled(logger_cfg) -> bool:
    """Whether this config asks for a W&B run (`logger=none` keeps the mode disabled)."""
    return logger_cfg.mode != "disabled"


def wandb_run_id(run_id: str) -> str:
    """The W&B run id of a run directory: derived from the run id alone, so every restart
    or requeue of the same run directory continues the same W&B run.

    A run id that is already a short, plain W&B id is used as it is; any other (a sweep
    point's `<sweep_id>/<point>`, a long or unusual name) becomes a readable slug plus a
    hash of the whole id, so two different run ids never share a W&B run.
    """
    if len(run_id) <= _ID_MAX and not _NOT_ID_CHAR.search(run_id):
        return run_id
    digest = hashlib.sha1(run_id.encode()).hexdigest()[:8]
    slug = _NOT_ID_CHAR.sub("-", run_id).strip("-")[: _ID_MAX - len(digest) - 1]
    return f"{slug}-{digest}" if slug else digest


def _settings(wandb):
    """Console capture off: every rank's output is already in logs/rank<r>.log, and
    wrapping rank 0's stderr would also change what the progress bar sees. System
    metrics (CPU, GPU utilisation and memory) stay on; WANDB_X_DISABLE_STATS=true in the
    environment turns them off."""
    return wandb.Settings(console="off")


def _init(wandb, logger_cfg, directory: Path, **kwargs):
    directory.mkdir(parents=True, exist_ok=True)
    return wandb.init(
        project=logger_cfg.project,
        entity=logger_cfg.entity,
        mode=logger_cfg.mode,
        dir=str(directory),
        tags=list(logger_cfg.tags or []),
        settings=_settings(wandb),
        **kwargs,
    )


def refuse_a_full_disk(directory: Path) -> None:
    """W&B writes its files (and its own log) there from a service process that never tells
    the trainer of a full disk: below the space a run needs to start, one line instead,
    before W&B starts."""
    if _nearly_full(directory):
        raise ConfigError(_no_space_line(directory))


def _nearly_full(directory: Path) -> bool:
    free = disk.free_bytes(directory)
    return free is not None and free < disk.NEARLY_FULL


def _no_space_line(directory: Path) -> str:
    return disk.no_space_line("W&B files", directory / "wandb", disk.NEARLY_FULL)


class WandbSink(Sink):
    """Sends rank 0's records to one W&B run: the same names and values as metrics.jsonl,
    at W&B step = the record's `step`; the end-of-run summary goes to the run summary."""

    def __init__(
        self,
        logger_cfg,
        *,
        run_dir: Path,
        run_id: str,
        config: Mapping,
        group: str | None = None,
        name: str | None = None,
    ):
        import wandb

        directory = Path(logger_cfg.dir).expanduser() if logger_cfg.dir else Path(run_dir)
        refuse_a_full_disk(directory)
        self.directory, self.full = directory, False
        self.run = _init(
            wandb,
            logger_cfg,
            directory,
            id=wandb_run_id(run_id),
            resume="allow",
            name=name or run_id,
            group=group,
            job_type="train",
            config=dict(config),
        )
        log.info("W&B run %s (%s) in %s/wandb/", self.run.id, logger_cfg.mode, directory.as_posix())

    def log(self, record: dict) -> None:
        """A row per record. W&B's service meets a full disk mid-run in silence (offline, its
        `.wandb` file stops growing; its own debug-internal.log alone says so), so the free
        space is checked first: nearly full, the rows stop and every rank stops at the next
        step boundary with a checkpoint, as for metrics.jsonl (docs/faults.md)."""
        if self.full:
            return
        if _nearly_full(self.directory):
            self.full = True
            stop_for_full_disk(_no_space_line(self.directory))
            return
        # commit=True writes the row now: W&B otherwise holds a step's row until the next
        # step arrives, and the last row would land after (and overwrite) the summary.
        self.run.log(
            {k: finite_or_none(v) for k, v in record.items()}, step=record["step"], commit=True
        )

    def log_images(self, images: dict[str, Path]) -> None:
        """The run's pictures (report.png: with its rank x interval heatmaps, every rank
        in one image rather than a series each) as images in the run summary: a history
        row would add a step after the last one."""
        if self.full or not images:
            return
        try:
            import wandb

            self.run.summary.update({n: wandb.Image(str(p)) for n, p in images.items()})
        except Exception as exc:  # noqa: BLE001 - a picture must never fail the run's end
            log.warning("W&B: could not log %s: %s", ", ".join(map(str, images.values())), exc)

    def close(self, summary: dict) -> None:
        """Summary into the run summary; a failed run finishes with exit code 1 (W&B shows
        it failed), a stopped (preempted) one is marked preempting, to be resumed.

        A W&B failure here is logged, not raised: summary.json and the process group's
        teardown, which come after the sinks close, matter more than the W&B copy.
        """
        status = str(summary.get("status", ""))
        if self.full:
            _drop_file_logs(self.directory)
        try:
            self.run.summary.update(headline_first(summary))
            if status == "stopped":
                self.run.mark_preempting()
            self.run.finish(exit_code=0 if status in ("completed", "stopped") else 1)
        except Exception as exc:  # noqa: BLE001 - see the docstring
            log.warning("W&B: could not finish run %s: %s", self.run.id, exc)


# What a person looks for first in a run's W&B summary, in this order; W&B lists a summary
# as it was written, and summary.json's order puts comm/* before loss's place in the table.
HEADLINE = ("status", "loss", "eval/loss", "eval/ppl", "tokens_per_s", "mfu",
            "step_time_s/p50", "wall_time_s", "steps", "tokens", "world_size")  # fmt: skip


def headline_first(summary: dict) -> dict:
    """summary.json's figures for W&B's run summary: the headline first (a non-finite loss
    as null, still in its place), then the rest as summary.json orders them, without the
    figures this run has none of (another engine's collectives), which W&B would list as
    empty rows."""
    first = {k: finite_or_none(summary[k]) for k in HEADLINE if k in summary}
    rest = {k: finite_or_none(v) for k, v in summary.items() if k not in first}
    return {**first, **{k: v for k, v in rest.items() if v is not None}}


def _drop_file_logs(directory: Path) -> None:
    """Detach wandb's own log files under `directory` (its debug.log): on a full disk each of
    its lines would otherwise print logging's "--- Logging error ---" traceback."""
    wandb_logger = logging.getLogger("wandb")
    for handler in list(wandb_logger.handlers):
        name = getattr(handler, "baseFilename", None)
        if name and Path(name).resolve().is_relative_to(directory.resolve()):
            wandb_logger.removeHandler(handler)
            with contextlib.suppress(OSError):  # its buffer cannot be flushed either
                handler.close()


def log_sweep_summary(
    logger_cfg,
    run_root_dir,
    sweep_id: str,
    rows: list[dict],
    png_path=None,
    *,
    job_type: str = "sweep_summary",
    name: str | None = None,
    plot_key: str = "sweep_plot",
) -> str | None:
    """One short W&B run (job_type `sweep_summary`, grouped with the sweep's points by
    `group=sweep_id`) holding the sweep's table as `sweep_summary` and its plot as
    `sweep_plot`. Returns the W&B run id, or None when W&B is disabled. launcher.tune logs
    its rounds the same way (job_type `tune_report`, plot `tune_plot`).

    `run_root_dir` is `run.root`: the files go to `<run_root_dir>/<sweep_id>/wandb/`, next
    to sweep_summary.{csv,md,png}, unless `logger.dir` is set. The id is derived from the
    sweep id, so a requeued sweep that writes its summary again reuses the same W&B run.
    """
    if not wandb_enabled(logger_cfg):
        return None
    import wandb

    directory = (
        Path(logger_cfg.dir).expanduser() if logger_cfg.dir else Path(run_root_dir) / sweep_id
    )
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    table = _table(wandb, columns, [[row.get(c) for c in columns] for row in rows])
    run = _init(
        wandb,
        logger_cfg,
        directory,
        id=wandb_run_id(f"{sweep_id}-{job_type}"),
        resume="allow",
        name=name or f"{sweep_id} summary",
        group=sweep_id,
        job_type=job_type,
        config={"sweep_id": sweep_id, "points": len(rows)},
    )
    with _finishing(run):
        logged = {job_type: table}
        if png_path is not None and Path(png_path).is_file():
            logged[plot_key] = wandb.Image(str(png_path))
        elif png_path is not None:
            log.warning("sweep plot %s not found; the W&B summary has the table only", png_path)
        run.log(logged)
    return run.id


def add_to_run(
    logger_cfg,
    run_dir: Path,
    run_id: str,
    tables: Mapping[str, tuple[list[str], list[list]]],
    artifact: tuple[str, str, list[Path]],
) -> str | None:
    """Add tables and an artifact to a finished run's W&B run (resumed by its id), as
    `launcher.analyze` does with its report. `tables` maps a key to (columns, rows);
    `artifact` is (name, type, files). Returns the W&B run id, or None when disabled."""
    if not wandb_enabled(logger_cfg):
        return None
    import wandb

    directory = Path(logger_cfg.dir).expanduser() if logger_cfg.dir else Path(run_dir)
    run = _init(wandb, logger_cfg, directory, id=wandb_run_id(run_id), resume="allow")
    with _finishing(run):
        run.log({key: _table(wandb, *table) for key, table in tables.items()}, commit=True)
        name, kind, files = artifact
        art = wandb.Artifact(name, type=kind)
        for path in files:
            art.add_file(str(path))
        run.log_artifact(art)
    return run.id


def _table(wandb, columns: list[str], rows: list[list]):
    return wandb.Table(
        columns=columns,
        data=[[finite_or_none(v) for v in row] for row in rows],
        allow_mixed_types=True,
    )


@contextlib.contextmanager
def _finishing(run):
    """Finish a short-lived run when the block ends, as failed (exit code 1) if it raised."""
    try:
        yield run
    except BaseException:
        run.finish(exit_code=1)
        raise
    run.finish()
