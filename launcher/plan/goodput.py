"""Expected goodput under failures: the share of the wall time that trains steps which are
kept, forecast from the job's mean time between failures, what a checkpoint costs and what
a restart costs (docs/plan.md, "Goodput").

A job that fails every M seconds on average, restarts in R seconds, saves a checkpoint that
stops training for C seconds every T seconds and, after a failure, redoes on average half an
interval of the newest tier it still holds keeps

    goodput = 1 - C_durable / T_durable - C_memory / T_memory - (R + T_memory / 2) / M
                - (T_durable - T_memory) / 2 / L

of its time: the memory tier's interval is redone after every failure, the rest of the
durable one after the failures every L seconds that lose the memory tier too (without the
tier, T_memory is 0 and L is M). An interval set to `auto` is Young's, sqrt(2 C M), the
durable one's with L (launcher.checkpoint.cadence, as the run chooses them); a number of
steps becomes seconds at the plan's step time. M is `trainer.mtbf_h`, or the node MTBF the
cadence states divided by the nodes; L is `trainer.memory_loss_mtbf_h`, or M; R is the
start-up a run measured (`--from RUN_DIR`: summary.json's startup_s) plus the time to detect
the failure, or an assumed figure; C is the plan's write time (durable) and a rank's share
of the state copied to host memory (memory tier).
"""

from __future__ import annotations

from launcher.checkpoint import cadence
from launcher.checkpoint import memory as tier
from launcher.checkpoint.cadence import seconds_text

DETECT_S = 5.0  # a lost peer's collective fails in seconds (about 4 s at 16 ranks, measured)
RESTART_S = 60.0  # assumed without a measured start-up: torchrun, imports, data, model, restore
COPY_BYTES_PER_S = {True: 1e10, False: 1e9}  # host copy from a GPU (PCIe), on a CPU (assumed)


def restart_cost(measured_startup_s: float | None) -> tuple[float, str]:
    """Seconds from a failure to training again, and where the figure comes from."""
    if measured_startup_s:
        total = measured_startup_s + DETECT_S
        return total, (
            f"measured start-up {measured_startup_s:.1f} s + {DETECT_S:g} s to detect (assumed)"
        )
    return RESTART_S + DETECT_S, (
        f"assumed: {RESTART_S:g} s to start again + {DETECT_S:g} s to detect (give --from a "
        "run that restarted to measure it)"
    )


def _interval(setting, write_s: float, mtbf: float, step_s: float | None) -> float | None:
    """One tier's interval in seconds (None: it never saves, or no step time to convert)."""
    if setting == cadence.AUTO:
        return cadence.young_s(write_s, mtbf)
    if not setting or step_s is None:
        return None
    return int(setting) * step_s


def forecast(cfg, nodes: int, procs_per_node: int, on_gpu: bool, write_s: float,
             step_s: float | None, startup_s: float | None = None,
             restarts: int | None = None) -> dict:  # fmt: skip
    """The goodput forecast of `cfg` on `nodes` x `procs_per_node` ranks (plan.json's
    `goodput`): each tier's interval and cost, the failure rate and the restart cost."""
    t = cfg.trainer
    world = nodes * procs_per_node
    mtbf, mtbf_why = cadence.mtbf_s(t.mtbf_h, nodes)
    restart, restart_why = restart_cost(startup_s)
    memory_setting = t.memory_checkpoint_interval
    if memory_setting != cadence.AUTO:
        memory_setting = tier.interval(cfg, restarts)
    loss, loss_why = (mtbf, mtbf_why)
    if memory_setting:
        loss, loss_why = cadence.memory_loss_mtbf_s(t.memory_loss_mtbf_h, (mtbf, mtbf_why))
    durable_every = _interval(t.checkpoint_interval, write_s, loss, step_s)
    tiers = {
        "durable": {"setting": t.checkpoint_interval, "cost_s": write_s, "every_s": durable_every}
    }
    if memory_setting:
        # a rank's share: DDP's state split over the node's ranks, a sharded engine's shard
        share = tier.node_state_bytes(cfg, procs_per_node, world) / procs_per_node
        copy_s = share / COPY_BYTES_PER_S[on_gpu]
        tiers["memory"] = {
            "setting": memory_setting,
            "cost_s": copy_s,
            "every_s": _interval(memory_setting, copy_s, mtbf, step_s),
        }
    lost = [v["cost_s"] / v["every_s"] for v in tiers.values() if v["every_s"]]
    expected = None
    if all(v["every_s"] or not v["setting"] for v in tiers.values()) and len(lost):
        memory_every = tiers["memory"]["every_s"] if "memory" in tiers else 0.0
        # Without durable checkpoints a failure the memory tier cannot recover from loses
        # the run, which no rate of time lost can say: the forecast leaves it out.
        fallback = (durable_every - memory_every) / 2 / loss if durable_every else 0.0
        redo = (restart + memory_every / 2) / mtbf + fallback
        expected = max(0.0, 1 - sum(lost) - redo)
    for v in tiers.values():
        v["steps"] = round(v["every_s"] / step_s) if v["every_s"] and step_s else None
    return {
        "expected": expected,
        "mtbf_s": mtbf,
        "mtbf_why": mtbf_why,
        "memory_loss_mtbf_s": loss,
        "memory_loss_mtbf_why": loss_why,
        "restart_s": restart,
        "restart_why": restart_why,
        "tiers": tiers,
        "why": None
        if expected is not None
        else "no step time to turn a number of steps into "
        "seconds (set the intervals to auto, or give --from a measured run)",
    }


def saves(goodput: dict, end_step: int, start_step: int = 0) -> int:
    """Durable checkpoints from `start_step` (a resumed run's) to `end_step` at the
    forecast's interval (0 without one)."""
    every = goodput["tiers"]["durable"]["steps"]
    return end_step // every - start_step // every if every else 0


def lines(goodput: dict) -> list[str]:
    """The plan's goodput section, as the terminal shows it."""
    head = (
        f"goodput: {goodput['expected']:.1%} expected"
        if goodput["expected"] is not None
        else f"goodput: no forecast ({goodput['why']})"
    )
    out = [
        f"{head}; a failure every {seconds_text(goodput['mtbf_s'])} ({goodput['mtbf_why']}); "
        f"a restart {seconds_text(goodput['restart_s'])} ({goodput['restart_why']})"
    ]
    for name, v in goodput["tiers"].items():
        every = seconds_text(v["every_s"]) if v["every_s"] else "-"
        steps = f" ({v['steps']} steps)" if v["steps"] else ""
        how = "Young's sqrt(2 x cost x MTBF)" if v["setting"] == cadence.AUTO else "set"
        if v["setting"] == cadence.AUTO and name == "durable" and "memory" in goodput["tiers"]:
            how = (f"Young's sqrt(2 x cost x {seconds_text(goodput['memory_loss_mtbf_s'])} "
                   f"between the failures that lose the memory tier: "
                   f"{goodput['memory_loss_mtbf_why']})")  # fmt: skip
        out.append(f"  {name} checkpoints: every {every}{steps}, {how}; each costs "
                   f"{seconds_text(v['cost_s'])}")  # fmt: skip
    return out
