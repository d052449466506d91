"""The experiment at its target scale, before it is submitted: memory, checkpoint budget,
step time, time and cost to the end, every figure marked measured or assumed.

Compute is the run's FLOPs over a rate (the device's peak x an MFU stated per device kind,
launcher.plan.presets), or, with `--from`, the compute model fitted to measured runs
(launcher.plan.calibrate: a rate per FLOP and each engine's fixed costs). Communication is
the engine's declared collectives on the links they cross (launcher.plan.comm), fitted per
collective size where runs measured them; on a GPU the part hidden behind backward is the
buckets' pipeline (or what the runs measured), on a CPU none (the collectives take the
cores that compute). docs/plan.md gives the formulas, their sources and the checks.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace

from omegaconf import OmegaConf

from launcher.config import compose
from launcher.config.registry import engine
from launcher.plan import comm, goodput, memory, stop
from launcher.plan import host as host_memory
from launcher.plan.calibrate import (
    REACH,
    Calibration,
    LinkFit,
    compute_terms,
    cpu_share,
    features_of,
    fit_runs,
    fitted_topology,
)
from launcher.plan.measured import engine_label, writes_of
from launcher.plan.presets import DEFAULT_DEVICE, DEVICES, Device, Topology, topology_for
from launcher.plan.shape import RunShape, shape_of

ENGINES = (  # the engines and ZeRO stages set beside the configured one
    ("ddp", ["strategy=ddp"]),
    ("fsdp2", ["strategy=fsdp2"]),
    ("zero1", ["strategy=zero1"]),
    ("zero2", ["strategy=zero2"]),
    ("zero3", ["strategy=zero3"]),
)


@dataclass
class Target:
    """Where the job will run."""

    nodes: int
    per_node: int
    on_gpu: bool
    device: Device | None
    topology: Topology
    cores: int | None = None  # a CPU job's cores per node
    basis: dict = field(default_factory=dict)
    overlap: float | None = None  # given by hand (--overlap)

    @property
    def world_size(self) -> int:
        return self.nodes * self.per_node


def target_of(cfg) -> Target:
    """The cluster section's job shape: nodes x processes per node, GPUs or not, the GPU
    kind (cluster.gpu_type; assumed H100 when not given), the links its `nccl` preset and
    node count imply; a CPU job runs on this machine's cores (assumed)."""
    c = cfg.cluster
    gpus = int(c.gpus_per_node)
    procs = int(c.procs_per_node) if c.procs_per_node is not None else (gpus or 1)
    on_gpu = gpus > 0
    basis = {}
    device, cores = None, None
    if on_gpu:
        kind = str(c.gpu_type or DEFAULT_DEVICE)
        device = DEVICES.get(kind)
        if device is None:
            raise ValueError(f"cluster.gpu_type={kind}: the plan knows {', '.join(DEVICES)}")
        given = f"cluster.gpu_type={kind}" if c.gpu_type else f"{kind}, cluster.gpu_type not given"
        basis["device"] = _basis(False, given)
    else:
        cores = os.cpu_count() or 1
        basis["device"] = _basis(False, f"CPU: this machine's {cores} cores a node")
    topo = topology_for(str(cfg.nccl.name), int(c.nodes), procs, on_gpu)
    basis["link"] = _basis(False, _links_why(topo))
    return Target(int(c.nodes), procs, on_gpu, device, topo, cores, basis)


def _links_why(topo: Topology) -> str:
    links = [topo.intra] + ([topo.inter] if topo.nodes > 1 and topo.inter else [])
    return "; ".join(f"{link.name} {link.busbw / 1e9:g} GB/s, {link.alpha * 1e6:g} us a step "
                     f"({link.source})" for link in links)  # fmt: skip


def given(target: Target, mfu: float | None = None, busbw_gbps: float | None = None,
          overlap: float | None = None) -> Target:  # fmt: skip
    """`target` with the device's MFU, the links' bus bandwidth, or the overlap given by
    hand (the plan's flags), each marked so in the basis."""
    if mfu is not None and target.device is not None:
        target.device = replace(target.device, mfu=mfu, source=f"--mfu {mfu:g}, given")
    if busbw_gbps is not None:
        source = f"--busbw-gbps {busbw_gbps:g}, given"
        topo = target.topology
        inter = replace(topo.inter, busbw=busbw_gbps * 1e9, source=source) if topo.inter else None
        target.topology = replace(topo, intra=replace(topo.intra, busbw=busbw_gbps * 1e9,
                                                      source=source), inter=inter)  # fmt: skip
        target.basis["link"] = _basis(False, _links_why(target.topology))
    target.overlap = overlap
    return target


