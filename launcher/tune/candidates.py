"""The analyser's findings -> the config changes worth a timed trial.

No candidate without evidence: each finding of launcher.analyze.advice (its `kind`) maps to
the knobs that address it, given the incumbent's settings, so a setting the run already has
is never proposed again, and a change the config would refuse (a micro-batch that does not
divide the global batch) is never proposed at all. Memory knobs (gradient checkpointing, a
smaller micro-batch) come only from memory pressure. Changes that alter the numbers the
model sees (precision, gradient compression, the micro-batch's rounding) are marked, so the
decision checks their loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from omegaconf import DictConfig

from launcher.analyze.advice import FUSED_ATTENTION, NEXT_COMPILE
from launcher.config.batch import BatchPlan
from launcher.config.registry import engine
from launcher.plan import comm
from launcher.plan.calibrate import fit_links, fitted_topology
from launcher.plan.forecast import backward_s
from launcher.plan.measured import RunRecord
from launcher.plan.presets import topology_for
from launcher.plan.shape import shape_of
from launcher.runtime.placement import ranks_per_node


@dataclass
class Candidate:
    """One change to try: config overrides (key -> value) and the finding behind it."""

    changes: dict[str, Any]
    evidence: str  # the advice kind that pointed here
    changes_math: bool = False
    predicted_exposed_s: float | None = None  # the plan's figure, for a bucket size

    @property
    def name(self) -> str:
        return ",".join(f"{k}={override_value(v)}" for k, v in self.changes.items())


def override_value(value: Any) -> str:
    """A value as a Hydra override writes it (true/false, 0.25, bf16)."""
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


def propose(advice: list[dict], cfg: DictConfig, world_size: int, gpu: bool,
            measured: RunRecord | None = None) -> list[Candidate]:  # fmt: skip
    """The candidates that `advice` (report.json's list) points at for the incumbent `cfg`,
    each once, in the order of the findings; none that changes a key in `tune.skip`.
    `measured`: the profiled incumbent's record (launcher.plan.measured.read_run), from
    which the plan sizes the gradient buckets."""
    rules = {
        "data_wait": _data_wait,
        "pageable_copies": _pinned,
        "exposed_comm": partial(_exposed_comm, measured=measured),
        "launch_bound": _launch_bound,
        "fp32_matmuls": _precision,
        "memory_bound": _memory_bound,
        "attention": _attention,
        "memory_pressure": _memory,
        "accumulation": _accumulation,
    }
    out: list[Candidate] = []
    for finding in advice:
        rule = rules.get(finding.get("kind", ""))
        for cand in rule(cfg, world_size, gpu) if rule else []:
            skipped = set(cand.changes) & set(cfg.tune.skip)
            if not skipped and all(cand.changes != c.changes for c in out):
                out.append(cand)
    return out


def _data_wait(cfg: DictConfig, world_size: int, gpu: bool) -> list[Candidate]:
    workers = int(cfg.data.num_workers)
    out = [Candidate({"data.num_workers": max(2, 2 * workers)}, "data_wait")]
    return out + _pinned(cfg, world_size, gpu, "data_wait")


def _pinned(cfg: DictConfig, world_size: int, gpu: bool, kind="pageable_copies"):
    """Pinned host memory only matters for copies to a GPU."""
    if not gpu or cfg.data.pin_memory:
        return []
    return [Candidate({"data.pin_memory": True}, kind)]


def _exposed_comm(cfg: DictConfig, world_size: int, gpu: bool,
                  measured: RunRecord | None = None) -> list[Candidate]:  # fmt: skip
    """What the engine offers against exposed communication: the bucket sizes the plan
    predicts to expose the least, then the engine's own (DDP: the two flags that save
    copies and re-planning, bf16 compression of the gradients)."""
    tuning = engine(cfg.strategy.name).tuning
    offered = tuning.candidates(cfg) if tuning else []
    return _bucket_sizes(cfg, world_size, gpu, measured) + [
        Candidate(changes, "exposed_comm", changes_math=m) for changes, m in offered
    ]


def _bucket_sizes(cfg: DictConfig, world_size: int, gpu: bool,
                  measured: RunRecord | None) -> list[Candidate]:  # fmt: skip
    """The plan's two best bucket sizes (launcher.plan.comm.bucket_sizes) on the links the
    profiled incumbent measured (launcher.plan.calibrate.fit_links), behind as much of
    backward as that run hid (none on a CPU, whose collectives take the cores' time even
    when they overlap): none without that run, or for an engine without buckets."""
    declared = engine(cfg.strategy.name)
    key = declared.tuning.bucket_key if declared.tuning else None
    if not key or world_size < 2 or not measured:
        return []
    nodes = max(1, world_size // ranks_per_node())
    topo = topology_for(str(cfg.nccl.name), nodes, world_size // nodes, gpu)
    if measured.samples:
        links = fit_links(measured.samples, topo.intra, {measured.source: 1.0})
        topo = fitted_topology(topo, links, measured.engine)
    shape = shape_of(cfg, world_size, measured.shape.vocab)  # the data's, as the run built it
    default = float(getattr(declared.schema(), key.rsplit(".", 1)[1]))
    # On CPUs the collectives share the cores that compute: hidden is not free there.
    backward = backward_s(shape, measured.compute_s) if gpu else 0.0
    if gpu and measured.overlap is not None:  # as much as hid in the profiled run
        rows = declared.plan.step_collectives(shape.cfg, shape.params, world_size)
        comm_s = comm.step_comm(shape.cfg, world_size, topo)["time_s"]
        exposed = (1 - measured.overlap) * comm_s
        backward = comm.hidden_window(rows, topo, backward, exposed)
    sizes = comm.bucket_sizes(shape.cfg, key, default, world_size, topo, backward)[:2]
    return [Candidate({key: mb}, "exposed_comm", predicted_exposed_s=s) for mb, s in sizes]


def _launch_bound(cfg: DictConfig, world_size: int, gpu: bool) -> list[Candidate]:
    out = []
    mode = NEXT_COMPILE.get(str(cfg.trainer.compile))
    if mode and engine(cfg.strategy.name).capabilities.compiles:
        out.append(Candidate({"trainer.compile": mode}, "launch_bound"))
    return out + _micro_batches(cfg, world_size, "launch_bound", [2])


def _memory_bound(cfg: DictConfig, world_size: int, gpu: bool) -> list[Candidate]:
    """Fuse the memory-bound kernels: compile, or (compiled already) the native GPT-2,
    whose loss runs inside the compiled region."""
    if str(cfg.trainer.compile) == "off" and engine(cfg.strategy.name).capabilities.compiles:
        return [Candidate({"trainer.compile": NEXT_COMPILE["off"]}, "memory_bound")]
    if cfg.model.impl == "hf" and not cfg.model.init_from:
        return [Candidate({"model.impl": "native"}, "memory_bound", changes_math=True)]
    return []


def _attention(cfg: DictConfig, world_size: int, gpu: bool) -> list[Candidate]:
    """SDPA's other fused kernels on a GPU (bf16/fp16 only: both refuse fp32 inputs)."""
    if not gpu or cfg.trainer.precision == "fp32":
        return []
    current = cfg.model.attention
    return [Candidate({"model.attention": k}, "attention") for k in FUSED_ATTENTION if k != current]


