"""Figures fitted to measured runs, so that they transfer to shapes the runs did not have.

A step's compute (its time less exposed communication and data wait) is modelled per rank
as a rate per FLOP plus fixed costs, each fitted by non-negative least squares over every
run given (`fit_compute`):

    compute = FLOPs / R + optimizer elements x u + attention scores x c
              + micro-steps x (layers + 1) x a_e + b_e

R (the FLOP rate of the device and precision), u (the optimizer's update, per element of
the state a rank updates) and c (the softmax's work on each of the s x s attention scores a
layer and head keeps per sequence: elementwise, so not in the FLOPs) are shared by the
engines; each engine e (DDP, each ZeRO stage,
FSDP2) has its own cost a_e per layer and micro-step (its hooks, the kernels' launches) and
b_e per step (its own bookkeeping). A coefficient that no run can tell from the others (one
run: all its time is its FLOP rate) is left out and said so; the engines and precisions
without a run take the others' and are marked extrapolated.

Each kind of collective is fitted the same way over the sizes the runs measured
(`fit_links`): its latency per step and its bus bandwidth (launcher.plan.comm's model);
one size alone keeps the preset's balance between the two and scales both to it.

On a CPU, ranks that outnumber the cores share them: a run's compute and collectives'
times are divided by its ranks per core (beyond one) before fitting, and the plan's
multiplied by its own (`cpu_share`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from launcher.plan import comm, memory
from launcher.plan.measured import RunRecord, Sample, engine_label, read_runs
from launcher.plan.presets import Link, Topology
from launcher.plan.shape import RunShape

# How far past the runs' range a figure may go before the plan calls it extrapolated.
REACH = 4.0
# Collectives smaller than this (DeepSpeed's all-reduced norms and overflow flags) are not
# the gradients and weights the plan models: left out of the links' fit.
SCALARS = 1024


@dataclass(frozen=True)
class Features:
    """What a step's compute grows with (see the module's formula)."""

    flops: float  # FLOPs one rank computes a step
    optimizer: float  # optimizer state elements one rank updates
    micro_layers: float  # micro-steps x (layers + 1)
    engine: str
    precision: str
    scores: float = 0.0  # attention scores one rank's tokens weigh a step: x layers x heads

    @classmethod
    def of(cls, shape: RunShape, engine: str, optimizer_bytes: int) -> Features:
        t, m, b = shape.cfg.trainer, shape.cfg.model, shape.batch
        tokens = b.per_rank * b.seq_len * (4 / 3 if t.grad_checkpointing else 1.0)
        return cls(shape.flops_per_rank_step, optimizer_bytes / 8,
                   b.accum * (int(m.n_layer) + 1), engine, str(t.precision),
                   tokens * b.seq_len * int(m.n_layer) * int(m.n_head))  # fmt: skip


@dataclass
class ComputeFit:
    """The fitted coefficients, by name: `rate:<precision>` (FLOP/s), `optimizer`
    (seconds an element), `scores` (seconds an attention score), `micro:<engine>` and
    `step:<engine>` (seconds)."""

    coef: dict[str, float]
    rows: list[Features]
    sources: list[str]
    left_out: list[str] = field(default_factory=list)  # coefficients no run could tell apart

    def predict(self, x: Features) -> tuple[float | None, list[str]]:
        """(compute seconds of `x`, what is extrapolated); None without a rate for its
        precision nor any other."""
        notes = []
        rate = self.coef.get(f"rate:{x.precision}")
        if rate is None:
            others = [v for k, v in self.coef.items() if k.startswith("rate:")]
            if not others:
                return None, ["no run measured a FLOP rate"]
            rate = statistics.median(others)
            notes.append(f"no run at trainer.precision={x.precision}: the others' FLOP rate")
        seconds = x.flops / rate + x.optimizer * self.coef.get("optimizer", 0.0)
        seconds += x.scores * self.coef.get("scores", 0.0)
        engines = {r.engine for r in self.rows}
        engine = x.engine
        if engine not in engines:
            engine = max(engines, key=lambda e: sum(r.engine == e for r in self.rows))
            notes.append(f"no run of {x.engine}: its fixed costs taken as {engine}'s")
        seconds += x.micro_layers * self.coef.get(f"micro:{engine}", 0.0)
        seconds += self.coef.get(f"step:{engine}", 0.0)
        for name in ("flops", "optimizer", "micro_layers", "scores"):
            values = [getattr(r, name) for r in self.rows]
            value = getattr(x, name)
            if value and values and not min(values) / REACH <= value <= max(values) * REACH:
                notes.append(f"{name.replace('_', ' x ')} {value:.3g} is beyond {REACH:g}x the "
                             f"runs' {min(values):.3g}-{max(values):.3g}")  # fmt: skip
        return seconds, notes


def cpu_share(per_node: int, cores: int | None) -> float:
    """How many ranks share one core (1 when each has its own): the factor their compute
    (each has that share of a core) and their collectives (each step of a ring waits for
    both its ends to be scheduled) grow by on a CPU (benchmarks/plan_check.py's 4-rank
    shapes on 2 cores, docs/plan.md)."""
    return max(1.0, per_node / cores) if cores else 1.0


def fit_compute(records: list[RunRecord], features: list[Features]) -> ComputeFit:
    """The compute model fitted to `records` (their `features`)."""
    names = [f"rate:{p}" for p in sorted({x.precision for x in features})]
    names += [f"step:{e}" for e in sorted({x.engine for x in features})]
    names += [f"micro:{e}" for e in sorted({x.engine for x in features})]
    names += ["optimizer", "scores"]

    def column(name: str) -> list[float]:
        kind, _, key = name.partition(":")
        return [{"rate": x.flops * (x.precision == key), "step": float(x.engine == key),
                 "micro": x.micro_layers * (x.engine == key),
                 "optimizer": x.optimizer, "scores": x.scores}[kind] for x in features]  # fmt: skip

    # a rank's compute on a core of its own: ranks sharing cores computed on their share
    y = np.array([r.compute_s / (cpu_share(r.per_node, r.cores) if r.device is None else 1.0)
                  for r in records])  # fmt: skip
    kept, left_out, matrix = [], [], np.zeros((len(y), 0))
    for name in names:  # in order: a coefficient joins when the runs can tell it apart
        col = np.array(column(name))
        trial = np.column_stack([matrix, col / (np.abs(col).max() or 1.0)])
        if np.linalg.matrix_rank(trial, tol=1e-6) > matrix.shape[1]:
            kept.append(name)
            matrix = trial
        elif col.any():
            left_out.append(name)
    scale = np.array([np.abs(column(n)).max() or 1.0 for n in kept])
    solution = nnls(matrix, y) / scale
    coef = {}
    for name, value in zip(kept, solution, strict=True):
        if name.startswith("rate:"):
            if value > 0:
                coef[name] = 1.0 / value
        elif value > 0:
            coef[name] = float(value)
    return ComputeFit(coef, list(features), [r.source for r in records], left_out)


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares (Lawson and Hanson's active set), for the few columns a
    calibration has."""
    n = a.shape[1]
    x, passive = np.zeros(n), np.zeros(n, dtype=bool)
    for _ in range(3 * n + 1):
        w = a.T @ (b - a @ x)
        if passive.all() or (w[~passive] <= 1e-12).all():
            break
        passive[np.argmax(np.where(passive, -np.inf, w))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            step = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + step * (z - x)
            passive &= x > 1e-12
    return x


@dataclass
class LinkFit:
    """Links fitted per engine and kind of collective (engine "": every engine's runs
    together), and what each rests on."""

    by_op: dict[tuple[str, str], Link]
    why: dict[tuple[str, str], str]
    sizes: dict[tuple[str, str], tuple[float, float]]  # the smallest and largest buffer

    def chosen(self, engine: str, op: str) -> tuple[str, str] | None:
        """The fit `engine`'s `op` is timed with: its own runs', else every engine's, else
        (a kind not measured) the all-reduce's, else any."""
        for key in ((engine, op), ("", op), (engine, "all_reduce"), ("", "all_reduce")):
            if key in self.by_op:
                return key
        return next(iter(self.by_op), None)


def fit_links(samples: list[Sample], preset: Link, shares: dict[str, float]) -> LinkFit:
    """For each engine and kind of collective the runs timed, and for each kind over every
    engine's runs: latency and bus bandwidth fitted over the sizes measured
    (launcher.plan.comm's ring on one node), the preset scaled where the sizes cannot tell
    them apart (one size; a fit that would need a negative term). Each engine's own: a
    collective's measured time holds its wait for the slowest rank too, which differs from
    engine to engine (DeepSpeed's small all-reduces of norms and flags cost milliseconds on
    gloo where DDP's buckets of the same size cost a fraction). Of several runs of one size,
    the least disturbed (`least_disturbed`)."""
    fit = LinkFit({}, {}, {})
    samples = [s for s in samples if s.size >= SCALARS]
    groups = {(s.engine, s.op) for s in samples} | {("", s.op) for s in samples}
    for engine, op in sorted(groups):
        mine = least_disturbed([s for s in samples if s.op == op and engine in ("", s.engine)])
        steps = np.array([comm.ring_steps(op, s.ranks, 1)[0] for s in mine], dtype=float)
        moved = np.array([comm.traffic(op, s.size, s.ranks) for s in mine])
        seconds = np.array([s.seconds / shares[s.source] for s in mine])
        sources = ", ".join(sorted({Path(s.source).name for s in mine}))
        key, what = (engine, op), f"{op}{f' ({engine})' if engine else ''}"
        fit.sizes[key] = (min(s.size for s in mine), max(s.size for s in mine))
        distinct = np.linalg.matrix_rank(np.column_stack([steps, moved / moved.max()]), tol=1e-6)
        alpha, inverse = nnls(np.column_stack([steps, moved]), seconds) if distinct >= 2 else (0, 0)
        if alpha > 0 and inverse > 0:
            fit.by_op[key] = Link(f"{op} fitted", 1 / inverse, float(alpha), sources)
            fit.why[key] = (f"{what}: {alpha * 1e6:.3g} us a step, {1 / inverse / 1e9:.3g} "
                            f"GB/s, fitted to {len(mine)} size(s) in {sources}")  # fmt: skip
            continue
        factor = float(seconds.sum() / sum(steps * preset.alpha + moved / preset.busbw))
        fit.by_op[key] = Link(f"{op} scaled", preset.busbw / factor, preset.alpha * factor,
                              sources)  # fmt: skip
        fit.why[key] = (f"{what}: the {preset.name} preset scaled x{factor:.3g} to what "
                        f"{sources} measured (latency and bandwidth not told apart)")  # fmt: skip
    return fit


OPS = ("all_reduce", "all_gather", "reduce_scatter")


def least_disturbed(samples: list[Sample]) -> list[Sample]:
    """Of the samples of one size over as many ranks, the fastest (its share of cores
    counted out): a collective's time holds its wait for the slowest rank, which the link
    does not cause and which a busy machine makes large and random; the fastest run of a
    size is the nearest to the link's own time."""
    best: dict[tuple[int, int], Sample] = {}
    for s in samples:
        key = (s.ranks, round(s.size))
        if key not in best or s.seconds < best[key].seconds:
            best[key] = s
    return list(best.values())


def fitted_topology(topo: Topology, fit: LinkFit | None, engine: str = "") -> Topology:
    """`topo` with the links fitted for `engine` (LinkFit.chosen) in place of its
    intra-node preset."""
    if fit is None or not fit.by_op:
        return topo
    return replace(topo, by_op={op: fit.by_op[fit.chosen(engine, op)] for op in OPS})


@dataclass
class Calibration:
    """What measured runs (`--from`) say of the target's hardware: the compute model, the
    links per collective, the overlap, data wait and per-writer checkpoint speed."""

    records: list[RunRecord]
    compute: ComputeFit | None
    links: LinkFit | None
    overlaps: dict[str, float]  # each engine's median share of its collectives hidden
    data_wait_s: float | None  # a micro-step's (the loader hands out a micro-batch each)
    write_bytes_per_s: float | None
    ignored: list[str]  # runs on another kind of device than the target's
    startup_s: float | None = None  # the runs' median start-up: what a restart costs

    @property
    def sources(self) -> str:
        """The runs by their folders' names (basis["runs"] lists their paths)."""
        return ", ".join(Path(r.source).name for r in self.records)


def fit_runs(paths: list[Path], kind: str | None, preset: Link) -> Calibration:
    """The calibration from the runs `paths` stand for of a target with GPUs of `kind` (None:
    the CPU) whose links within a node are `preset`: the runs on that kind of device fit
    compute and links, the others are listed as not used."""
    records = read_runs(paths)
    same = [r for r in records if (r.device is None) == (kind is None)
            and (kind is None or kind in (r.device or ""))]  # fmt: skip
    ignored = [f"{r.source} ran on {r.device or 'the CPU'}" for r in records if r not in same]
    shares = {r.source: cpu_share(r.per_node, r.cores) if r.device is None else 1.0
              for r in same}  # fmt: skip
    compute = links = None
    if same:
        features = [features_of(r.shape, r.world_size) for r in same]
        compute = fit_compute(same, features)
        samples = [s for r in same for s in r.samples]
        links = fit_links(samples, preset, shares) if samples else None
    overlaps: dict[str, list[float]] = {}
    for r in same:
        if r.overlap is not None:
            overlaps.setdefault(r.engine, []).append(r.overlap)
    writes = [r.written / r.write_s for r in same if r.write_s and r.written]
    waits = [r.wait_s / r.shape.batch.accum for r in same]  # a micro-batch's
    startups = [r.startup_s for r in records if r.startup_s]  # any device's: the same imports
    return Calibration(
        same, compute, links, {e: statistics.median(v) for e, v in overlaps.items()},
        statistics.median(waits) if waits else None,
        statistics.median(writes) if writes else None, ignored,
        statistics.median(startups) if startups else None,
    )  # fmt: skip


def describe(cal: Calibration) -> str:
    """The calibration in words: each fitted coefficient, each link, the write speed."""
    parts = [compute_terms(cal.compute)] if cal.compute else []
    parts += list(cal.links.why.values()) if cal.links else []
    if cal.write_bytes_per_s:
        parts.append(f"checkpoints {cal.write_bytes_per_s / 1e6:.0f} MB/s a writing rank")
    return "; ".join(parts) + f" ({len(cal.records)} run(s): {cal.sources})"


def compute_terms(fit: ComputeFit) -> str:
    terms = ", ".join(_term(k, v) for k, v in sorted(fit.coef.items()))
    left = f"; not told apart by these runs: {', '.join(fit.left_out)}" if fit.left_out else ""
    return terms + left


def features_of(shape: RunShape, world_size: int) -> Features:
    """What the compute model reads of a run (or a plan) of `shape` at `world_size`."""
    state = memory.train_state(shape.cfg, world_size)
    return Features.of(shape, engine_label(shape.cfg), state["optimizer"])


def _term(name: str, value: float) -> str:
    kind, _, key = name.partition(":")
    if kind == "rate":
        return f"{value / 1e9:.3g} GFLOP/s ({key})"
    if kind == "optimizer":
        return f"{value * 1e9:.3g} ns an optimizer element"
    if kind == "scores":
        return f"{value * 1e12:.3g} ps an attention score"
    what = "a layer and micro-step" if kind == "micro" else "a step"
    return f"{value * 1e3:.3g} ms {what} ({key})"
