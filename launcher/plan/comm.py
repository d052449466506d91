"""A step's collectives, timed on the links they cross (an alpha-beta model).

A collective over n ranks moves, per rank, nccl-tests' "bus" traffic: all-reduce
2(n-1)/n x B, reduce-scatter and all-gather (n-1)/n x B, for a buffer of B bytes, at the bus
bandwidth of the slowest link it crosses (the network's once the job spans nodes). Each of the
algorithm's steps costs a latency (alpha), the latency of the link that step crosses, as
NCCL's own tuner counts them (src/graph/tuning.cc): a ring all-reduce of n ranks on N nodes
takes 2(n-1) steps of which 2(N-1) cross the network, a ring reduce-scatter or all-gather n-1
steps of which N-1; a tree all-reduce 2((n/N - 1) intra-node + log2(N) inter-node) steps. The
all-reduce takes the faster of ring and tree, as NCCL's tuner does. FSDP2 and ZeRO-3 declare
their per-unit gathers and reductions alike (launcher.strategy.sharded_plan), so both are
timed by the same arithmetic.
"""

from __future__ import annotations

import math

from omegaconf import OmegaConf

from launcher.config.model_shape import param_count
from launcher.config.registry import engine
from launcher.plan.presets import Topology


def ring_steps(op: str, ranks: int, nodes: int) -> tuple[int, int]:
    """(steps within a node, steps across nodes) of `op`'s ring over `ranks` on `nodes`."""
    if op == "all_reduce":
        return 2 * (ranks - 1) - 2 * (nodes - 1), 2 * (nodes - 1)
    if op in ("reduce_scatter", "all_gather"):
        return ranks - nodes, nodes - 1
    raise ValueError(f"unknown collective {op!r}")


def tree_steps(ranks: int, nodes: int) -> tuple[float, float]:
    """(steps within a node, steps across nodes) of a tree all-reduce: up and down a chain
    of each node's ranks, and a tree of the nodes."""
    return 2.0 * (ranks // nodes - 1), 2.0 * math.log2(nodes)


def traffic(op: str, size: float, ranks: int) -> float:
    """Bytes one rank moves for `op` of a `size`-byte buffer (nccl-tests' bus traffic)."""
    share = (ranks - 1) / ranks
    return 2 * share * size if op == "all_reduce" else share * size


def collective_s(op: str, size: float, topo: Topology) -> float:
    """Seconds one collective of `size` bytes takes over `topo`'s ranks."""
    ranks, nodes = topo.ranks, max(1, topo.nodes)
    if ranks <= 1 or size <= 0:
        return 0.0
    intra, inter = topo.links(op)
    busbw = inter.busbw if nodes > 1 else intra.busbw
    moved = traffic(op, size, ranks) / busbw

    def timed(steps: tuple[float, float]) -> float:
        return steps[0] * intra.alpha + steps[1] * inter.alpha + moved

    ring = timed(ring_steps(op, ranks, nodes))
    return min(ring, timed(tree_steps(ranks, nodes))) if op == "all_reduce" else ring


def step_comm(cfg, world_size: int, topo: Topology) -> dict:
    """One step's collectives as the engine declares them (launcher.strategy.<engine>),
    each timed: {"collectives": [...], "bytes": total, "time_s": total}."""
    plan = engine(cfg.strategy.name).plan
    rows = plan.step_collectives(cfg, param_count(cfg.model), world_size) if plan else []
    timed = [
        {"op": op, "bytes": size, "times": times,
         "time_s": times * collective_s(op, size, topo)}
        for op, size, times in rows if times
    ]  # fmt: skip
    return {
        "collectives": timed,
        "bytes": sum(r["bytes"] * r["times"] for r in timed),
        "time_s": sum(r["time_s"] for r in timed),
    }


def exposed_s(rows: list[tuple[str, int, int]], topo: Topology, backward_s: float) -> float:
    """The part of a step's collectives that no backward computation hides.

    The buckets are timed as a pipeline over the last micro-step's backward: backward
    fills them at an even rate (bucket i is ready once backward has produced the bytes of
    buckets 1..i), one collective runs at a time, each starts when its bucket is ready and
    the one before has ended. What runs past the end of backward is exposed: at least the
    last bucket's whole time (the first layers' gradients come last), and every bucket's
    latency (alpha) when many small buckets queue up. Large buckets expose their last one,
    small ones their latencies; the model finds the size between.
    """
    queue = [(op, size) for op, size, times in rows for _ in range(times)]
    total = sum(size for _, size in queue)
    if not queue or total <= 0:
        return 0.0
    ended = produced = 0.0
    for op, size in queue:
        produced += size
        ready = backward_s * produced / total
        ended = max(ready, ended) + collective_s(op, size, topo)
    return max(0.0, ended - backward_s)


def hidden_window(rows: list[tuple[str, int, int]], topo: Topology, backward_s: float,
                  exposed: float) -> float:  # fmt: skip
    """The part of `backward_s` that really hid communication in a run that measured
    `exposed` seconds of its collectives `rows` uncovered: the window the pipeline needs to
    expose as much (bisection; the exposure falls as the window grows). A run whose
    communication hid nothing (gloo on a busy CPU) gets no window; one that hid more than
    the model allows, the whole backward."""
    low, high = 0.0, backward_s
    if exposed_s(rows, topo, high) >= exposed:
        return high
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (mid, high) if exposed_s(rows, topo, mid) > exposed else (low, mid)
    return low


def bucket_sizes(cfg, key: str, default_mb: float, world_size: int, topo: Topology,
                 backward_s: float) -> list[tuple[float, float]]:  # fmt: skip
    """[(bucket MiB, predicted exposed seconds)] for the sizes of `key` (the engine's
    bucket size in MiB) worth a trial, best first: powers of two from 1/16 MiB to 1 GiB
    and the engine's default, one size per distinct prediction (the default where it ties,
    else the smallest: equal layouts time the same), only those predicted to expose less
    than the configured size. The buckets are the engine's own (its `step_collectives`:
    DDP's cut from the fp32 gradients, under a compression hook too)."""
    params = param_count(cfg.model)
    declared = engine(cfg.strategy.name).plan.step_collectives

    def predicted(mb: float) -> float:
        sized = OmegaConf.merge(cfg, OmegaConf.from_dotlist([f"{key}={mb}"]))
        return exposed_s(declared(sized, params, world_size), topo, backward_s)

    current = predicted(float(OmegaConf.select(OmegaConf.structured(cfg), key)))  # typed or not
    figures = {mb: predicted(mb) for mb in {default_mb, *(2.0**k for k in range(-4, 11))}}
    out: list[tuple[float, float]] = []
    for mb in sorted(figures, key=lambda mb: (figures[mb], mb != default_mb, mb)):
        seconds = figures[mb]
        if seconds < current and all(not math.isclose(seconds, s) for _, s in out):
            out.append((mb, seconds))
    return out