def _basis(measured: bool, why: str) -> dict:
    return {"measured": measured, "why": why}


def calibration(paths: list[Path], target: Target) -> Calibration:
    """`target` calibrated on the runs `paths` stand for (launcher.plan.calibrate)."""
    kind = target.device.name if target.device else None
    return fit_runs(paths, kind, target.topology.intra)


def checkpoint_bytes(cfg, world_size: int, shape: RunShape | None = None) -> dict[str, int]:
    """One durable checkpoint: the largest writer's bytes, every rank's together, and how
    many ranks write (`cfg` checked; its vocabulary the data's unless `shape` says)."""
    shape = shape or shape_of(cfg, world_size)
    writes = writes_of(shape, world_size)
    return {"per_rank": max(writes), "total": sum(writes),
            "writers": sum(1 for w in writes if w)}  # fmt: skip


def build(
    shape: RunShape,
    target: Target,
    cal: Calibration | None = None,
    restarts: int | None = None,
    engines: bool = True,
    start_step: int = 0,
) -> dict:
    """The plan of the run `shape` on `target` (plan.json's content); `start_step`: the
    steps a resumed run has done already (its totals are over the steps left)."""
    cfg, world, procs = shape.cfg, target.world_size, target.per_node
    t, batch = cfg.trainer, shape.batch
    basis = dict(target.basis)
    basis["vocabulary"] = _basis(shape.vocab.known, f"{shape.vocab.size:,} ids: {shape.vocab.why}")
    device = memory.device_per_rank(cfg, world, target.on_gpu)
    by_engine = {}
    for name, overrides in ENGINES if engines else ():
        other = memory.device_per_rank(_with(cfg, overrides), world, target.on_gpu)
        state = sum(other[k] for k in ("weights", "grads", "optimizer"))
        by_engine[name] = {"state_bytes": state, "total_bytes": other["total"]}
    host = host_memory.host_per_node(cfg, procs, world, target.on_gpu, restarts)
    basis["host_memory"] = _basis(not target.on_gpu, host_memory.basis(target.on_gpu))
    basis["memory"] = _basis(
        False,
        "the engine's state by its declaration; activations 34 x seq x micro x width bytes a "
        "layer (24 compiled; Korthikanti et al. 2022), the logits 12 x seq x micro x "
        f"vocabulary (4 compiled); headroom {memory.HEADROOM:.0%} + 1 GB a GPU rank",
    )
    mem = {
        "gpu_per_rank_bytes": device["total"] if target.on_gpu else None,
        "gpu_per_rank": device,
        "device_memory_bytes": target.device.memory_bytes if target.device else None,
        "fits": device["total"] <= target.device.memory_bytes if target.device else None,
        "by_engine": by_engine,
        "host_per_node_bytes": host["total"],
        "host_per_node": host,
        "shm_per_node_bytes": host["shm"],
    }

    writes = writes_of(shape, world)
    rate, basis["checkpoint.write_s"] = _write_rate(cfg, cal)
    write_s = max(writes) / rate

    if cal:
        ignored = f"; not used: {', '.join(cal.ignored)}" if cal.ignored else ""
        runs = ", ".join(r.source for r in cal.records)
        basis["runs"] = _basis(True, f"--from: {runs}{ignored}")
    share = cpu_share(procs, target.cores) if not target.on_gpu else 1.0
    compute, basis["step.compute_s"] = _compute(shape, target, cal)
    label = engine_label(cfg)
    topo = fitted_topology(target.topology, cal.links if cal else None, label)
    comms = comm.step_comm(cfg, world, topo)
    if cal and cal.links:
        used = dict.fromkeys(cal.links.chosen(label, c["op"]) for c in comms["collectives"])
        far = _beyond(comms["collectives"], cal.links, label)
        basis["link"] = _basis(True, "; ".join(cal.links.why[k] for k in used if k) + far)
    comm_s = comms["time_s"] * share  # ranks sharing cores: each step waits for both ends
    if share > 1 and compute is not None:
        compute *= share  # each rank has 1/share of a core to compute on
        link, why = basis["link"], basis["step.compute_s"]
        shared = f"x{share:g}: {procs} ranks on {target.cores} cores"
        basis["link"] = _basis(link["measured"], f"{link['why']}; {shared} (a ring's steps "
                               "wait for both ends to be scheduled)")  # fmt: skip
        basis["step.compute_s"] = _basis(why["measured"], f"{why['why']}; {shared} (a rank "
                                         "computes on its share of a core)")  # fmt: skip
    wait = cal.data_wait_s * batch.accum if cal and cal.data_wait_s is not None else 0.0
    if cal and cal.data_wait_s is not None:
        basis["step.data_wait_s"] = _basis(
            True, f"{cal.data_wait_s * 1e3:.3g} ms a micro-step, the median of {cal.sources}"
        )
    overlap, step = None, None
    basis["step.overlap"] = _basis(False, "no compute rate to hide the communication behind")
    if compute is not None:
        overlap = _overlap(shape, target, cal, comms, topo, compute, basis)
        exposed = comm_s * (1 - overlap)
        time_s = compute + exposed + wait
        peak = target.device.peak_flops if target.device else None
        fpt = shape.flops_per_token
        step = {
            "time_s": time_s,
            "compute_s": compute,
            "comm_s": comm_s,
            "comm_exposed_s": exposed,
            "comm_share": exposed / time_s,
            "data_wait_s": wait,
            "tokens_per_s": batch.tokens_per_step / time_s,
            "mfu": batch.tokens_per_step / time_s * fpt / (peak * world) if peak else None,
        }
    steps = max(0, int(t.max_steps) - start_step)
    startup_s = cal.startup_s if cal else None
    good = goodput.forecast(cfg, target.nodes, procs, target.on_gpu, write_s,
                            step["time_s"] if step else None, startup_s, restarts)  # fmt: skip
    totals = None
    if step:
        saves = goodput.saves(good, int(t.max_steps), start_step)
        time_s = steps * step["time_s"] + saves * write_s
        hours = time_s * world / 3600 if target.on_gpu else None
        cost = cfg.cluster.gpu_hour_cost
        totals = {
            "steps": steps,
            "start_step": start_step,
            "tokens": steps * batch.tokens_per_step,
            "time_s": time_s,
            "gpu_hours": hours,
            "cost": hours * float(cost) if hours is not None and cost is not None else None,
        }
    return {
        "job": {
            "model": str(cfg.model.name),
            "parameters": shape.params,
            "vocabulary": shape.vocab.size,
            "strategy": str(cfg.strategy.name),
            "nodes": target.nodes,
            "procs_per_node": procs,
            "world_size": world,
            "device": target.device.name if target.device else "cpu",
            "link": topo.describe(),
            "global_batch": batch.global_batch,
            "micro_batch": batch.micro_batch,
            "accum": batch.accum,
            "seq_len": batch.seq_len,
            "grad_checkpointing": bool(t.grad_checkpointing),
            "compile": str(t.compile),
            "tokens_per_step": batch.tokens_per_step,
            "flops_per_token": shape.flops_per_token,
            "notes": list(shape.notes),
        },
        "memory": mem,
        "checkpoint": {
            "bytes_per_rank": max(writes),
            "bytes_total": sum(writes),
            "writers": sum(1 for w in writes if w),
            "write_s": write_s,
            "stop": {
                "write_s": write_s,
                "step_s": step["time_s"] if step else None,
                "by_backend": stop.budgets(cfg, write_s, step["time_s"] if step else None),
            },
        },
        "step": {
            **(step or {"time_s": None, "tokens_per_s": None, "comm_s": comm_s}),
            "collectives": comms["collectives"],
            "overlap": overlap,
        },  # fmt: skip
        "totals": totals
        or {
            "steps": steps,
            "start_step": start_step,
            "time_s": None,
            "gpu_hours": None,
        },  # fmt: skip
        "goodput": good,
        "basis": basis,
    }


