"""What finished runs measured, read for the plan's calibration (`--from RUN_DIR`, given once
or more; a sweep's folder stands for every point in it).

Each run is read as the plan models any run (launcher.plan.shape: its config.yaml at its
world size, the vocabulary its checkpoint or tokenizer records), and set beside what it
measured: its median step, the part of it that was exposed communication or data wait, each
kind of collective's calls, bytes and time a step (summary.json, comm_collectives.json), and
its last checkpoint's write (meta.json). Every figure read is checked to be a number in its
range: a damaged summary is one line naming the file, the key and the value, never a
traceback or a forecast built on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from launcher.checkpoint.protocol import find_resumable, read_meta
from launcher.config.ranges import Range
from launcher.config.registry import engine
from launcher.data.tokenizer import TOKENIZER_DIR, saved_vocab_size
from launcher.data.vocab import Vocabulary
from launcher.plan.shape import RunShape, shape_of

SUMMARY, COLLECTIVES = "summary.json", "comm_collectives.json"
DAY = 86400.0
# Each figure a calibration reads, with the values a real run can have.
FIGURES = {
    "world_size": Range(low=1, high=10**6, why="ranks"),
    "step_time_s/p50": Range(low=0.0, high=DAY, low_open=True, why="seconds a step"),
    "comm/exposed_s": Range(low=0.0, high=DAY, why="seconds a step"),
    "comm/allreduce_s": Range(low=0.0, high=DAY, why="seconds a step"),
    "data_wait_s": Range(low=0.0, high=DAY, why="seconds a step"),
    "comm/bytes": Range(low=0.0, high=1e15, why="bytes a step"),
    "comm/buckets": Range(low=0, high=10**6, why="buckets a step"),
    "calls_per_step": Range(low=0.0, high=1e7, why="calls a step"),
    "bytes_per_step": Range(low=0.0, high=1e15, why="bytes a step"),
    "inflight_s_per_step": Range(low=0.0, high=DAY, why="seconds a step"),
    "write_s": Range(low=0.0, high=DAY, low_open=True, why="seconds"),
    "startup_s": Range(low=0.0, high=DAY, why="seconds to the first step"),
}
# comm_collectives.json's names for the collectives the plan models
OPS = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter"}


@dataclass(frozen=True)
class Sample:
    """One kind of collective as a run timed it: `calls` a step, each of a `size`-byte full
    buffer (the all-reduce's, the gathered or the reduced tensor) over `ranks`, `seconds`
    each (the mean)."""

    op: str
    ranks: int
    per_node: int
    size: float
    seconds: float
    calls: float
    source: str
    engine: str = ""  # the run's (launcher.plan.measured.engine_label)


@dataclass
class RunRecord:
    """One measured run, as the calibration reads it."""

    source: str
    shape: RunShape
    engine: str  # the engine and its variant (launcher.plan.measured.engine_label)
    world_size: int
    per_node: int
    cores: int | None  # the machine's CPU cores (env.json)
    device: str | None  # the GPU's name; None: the CPU
    step_s: float
    exposed_s: float
    wait_s: float
    comm_s: float | None  # all its collectives' time a step, hidden or not
    samples: list[Sample] = field(default_factory=list)
    write_s: float | None = None
    written: int | None = None  # bytes of its last checkpoint's largest writer
    startup_s: float | None = None  # from its process's start to its first step: a restart's

    @property
    def compute_s(self) -> float:
        """The step less what was not computing: exposed communication and data wait."""
        return max(self.step_s - self.exposed_s - self.wait_s, 1e-9)

    @property
    def overlap(self) -> float | None:
        if not self.comm_s:
            return None
        return max(0.0, 1.0 - self.exposed_s / self.comm_s)


def engine_label(cfg) -> str:
    """The engine a run used, with what its checkpoints identify it by besides the
    precision (DeepSpeed's stage): each calibrates its own fixed costs."""
    named = engine(str(cfg.strategy.name))
    keys = {k: v for k, v in named.resume.identity(cfg).items() if k != "precision"}
    return str(cfg.strategy.name) + "".join(f" {k}={v}" for k, v in keys.items())


def runs_in(path: Path) -> list[Path]:
    """The run directories `path` stands for: itself, or a sweep's points."""
    path = Path(path)
    if (path / SUMMARY).is_file():
        return [path]
    points = sorted(p.parent for p in path.glob(f"*/{SUMMARY}")) if path.is_dir() else []
    if not points:
        raise ValueError(f"{path}: no {SUMMARY} there nor in its folders; give a run "
                         "directory or a sweep's folder (--from runs/<id>)")  # fmt: skip
    return points


def read_runs(paths: list[Path]) -> list[RunRecord]:
    """Every run `paths` stand for, that completed steps (a run without a step time is
    skipped: it measured nothing to calibrate with)."""
    records = [read_run(run) for path in paths for run in runs_in(path)]
    kept = [r for r in records if r is not None]
    if not kept:
        raise ValueError(f"{', '.join(map(str, paths))}: no run there measured a step time")
    return kept


def read_run(run_dir: Path) -> RunRecord | None:
    """One run directory's record; None for a run that measured no step."""
    summary = _json(run_dir / SUMMARY)
    step = _figure(summary, "step_time_s/p50", run_dir / SUMMARY, required=False)
    if step is None:
        return None
    figure = lambda key: _figure(summary, key, run_dir / SUMMARY) or 0.0  # noqa: E731
    world = int(_figure(summary, "world_size", run_dir / SUMMARY) or 1)
    cfg = _config(run_dir)
    per_node = world if world % max(1, int(cfg.cluster.nodes)) else world // int(cfg.cluster.nodes)
    env = _json(run_dir / "env.json", required=False)
    devices = env.get("devices") or []
    device = devices[0].get("name") if devices and isinstance(devices[0], dict) else None
    cores = env.get("cpu_count") if isinstance(env.get("cpu_count"), int) else None
    last = find_resumable(run_dir)
    meta = (read_meta(last) or {}) if last else {}
    vocab = (meta.get("model") or {}).get("vocab_size") or saved_vocab_size(run_dir / TOKENIZER_DIR)
    known = Vocabulary(int(vocab), f"as {run_dir} built it", True) if vocab else None
    shape = shape_of(cfg, world, known)
    record = RunRecord(
        source=str(run_dir), shape=shape, engine=engine_label(cfg), world_size=world,
        per_node=per_node, cores=cores, device=device, step_s=step,
        exposed_s=figure("comm/exposed_s"), wait_s=figure("data_wait_s"),
        comm_s=figure("comm/allreduce_s") or None,
        samples=_samples(run_dir, summary, world, per_node, engine_label(cfg)),
        startup_s=_figure(summary, "startup_s", run_dir / SUMMARY),
    )  # fmt: skip
    write_s = _figure(meta, "write_s", last / "meta.json", required=False) if last else None
    if write_s and meta.get("files"):
        record.write_s, record.written = write_s, _largest_writer(shape, meta["files"], world)
    return record


def _largest_writer(shape: RunShape, files: dict, world: int) -> int:
    """The bytes the run's largest writer wrote: the checkpoint's files (its RNG states
    aside), split over the ranks as the engine declares (meta.json lists the files, not
    who wrote them)."""
    state = sum(int(n) for name, n in files.items() if not name.startswith("rng_"))
    return round(state * largest_share(shape, world))


def writes_of(shape: RunShape, world_size: int) -> list[int]:
    """Bytes each rank writes into one durable checkpoint, rank 0 first (the engine's
    declaration; an engine that declares no Plan: rank 0 the whole state, 12 bytes a
    parameter)."""
    plan = engine(str(shape.cfg.strategy.name)).plan
    if plan is None:
        return [shape.params * 12]
    return plan.checkpoint_writes(shape.cfg, shape.params, world_size)


def largest_share(shape: RunShape, world_size: int) -> float:
    """The largest writer's share of a checkpoint: what its write time is set by."""
    writes = writes_of(shape, world_size)
    return max(writes) / sum(writes)


def _samples(run_dir: Path, summary: dict, world: int, per_node: int,
             engine: str) -> list[Sample]:  # fmt: skip
    """Each kind of collective the run timed: comm_collectives.json's per-kind figures
    (all-reduce-equivalent bytes, turned back into full buffers), else DDP's buckets
    (summary.json's comm/allreduce_s, comm/bytes and comm/buckets). Collectives in flight
    at once (ZeRO-3's prefetched gathers) each count the others' time too: the kinds' time
    is cut to the step's time with any collective in flight (comm/allreduce_s), shared in
    proportion."""
    if world < 2:
        return []
    path = run_dir / COLLECTIVES
    source = str(run_dir)
    busy = _figure(summary, "comm/allreduce_s", run_dir / SUMMARY)
    if path.is_file():
        rows = []
        for kind, figures in (_json(path).get("per_kind") or {}).items():
            if kind not in OPS or not isinstance(figures, dict):
                continue
            keys = ("calls_per_step", "bytes_per_step", "inflight_s_per_step")
            calls, counted, seconds = (_figure(figures, k, path) for k in keys)
            if calls and counted and seconds:
                full = counted if kind == "all_reduce" else 2 * counted  # the timer's S/2
                rows.append((kind, calls, full, seconds))
        inflight = sum(seconds for *_, seconds in rows)
        cut = min(1.0, busy / inflight) if busy and inflight else 1.0
        return [Sample(kind, world, per_node, full / calls, seconds * cut / calls, calls, source,
                       engine) for kind, calls, full, seconds in rows]  # fmt: skip
    buckets = _figure(summary, "comm/buckets", run_dir / SUMMARY)
    moved = _figure(summary, "comm/bytes", run_dir / SUMMARY)
    if not (buckets and moved and busy):
        return []
    return [Sample("all_reduce", world, per_node, moved / buckets, busy / buckets, buckets,
                   source, engine)]  # fmt: skip


def _config(run_dir: Path):
    path = run_dir / "config.yaml"
    try:
        return OmegaConf.load(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot be read as the run's config ({exc})") from exc


def _figure(data: dict, key: str, path: Path, required: bool = False) -> float | None:
    """`data[key]` checked against its range (FIGURES); None when absent or null."""
    value = data.get(key)
    if value is None:
        if required:
            raise ValueError(f"{path}: no {key}")
        return None
    allowed = FIGURES[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not allowed.holds(value):
        raise ValueError(
            f"{path}: {key}={value!r} is not {allowed.why} ({allowed.rule()}); the file is "
            "damaged or not a launcher run's: run it again, or give --from another run"
        )
    return float(value)


def _json(path: Path, required: bool = True) -> dict:
    if not required and not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot be read as a run's JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    return data
