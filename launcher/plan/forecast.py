"""The experiment at its target scale, before it is submitted: memory, checkpoint budget,
step time, time and cost to the end, every figure marked measured or assumed.

Compute time is tokens x FLOPs per token over a FLOP rate: the device's peak x an MFU that
is stated per device kind (launcher.plan.presets) or measured by `--from RUN_DIR`, a run on
the target hardware (its compute rate: the step's time less its exposed communication and
data wait). Communication is the engine's declared collectives on the link's alpha-beta
model (launcher.plan.comm), of which the exposed part is (1 - overlap); the overlap, the
link's bandwidth and the checkpoint write speed are measured by `--from` where its run
recorded them, the overlap otherwise modelled as the buckets' pipeline over backward.
docs/plan.md gives the formulas, their sources and the checks.
"""

from __future__ import annotations

import contextlib
import copy
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace

from launcher.checkpoint.protocol import find_resumable, read_meta
from launcher.config import compose
from launcher.config.model_shape import param_count, shape_flops_per_token
from launcher.config.registry import engine
from launcher.data.tokenizer import TOKENIZER_DIR, saved_vocab_size
from launcher.plan import comm, goodput, memory, stop
from launcher.plan import host as host_memory
from launcher.plan.presets import DEFAULT_DEVICE, DEVICES, Device, Link, link_for

ENGINES = (  # the engines and ZeRO stages set beside the configured one
    ("ddp", ["strategy=ddp"]),
    ("fsdp2", ["strategy=fsdp2"]),
    ("zero1", ["strategy=zero1"]),
    ("zero2", ["strategy=zero2"]),
    ("zero3", ["strategy=zero3"]),
)


@dataclass
class Measured:
    """What a finished run measured (`--from RUN_DIR`), per figure None where it did not."""

    source: str
    world_size: int
    flops_per_s: float | None = None  # compute FLOP/s of one rank
    overlap: float | None = None
    busbw: float | None = None  # bytes/s: the all-reduces' effective bus bandwidth
    comm_bytes: float | None = None  # all-reduced bytes a step (comm/bytes)
    collectives: int | None = None  # all-reduces a step (comm/buckets)
    data_wait_s: float | None = None
    write_bytes_per_s: float | None = None
    device: str | None = None
    vocab_size: int | None = None  # the tokenizer's, as its checkpoints record the model
    startup_s: float | None = None  # from its process's start to its first step: a restart's


@dataclass
class Target:
    """Where the job will run."""

    nodes: int
    procs_per_node: int
    on_gpu: bool
    device: Device | None
    link: Link
    basis: dict = field(default_factory=dict)
    overlap: float | None = None  # given by hand (--overlap)

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node


def target_of(cfg) -> Target:
    """The cluster section's job shape: nodes x processes per node, GPUs or not, the GPU
    kind (cluster.gpu_type; assumed H100 when not given) and the link its `nccl` preset or
    node count implies."""
    c = cfg.cluster
    gpus = int(c.gpus_per_node)
    procs = int(c.procs_per_node) if c.procs_per_node is not None else (gpus or 1)
    on_gpu = gpus > 0
    basis = {}
    device = None
    if on_gpu:
        kind = str(c.gpu_type or DEFAULT_DEVICE)
        device = DEVICES.get(kind)
        if device is None:
            known = ", ".join(DEVICES)
            raise ValueError(f"cluster.gpu_type={kind}: the plan knows {known}")
        given = f"cluster.gpu_type={kind}" if c.gpu_type else f"{kind}, cluster.gpu_type not given"
        basis["device"] = _basis(False, given)
    link = link_for(str(cfg.nccl.name), int(c.nodes), on_gpu)
    basis["link"] = _basis(False, f"{link.name}: {link.source}")
    return Target(int(c.nodes), procs, on_gpu, device, link, basis)


