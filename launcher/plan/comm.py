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

from omegaconf import OmegaConf

from launcher.config.model_shape import param_count
from launcher.config.registry import engine
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


def fitted(link: Link, busbw: float, nbytes: float, collectives: int, ranks: int,
           source: str) -> Link:  # fmt: skip
    """`link` scaled to time a measured run's all-reduces as the run measured them.

    A run measures one bucket layout: its `collectives` all-reduces of `nbytes` in all a
    step at an effective bus bandwidth `busbw` (latency included). One layout cannot split
    latency from bandwidth, so both the preset's alpha and its 1/busbw are scaled by the
    measured time over the preset's time for that layout: the measured layout is timed
    exactly, and other bucket sizes keep the preset's balance between the two (on gloo,
    whose per-collective cost is milliseconds, that makes many small buckets expensive)."""
    size = nbytes / collectives
    measured = 2 * (ranks - 1) / ranks * size / busbw
    factor = measured / collective_s("all_reduce", size, ranks, link)
    return Link(link.name, link.busbw / factor, link.alpha * factor, source)


def step_comm(cfg, world_size: int, link: Link) -> dict:
    """One step's collectives as the engine declares them (launcher.strategy.<engine>),
    each timed: {"collectives": [...], "bytes": total, "time_s": total}."""
    plan = engine(cfg.strategy.name).plan
    rows = plan.step_collectives(cfg, param_count(cfg.model), world_size) if plan else []
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


def exposed_s(rows: list[tuple[str, int, int]], ranks: int, link: Link, backward_s: float) -> float:
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
        ended = max(ready, ended) + collective_s(op, size, ranks, link)
    return max(0.0, ended - backward_s)


def hidden_window(rows: list[tuple[str, int, int]], ranks: int, link: Link, backward_s: float,
                  exposed: float) -> float:  # fmt: skip
    """The part of `backward_s` that really hid communication in a run that measured
    `exposed` seconds of its collectives `rows` uncovered: the window the pipeline needs to
    expose as much (bisection; the exposure falls as the window grows). A run whose
    communication hid nothing (gloo on a busy CPU) gets no window; one that hid more than
    the model allows, the whole backward."""
    low, high = 0.0, backward_s
    if exposed_s(rows, ranks, link, high) >= exposed:
        return high
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (mid, high) if exposed_s(rows, ranks, link, mid) > exposed else (low, mid)
    return low


def bucket_sizes(cfg, key: str, default_mb: float, world_size: int, link: Link,
                 backward_s: float) -> list[tuple[float, float]]:  # fmt: skip
    """[(bucket MiB, predicted exposed seconds)] for the sizes of `key` (the engine's
    bucket size in MiB) worth a trial, best first: powers of two from 1/16 MiB to 1 GiB
    and the engine's default, one size per distinct prediction (the default where it ties,
    else the smallest: equal layouts time the same), only those predicted to expose less
    than the configured size."""
    params = param_count(cfg.model)
    declared = engine(cfg.strategy.name).plan.step_collectives

    def predicted(mb: float) -> float:
        sized = OmegaConf.merge(cfg, OmegaConf.from_dotlist([f"{key}={mb}"]))
        return exposed_s(declared(sized, params, world_size), world_size, link, backward_s)

    current = predicted(float(OmegaConf.select(cfg, key)))
    figures = {mb: predicted(mb) for mb in {default_mb, *(2.0**k for k in range(-4, 11))}}
    out: list[tuple[float, float]] = []
    for mb in sorted(figures, key=lambda mb: (figures[mb], mb != default_mb, mb)):
        seconds = figures[mb]
        if seconds < current and all(not math.isclose(seconds, s) for _, s in out):
            out.append((mb, seconds))
    return out