def _precision(cfg: DictConfig, world_size: int, gpu: bool) -> list[Candidate]:
    if cfg.trainer.precision in ("bf16", "fp16"):
        return []
    return [Candidate({"trainer.precision": "bf16"}, "fp32_matmuls", changes_math=True)]


def _memory(cfg: DictConfig, world_size: int, gpu: bool) -> list[Candidate]:
    out = []
    if not cfg.trainer.grad_checkpointing:
        out.append(Candidate({"trainer.grad_checkpointing": True}, "memory_pressure"))
    return out + _micro_batches(cfg, world_size, "memory_pressure", [0.5])


def _accumulation(cfg: DictConfig, world_size: int, gpu: bool) -> list[Candidate]:
    """4x the micro-batch, and the whole per-rank batch at once (no accumulation)."""
    if not isinstance(cfg.trainer.micro_batch_size, int):  # auto: the run finds its own
        return []
    batch = BatchPlan.of(cfg.trainer, world_size)
    return _micro_batches(cfg, world_size, "accumulation", [4, batch.accum])


def _micro_batches(cfg: DictConfig, world_size: int, kind: str, factors) -> list[Candidate]:
    """Micro-batch sizes `factors` x the current one that keep the global batch
    (BatchPlan's rule: it must still divide it over the ranks): the same sequences per
    step, accumulated differently."""
    if not isinstance(cfg.trainer.micro_batch_size, int):  # auto: the run finds its own
        return []
    batch = BatchPlan.of(cfg.trainer, world_size)
    out = []
    for factor in factors:
        micro = int(batch.micro_batch * factor)
        if micro < 1 or micro == batch.micro_batch or batch.with_micro_batch(micro).problem():
            continue
        change = {"trainer.micro_batch_size": micro}
        if all(c.changes != change for c in out):
            out.append(Candidate(change, kind, changes_math=True))
    return out