def given(target: Target, mfu: float | None = None, busbw_gbps: float | None = None,
          overlap: float | None = None) -> Target:  # fmt: skip
    """`target` with the device's MFU, the link's bus bandwidth, or the overlap given by hand
    (the plan's flags), each marked so in the basis."""
    if mfu is not None and target.device is not None:
        target.device = replace(target.device, mfu=mfu, source=f"--mfu {mfu:g}, given")
    if busbw_gbps is not None:
        target.link = replace(target.link, busbw=busbw_gbps * 1e9,
                              source=f"--busbw-gbps {busbw_gbps:g}, given")  # fmt: skip
        target.basis["link"] = _basis(False, f"{target.link.name}: {target.link.source}")
    target.overlap = overlap
    return target


def _basis(measured: bool, why: str) -> dict:
    return {"measured": measured, "why": why}


def measured_from(run_dir: Path) -> Measured:
    """The figures a finished run recorded: summary.json, config.yaml's shape, env.json's
    device, its last checkpoint's write time and size."""
    run_dir = Path(run_dir)
    summary = _json(run_dir / "summary.json")
    world = int(summary.get("world_size") or 1)
    out = Measured(str(run_dir), world)
    step = summary.get("step_time_s/p50")
    exposed = summary.get("comm/exposed_s") or 0.0
    wait = summary.get("data_wait_s") or 0.0
    tokens = summary.get("tokens_per_s")
    fpt = summary.get("flops_per_token")
    if step and tokens and fpt:
        tokens_per_rank_step = tokens * step / world
        compute = max(step - exposed - wait, 1e-9)
        out.flops_per_s = tokens_per_rank_step * fpt / compute
        out.data_wait_s = wait
    reduce = summary.get("comm/allreduce_s")
    if reduce:
        out.overlap = max(0.0, 1.0 - exposed / reduce)
    if summary.get("comm/busbw_gbps"):
        out.busbw = float(summary["comm/busbw_gbps"]) * 1e9
        out.comm_bytes = summary.get("comm/bytes")
        out.collectives = summary.get("comm/buckets")
    out.startup_s = summary.get("startup_s")
    env = _json(run_dir / "env.json")
    devices = env.get("devices") or []
    out.device = devices[0].get("name") if devices and isinstance(devices[0], dict) else None
    last = find_resumable(run_dir)
    meta = (read_meta(last) or {}) if last else {}
    out.vocab_size = (meta.get("model") or {}).get("vocab_size") or saved_vocab_size(
        run_dir / TOKENIZER_DIR
    )
    if meta.get("write_s"):
        size = sum(int(n) for n in (meta.get("files") or {}).values())
        out.write_bytes_per_s = size / float(meta["write_s"])
    return out


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot be read as a run's JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    return data


def checkpoint_bytes(cfg, world_size: int) -> dict[str, int]:
    """Bytes of one durable checkpoint, as the engine declares them: the largest rank's
    share (DDP's rank 0 writes the whole model and optimizer; a sharded engine's ranks their
    shards, ZeRO's rank 0 the module too), and every rank's together."""
    declared = engine(cfg.strategy.name)
    params = param_count(cfg.model)
    if declared.memory_checkpoint is None or declared.plan is None:
        return {"per_rank": params * 12, "total": params * 12}  # an added engine: the state
    return {
        "per_rank": declared.memory_checkpoint.size(cfg, params, world_size),
        "total": declared.plan.checkpoint_total(cfg, params, world_size),
    }