def _beyond(collectives: list[dict], links: LinkFit, engine: str) -> str:
    """The collectives of the plan whose buffers are beyond REACH x the sizes measured for
    the fit that times them, said as extrapolated."""
    far = []
    for c in collectives:
        key = links.chosen(engine, c["op"])
        low, high = links.sizes[key]
        if key[1] != c["op"]:
            far.append(f"{c['op']}: timed as {key[1]}, which no run measured")
        elif not low / REACH <= c["bytes"] <= high * REACH:
            far.append(f"{c['op']} of {c['bytes']:,} bytes (measured {low:,.0f}-{high:,.0f})")
    return f"; EXTRAPOLATED: {', '.join(dict.fromkeys(far))}" if far else ""


def _with(cfg, overrides: list[str]):
    """`cfg` (its model, trainer and data) under another engine at its defaults."""
    other = _engine_defaults(tuple(overrides))
    return SimpleNamespace(model=cfg.model, trainer=cfg.trainer, data=cfg.data, strategy=other)


@functools.cache
def _engine_defaults(overrides: tuple[str, ...]):
    """An engine's section at its defaults (composed once: every plan sets them beside)."""
    return OmegaConf.create(OmegaConf.to_container(compose(list(overrides)).strategy))


def _compute(shape: RunShape, target: Target,
             cal: Calibration | None) -> tuple[float | None, dict]:  # fmt: skip
    """One rank's compute seconds a step, and what it rests on: the model fitted to the
    runs of `--from`, else the device's peak x its MFU."""
    if cal and cal.compute:
        x = features_of(shape, target.world_size)
        seconds, notes = cal.compute.predict(x)
        if seconds is not None:
            far = f"; EXTRAPOLATED: {'; '.join(notes)}" if notes else ""
            return seconds, _basis(
                True, f"fitted to {len(cal.records)} run(s) ({cal.sources}): "
                f"{compute_terms(cal.compute)}{far}"
            )  # fmt: skip
    if target.device:
        d = target.device
        seconds = shape.flops_per_rank_step / (d.peak_flops * d.mfu)
        return seconds, _basis(
            False, f"MFU {d.mfu:.1%} of {d.name}'s {d.peak_flops / 1e12:.0f} TFLOP/s ({d.source})"
        )
    return None, _basis(False, "no known peak FLOP/s on the CPU: give --from a measured run")


