"""Gradient and parameter communication of one step, as an alpha-beta model.

A collective over n ranks moves, per rank, nccl-tests' "bus" traffic: all-reduce
2(n-1)/n x B, reduce-scatter and all-gather (n-1)/n x B, for a buffer of B bytes. At the
link's bus bandwidth that is the beta term; the alpha term is the latency of each of the
algorithm's steps: 2(n-1) for a ring all-reduce, 2 log2(n) for a tree (NCCL's choice for
small buffers and many ranks), n-1 for a ring reduce-scatter or all-gather. The all-reduce
takes the faster of ring and tree, as NCCL's tuner does.
"""

from __future__ import annotations

import math

from launcher.config.registry import engine
from launcher.model.build import param_count
from launcher.plan.presets import Link


def collective_s(op: str, size: int, ranks: int, link: Link) -> float:
    """Seconds one collective of `size` bytes takes over `ranks` ranks on `link`."""
    if ranks <= 1 or size <= 0:
        return 0.0
    share = (ranks - 1) / ranks
    if op == "all_reduce":
        ring = 2 * (ranks - 1) * link.alpha + 2 * share * size / link.busbw
        tree = 2 * math.log2(ranks) * link.alpha + 2 * share * size / link.busbw
        return min(ring, tree)
    if op in ("reduce_scatter", "all_gather"):
        return (ranks - 1) * link.alpha + share * size / link.busbw
    raise ValueError(f"unknown collective {op!r}")


def step_comm(cfg, world_size: int, link: Link) -> dict:
    """One step's collectives as the engine declares them (launcher.strategy.<engine>),
    each timed: {"collectives": [...], "bytes": total, "time_s": total}."""
    declared = engine(cfg.strategy.name).step_collectives
    rows = declared(cfg, param_count(cfg.model), world_size) if declared else []
    timed = [
        {"op": op, "bytes": size, "times": times,
         "time_s": times * collective_s(op, size, world_size, link)}
        for op, size, times in rows if times
    ]  # fmt: skip
    return {
        "collectives": timed,
        "bytes": sum(r["bytes"] * r["times"] for r in timed),
        "time_s": sum(r["time_s"] for r in timed),
    }