def build(cfg, target: Target, measured: Measured | None = None, restarts: int | None = None,
          vocab_size: int | None = None, engines: bool = True) -> dict:  # fmt: skip
    """The plan of `cfg` on `target` (plan.json's content). `vocab_size`: the tokenizer's,
    where model.vocab_size leaves it to the data (else a measured run's, else GPT-2's)."""
    vocab_size = vocab_size or (measured.vocab_size if measured else None)
    if vocab_size and cfg.model.vocab_size is None:
        cfg = copy.deepcopy(cfg)
        cfg.model.vocab_size = int(vocab_size)
    world, procs = target.world_size, target.procs_per_node
    t = cfg.trainer
    basis = dict(target.basis)
    params = param_count(cfg.model)
    micro = memory.micro_batch(cfg, world)
    accum = max(1, int(t.global_batch_size) // (micro * world))
    tokens_step = int(t.global_batch_size) * int(t.seq_len)
    fpt = shape_flops_per_token(cfg.model, int(t.seq_len))

    device = memory.device_per_rank(cfg, world, target.on_gpu)
    by_engine = {}
    for name, overrides in ENGINES if engines else ():
        other = memory.device_per_rank(_with(cfg, overrides), world, target.on_gpu)
        state = sum(other[k] for k in ("weights", "grads", "optimizer"))
        by_engine[name] = {"state_bytes": state, "total_bytes": other["total"]}
    host = host_memory.host_per_node(cfg, procs, world, target.on_gpu, restarts)
    basis["host_memory"] = _basis(not target.on_gpu, host_memory.basis(target.on_gpu))
    basis["memory"] = _basis(False, "the engine's state by its declaration; activations "
                             "34 x seq x micro x width bytes a layer (Korthikanti et al. 2022); "
                             f"headroom {memory.HEADROOM:.0%} + 1 GB a GPU rank")  # fmt: skip
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

    ckpt = checkpoint_bytes(cfg, world)
    rate, rate_why = _write_rate(cfg, measured)
    basis["checkpoint.write_s"] = rate_why
    write_s = ckpt["total"] / rate

    flops, flops_why = _flop_rate(target, measured)
    basis["step.compute_s"] = flops_why
    link = measured_link(target.link, measured, basis)
    comms = comm.step_comm(cfg, world, link)
    wait = measured.data_wait_s if measured and measured.data_wait_s is not None else 0.0
    overlap, step = None, None
    basis["step.overlap"] = _basis(False, "no compute rate to hide the communication behind")
    if flops:
        compute = tokens_step / world * fpt / flops
        if t.grad_checkpointing:
            compute *= 4 / 3  # the forward again in backward
        overlap = _overlap(target, measured, comms, link, backward_s(cfg, world, flops), basis)
        exposed = comms["time_s"] * (1 - overlap)
        time_s = compute + exposed + wait
        tokens_per_s = tokens_step / time_s
        peak = target.device.peak_flops if target.device else None
        step = {
            "time_s": time_s,
            "compute_s": compute,
            "comm_s": comms["time_s"],
            "comm_exposed_s": exposed,
            "comm_share": exposed / time_s,
            "data_wait_s": wait,
            "tokens_per_s": tokens_per_s,
            "mfu": tokens_per_s * fpt / (peak * world) if peak else None,
        }
    steps = int(t.max_steps)
    good = goodput.forecast(cfg, target.nodes, procs, target.on_gpu, write_s,
                            step["time_s"] if step else None,
                            measured.startup_s if measured else None, restarts)  # fmt: skip
    totals = None
    if step:
        saves = goodput.saves(good, steps)
        time_s = steps * step["time_s"] + saves * write_s
        hours = time_s * world / 3600 if target.on_gpu else None
        cost = cfg.cluster.gpu_hour_cost
        totals = {
            "steps": steps,
            "tokens": steps * tokens_step,
            "time_s": time_s,
            "gpu_hours": hours,
            "cost": hours * float(cost) if hours is not None and cost is not None else None,
        }
    return {
        "job": {
            "model": str(cfg.model.name),
            "parameters": params,
            "strategy": str(cfg.strategy.name),
            "nodes": target.nodes,
            "procs_per_node": procs,
            "world_size": world,
            "device": target.device.name if target.device else "cpu",
            "link": link.name,
            "global_batch": int(t.global_batch_size),
            "micro_batch": micro,
            "accum": accum,
            "seq_len": int(t.seq_len),
            "grad_checkpointing": bool(t.grad_checkpointing),
            "tokens_per_step": tokens_step,
            "flops_per_token": fpt,
        },
        "memory": mem,
        "checkpoint": {
            "bytes_per_rank": ckpt["per_rank"],
            "bytes_total": ckpt["total"],
            "write_s": write_s,
            "stop": {
                "write_s": write_s,
                "step_s": step["time_s"] if step else None,
                "by_backend": stop.budgets(cfg, write_s, step["time_s"] if step else None),
            },
        },
        "step": {
            **(step or {"time_s": None, "tokens_per_s": None, "comm_s": comms["time_s"]}),
            "collectives": comms["collectives"],
            "overlap": overlap,
        },  # fmt: skip
        "totals": totals or {"steps": steps, "time_s": None, "gpu_hours": None},
        "goodput": good,
        "basis": basis,
    }


def _with(cfg, overrides: list[str]):
    """`cfg` (its model, trainer and data) under another engine at its defaults."""
    other = compose(overrides).strategy
    return SimpleNamespace(model=cfg.model, trainer=cfg.trainer, data=cfg.data, strategy=other)


def measured_link(link: Link, measured: Measured | None, basis: dict | None = None) -> Link:
    """`link` as a run on it measured it: its alpha and bandwidth scaled to the run's
    all-reduces (launcher.plan.comm.fitted), or, where the run did not record its layout,
    the run's bus bandwidth in place of the preset's."""
    if not measured or not measured.busbw or measured.world_size < 2:
        return link
    source = f"measured in {measured.source}"
    if measured.comm_bytes and measured.collectives:
        link = comm.fitted(link, measured.busbw, measured.comm_bytes, int(measured.collectives),
                           measured.world_size, source)  # fmt: skip
        why = (
            f"alpha {link.alpha * 1e6:.3g} us, bus bandwidth {link.busbw / 1e9:.3g} GB/s: the "
            f"preset scaled to the {measured.collectives} all-reduce(s) a step {source}"
        )
    else:
        link = replace(link, busbw=measured.busbw, source=source)
        why = f"bus bandwidth {measured.busbw / 1e9:.3g} GB/s {source}"
    if basis is not None:
        basis["link"] = _basis(True, why)
    return link


def backward_s(cfg, world_size: int, flops_per_s: float) -> float:
    """One micro-step's backward on a rank: the window the gradient collectives can hide
    in (they go out on the last micro-step only). Backward is two thirds of the 6N FLOPs a
    token; with gradient checkpointing it runs the forward again, the whole of them."""
    micro = memory.micro_batch(cfg, world_size)
    t = cfg.trainer
    whole = micro * int(t.seq_len) * shape_flops_per_token(cfg.model, int(t.seq_len)) / flops_per_s
    return whole if t.grad_checkpointing else whole * 2 / 3


def _overlap(target: Target, measured: Measured | None, comms: dict, link: Link,
             backward: float, basis: dict) -> float:  # fmt: skip
    """The share of the step's communication hidden behind backward: given (--overlap),
    measured by the run of --from, else the bucket pipeline's (launcher.plan.comm)."""
    if target.overlap is not None:
        basis["step.overlap"] = _basis(False, "--overlap, given")
        return target.overlap
    if measured and measured.overlap is not None:
        basis["step.overlap"] = _basis(True, f"measured in {measured.source}")
        return measured.overlap
    rows = [(c["op"], c["bytes"], c["times"]) for c in comms["collectives"]]
    backward = backward if target.on_gpu else 0.0  # CPU collectives take the cores' time
    exposed = comm.exposed_s(rows, target.world_size, link, backward)
    basis["step.overlap"] = _basis(
        False, f"the collectives as a pipeline over a {backward * 1e3:.3g} ms backward "
        "(buckets ready at an even rate, one at a time)"
    )  # fmt: skip
    return 1.0 - exposed / comms["time_s"] if comms["time_s"] else 1.0


def _flop_rate(target: Target, measured: Measured | None) -> tuple[float | None, dict]:
    """One rank's compute FLOP/s: measured by a run, else the device's peak x its MFU."""
    if measured and measured.flops_per_s:
        return measured.flops_per_s, _basis(
            True, f"{measured.flops_per_s / 1e12:.3g} TFLOP/s a rank computing, measured in "
            f"{measured.source}"
        )  # fmt: skip
    if target.device:
        d = target.device
        return d.peak_flops * d.mfu, _basis(
            False, f"MFU {d.mfu:.0%} of {d.name}'s {d.peak_flops / 1e12:.0f} TFLOP/s ({d.source})"
        )
    return None, _basis(False, "no known peak FLOP/s on the CPU: give --from a measured run")


def _write_rate(cfg, measured: Measured | None) -> tuple[float, dict]:
    if measured and measured.write_bytes_per_s:
        return measured.write_bytes_per_s, _basis(
            True, f"{measured.write_bytes_per_s / 1e6:.0f} MB/s, the last checkpoint of "
            f"{measured.source}"
        )  # fmt: skip
    # the chosen backend's figure, where its section has one; else (cluster=local) Slurm's
    name = str(cfg.cluster.name)
    name = name if hasattr(getattr(cfg.cluster, name, None), "checkpoint_write_mb_s") else "slurm"
    key = f"cluster.{name}"
    rate = float(getattr(cfg.cluster, name).checkpoint_write_mb_s)
    return rate * 1e6, _basis(False, f"{key}.checkpoint_write_mb_s={rate:g} (configured)")


def at_start(cfg, world_size: int, ranks_per_node: int, device_name: str | None,
             vocab_size: int, run_dir: Path) -> dict:  # fmt: skip
    """The forecast a run prints as it starts and summary.json keeps beside what the run
    measured: step time, tokens/s, time and GPU-hours to trainer.max_steps, from the
    device's stated MFU, or from what this run directory measured before (a resumed run)."""
    device = next((d for k, d in DEVICES.items() if device_name and k in device_name), None)
    nodes = max(1, world_size // ranks_per_node)
    link = link_for(str(cfg.nccl.name), nodes, device_name is not None)
    target = Target(nodes, ranks_per_node, device_name is not None, device, link)
    measured = None
    if (Path(run_dir) / "summary.json").is_file():
        with contextlib.suppress(ValueError):
            measured = measured_from(run_dir)
    try:
        plan = build(cfg, target, measured, vocab_size=vocab_size, engines=False)
    except ValueError as exc:  # an added engine that declares nothing to the plan
        return {"step_time_s": None, "tokens_per_s": None, "mfu": None, "time_s": None,
                "gpu_hours": None, "basis": str(exc)}  # fmt: skip
    step, totals = plan["step"], plan["totals"]
    return {
        "step_time_s": step.get("time_s"),
        "tokens_per_s": step.get("tokens_per_s"),
        "mfu": step.get("mfu"),
        "time_s": totals.get("time_s"),
        "gpu_hours": totals.get("gpu_hours"),
        "basis": plan["basis"]["step.compute_s"]["why"],
    }


def line(forecast: dict) -> str:
    """The forecast in one line of the run's log."""
    if not forecast["step_time_s"]:
        return f"plan: no step-time forecast ({forecast['basis']})"
    hours = f", {forecast['gpu_hours']:,.2f} GPU-hours" if forecast["gpu_hours"] else ""
    return (
        f"plan: step {forecast['step_time_s'] * 1e3:,.1f} ms, "
        f"{forecast['tokens_per_s']:,.0f} tokens/s, {forecast['time_s'] / 60:,.1f} min for "
        f"trainer.max_steps{hours} ({forecast['basis']}; python -m launcher.plan for the whole "
        "plan)"
    )