def backward_s(shape: RunShape, compute_s: float) -> float:
    """One micro-step's backward on a rank: the window the gradient collectives can hide
    in (they go out on the last micro-step only). Backward is two thirds of the 6N FLOPs a
    token; with gradient checkpointing it runs the forward again, the whole of a
    micro-step's compute."""
    micro_step = compute_s / shape.batch.accum
    return micro_step * (3 / 4 if shape.cfg.trainer.grad_checkpointing else 2 / 3)


def _overlap(shape: RunShape, target: Target, cal: Calibration | None, comms: dict,
             topo: Topology, compute: float, basis: dict) -> float:  # fmt: skip
    """The share of the step's communication hidden: given (--overlap); what the engine's
    runs of --from measured (an engine that prefetches, ZeRO-3, hides most of its gathers
    even on a CPU; DDP's buckets on gloo hide nothing); else on a GPU the bucket pipeline's
    over backward, on a CPU none (gloo's collectives take the cores that compute)."""
    if target.overlap is not None:
        basis["step.overlap"] = _basis(False, "--overlap, given")
        return target.overlap
    label = engine_label(shape.cfg)
    measured = cal.overlaps.get(label) if cal else None
    if measured is not None:
        basis["step.overlap"] = _basis(True, f"{measured:.0%}, the median of {label}'s runs in "
                                       f"{cal.sources}")  # fmt: skip
        return measured
    if not target.on_gpu:
        basis["step.overlap"] = _basis(False, "none: on a CPU the collectives take the cores "
                                       "that compute")  # fmt: skip
        return 0.0
    rows = [(c["op"], c["bytes"], c["times"]) for c in comms["collectives"]]
    backward = backward_s(shape, compute)
    exposed = comm.exposed_s(rows, topo, backward)
    basis["step.overlap"] = _basis(
        False, f"the collectives as a pipeline over a {backward * 1e3:.3g} ms backward "
        "(buckets ready at an even rate, one at a time)"
    )  # fmt: skip
    return 1.0 - exposed / comms["time_s"] if comms["time_s"] else 1.0


