"""Expected goodput under failures: the share of the wall time that trains steps which are
kept, forecast from the job's mean time between failures, what a checkpoint costs and what
a restart costs (docs/plan.md, "Goodput").

A job that fails every M seconds on average, restarts in R seconds, saves a checkpoint that
stops training for C seconds every T seconds and, after a failure, redoes on average half an
interval of the newest tier (the memory tier's when it is on) keeps

    goodput = 1 - C_durable / T_durable - C_memory / T_memory - (R + T_newest / 2) / M

of its time. An interval set to `auto` is Young's, sqrt(2 C M) (launcher.checkpoint.cadence,
as the run chooses it); a number of steps becomes seconds at the plan's step time. M is
`trainer.mtbf_h`, or the node MTBF the cadence states divided by the nodes; R is the
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
    durable_every = _interval(t.checkpoint_interval, write_s, mtbf, step_s)
    tiers = {
        "durable": {"setting": t.checkpoint_interval, "cost_s": write_s, "every_s": durable_every}
    }
    memory_setting = t.memory_checkpoint_interval
    if memory_setting != cadence.AUTO:
        memory_setting = tier.interval(cfg, restarts)
    if memory_setting:
        # a rank's share: DDP's state split over the node's ranks, a sharded engine's shard
        share = tier.node_state_bytes(cfg, procs_per_node, world) / procs_per_node
        copy_s = share / COPY_BYTES_PER_S[on_gpu]
        tiers["memory"] = {
            "setting": memory_setting,
            "cost_s": copy_s,
            "every_s": _interval(memory_setting, copy_s, mtbf, step_s),
        }
    newest = tiers.get("memory", tiers["durable"])["every_s"]
    lost = [v["cost_s"] / v["every_s"] for v in tiers.values() if v["every_s"]]
    expected = None
    if newest is not None and all(v["every_s"] or not v["setting"] for v in tiers.values()):
        expected = max(0.0, 1 - sum(lost) - (restart + newest / 2) / mtbf)
    for v in tiers.values():
        v["steps"] = round(v["every_s"] / step_s) if v["every_s"] and step_s else None
    return {
        "expected": expected,
        "mtbf_s": mtbf,
        "mtbf_why": mtbf_why,
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
        out.append(f"  {name} checkpoints: every {every}{steps}, {how}; each costs "
                   f"{seconds_text(v['cost_s'])}")  # fmt: skip
    return out