def _write_rate(cfg, cal: Calibration | None) -> tuple[float, dict]:
    """Bytes a second one writing rank reaches: measured by the runs' last checkpoints
    (their largest writer's bytes over the write's time), else the backend's configured
    figure; the checkpoint takes as long as its largest writer."""
    if cal and cal.write_bytes_per_s:
        return cal.write_bytes_per_s, _basis(
            True, f"{cal.write_bytes_per_s / 1e6:.0f} MB/s a writing rank, the median of the "
            f"last checkpoints of {cal.sources}; the largest writer's share of it"
        )  # fmt: skip
    # the chosen backend's figure, where its section has one; else (cluster=local) Slurm's
    name = str(cfg.cluster.name)
    name = name if hasattr(getattr(cfg.cluster, name, None), "checkpoint_write_mb_s") else "slurm"
    rate = float(getattr(cfg.cluster, name).checkpoint_write_mb_s)
    return rate * 1e6, _basis(
        False, f"cluster.{name}.checkpoint_write_mb_s={rate:g} a writing rank (configured); "
        "the largest writer's share of it"
    )  # fmt: skip


def at_start(cfg, world_size: int, ranks_per_node: int, device_name: str | None,
             vocab_size: int, run_dir: Path, start_step: int = 0) -> dict:  # fmt: skip
    """The forecast a run prints as it starts and summary.json keeps beside what the run
    measured: step time, tokens/s, time and GPU-hours over the steps left, from the
    device's stated MFU, or from what this run directory measured before (a resumed run)."""
    device = next((d for k, d in DEVICES.items() if device_name and k in device_name), None)
    nodes = max(1, world_size // ranks_per_node)
    on_gpu = device_name is not None
    topo = topology_for(str(cfg.nccl.name), nodes, ranks_per_node, on_gpu)
    cores = None if on_gpu else os.cpu_count() or 1
    link = {"link": _basis(False, _links_why(topo))}
    target = Target(nodes, ranks_per_node, on_gpu, device, topo, cores, link)
    declared = engine(str(cfg.strategy.name))
    if declared.plan is None:
        return _no_forecast(f"strategy={cfg.strategy.name} declares no Plan")
    from launcher.data.vocab import Vocabulary

    shape = shape_of(cfg, world_size, Vocabulary(vocab_size, "the run's tokenizer", True))
    cal = None
    if (Path(run_dir) / "summary.json").is_file():
        try:
            cal = calibration([Path(run_dir)], target)
        except ValueError as exc:  # a damaged summary of an earlier launch: said, not used
            return _no_forecast(str(exc))
    plan = build(shape, target, cal, engines=False, start_step=start_step)
    step, totals = plan["step"], plan["totals"]
    return {
        "step_time_s": step.get("time_s"),
        "tokens_per_s": step.get("tokens_per_s"),
        "mfu": step.get("mfu"),
        "steps": totals.get("steps"),
        "time_s": totals.get("time_s"),
        "gpu_hours": totals.get("gpu_hours"),
        "basis": plan["basis"]["step.compute_s"]["why"],
    }


def _no_forecast(why: str) -> dict:
    return {"step_time_s": None, "tokens_per_s": None, "mfu": None, "steps": None,
            "time_s": None, "gpu_hours": None, "basis": why}  # fmt: skip


def line(forecast: dict) -> str:
    """The forecast in one line of the run's log."""
    if not forecast["step_time_s"]:
        return f"plan: no step-time forecast ({forecast['basis']})"
    hours = f", {forecast['gpu_hours']:,.2f} GPU-hours" if forecast["gpu_hours"] else ""
    return (
        f"plan: step {forecast['step_time_s'] * 1e3:,.1f} ms, "
        f"{forecast['tokens_per_s']:,.0f} tokens/s, {forecast['time_s'] / 60:,.1f} min for "
        f"the {forecast['steps']} steps left{hours} ({forecast['basis']}; python -m "
        "launcher.plan for the whole plan)"
    )
