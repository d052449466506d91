"""The burn-in gate: seconds before training, find the node that would slow every step.

A data-parallel step runs at the pace of its slowest rank, so one GPU with a throttled
clock, a bad riser or a neighbour's job costs the whole allocation for the whole run. Before
anything is built, every rank times a matmul of a fixed size on its device and an all-reduce
within its node and across nodes, on the job's own process group (the node groups are made
here, once per process). Rank 0 gathers the figures, names each rank whose matmul is slower
than the median of the other ranks by more than `burnin.tolerance` (and each node whose
all-reduce is, against the other nodes), writes `burnin.json` and logs one line. With
`burnin.action=refuse` every rank then stops with exit code 6 (bad node) before any step,
the hosts named in the run directory's `bad_hosts` for the scheduler: the sbatch script
requeues once with them excluded, the pod renderers keep them off the next pods' nodes.
docs/burnin.md explains the figures.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from launcher.config.schema import BurninConfig
from launcher.paths import atomic_write, keep_aside
from launcher.resilience import bad_hosts
from launcher.resilience.faults import FaultInjector
from launcher.runtime.allreduce import bus_bandwidth, time_allreduce
from launcher.runtime.placement import node_name
from launcher.runtime.process import Runtime

log = logging.getLogger("launcher")

REPORT = "burnin.json"
MATMUL_N = {"cuda": 8192, "cpu": 512}  # burnin.matmul_size=null
ALLREDUCE_BYTES = {"cuda": 64 * 2**20, "cpu": 2**20}
WARMUP = 2


class BadNode(RuntimeError):
    """burnin.action=refuse found a slow rank or node; raised on every rank together, with
    the line that names them and what the gate cost."""

    def __init__(self, line: str, seconds: float):
        super().__init__(line)
        self.seconds = seconds


@dataclass(frozen=True)
class Outlier:
    index: int  # into the list of values
    value: float
    median_others: float

    @property
    def excess(self) -> float:
        """How much slower than the others' median: 0.5 = 50% more time."""
        return self.value / self.median_others - 1 if self.median_others > 0 else float("inf")


def outliers(seconds: list[float | None], tolerance: float) -> list[Outlier]:
    """Each entry taking longer than the median of the others by more than `tolerance`.

    The median of the *other* entries, as the straggler detector uses: with two ranks it is
    the other rank, and a slow entry cannot pull its own yardstick up. None (not measured)
    is neither judged nor part of a median."""
    found = []
    for i, value in enumerate(seconds):
        others = [v for j, v in enumerate(seconds) if j != i and v is not None]
        if value is None or not others:
            continue
        hit = Outlier(i, value, statistics.median(others))
        if hit.excess > tolerance:
            found.append(hit)
    return found


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_matmul(device: torch.device, n: int, iters: int, delay: float, until: float) -> float:
    """Median seconds of one n x n matmul (bf16 on a GPU, fp32 on a CPU), after warm-up;
    fewer repetitions when the gate's deadline `until` comes first. Random operands from a
    private generator: the run's seeded streams stay untouched, and a GPU draws its real
    power (all-zero or all-one operands run faster than real data)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.rand(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.rand(n, n, device=device, dtype=dtype, generator=gen)
    for _ in range(WARMUP):
        torch.mm(a, b)
    _sync(device)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        torch.mm(a, b)
        _sync(device)
        if delay:
            time.sleep(delay)  # fault.kind=slow_device
        times.append(time.perf_counter() - start)
        if time.perf_counter() > until:
            break
    return statistics.median(times)


def node_group(rt: Runtime, hosts: list[str]):
    """This rank's node's group (on the job's backend), made once per process: every rank
    makes every node's group, in the order the nodes' first ranks come."""
    groups = rt.launch.side_groups
    if "burnin/node" not in groups:
        by_host: dict[str, list[int]] = {}
        for rank, host in enumerate(hosts):
            by_host.setdefault(host, []).append(rank)
        mine, _ = dist.new_subgroups_by_enumeration(list(by_host.values()), backend=rt.backend)
        groups["burnin/node"] = mine
    return groups["burnin/node"]


def allreduce_figures(rt: Runtime, group, ranks: int, iters: int) -> dict | None:
    """{seconds, busbw_gbps} of one all-reduce over `group` of `ranks` ranks (None: alone)."""
    if ranks < 2:
        return None
    nbytes = ALLREDUCE_BYTES["cuda" if rt.device.type == "cuda" else "cpu"]
    tensor = torch.ones(nbytes // 4, dtype=torch.float32, device=rt.device)
    seconds = time_allreduce(tensor, WARMUP, iters, group=group)
    return {"seconds": seconds, "busbw_gbps": bus_bandwidth(nbytes / seconds / 1e9, ranks)}


def measure(cfg: BurninConfig, faults: FaultInjector, rt: Runtime, started: float) -> dict:
    """This rank's figures: its host, its matmul and its node's and the job's all-reduce."""
    host = node_name()
    hosts = rt.all_gather_objects(host)
    n = cfg.matmul_size or MATMUL_N["cuda" if rt.device.type == "cuda" else "cpu"]
    delay = faults.burnin_delay()
    matmul = time_matmul(rt.device, n, cfg.iters, delay, started + cfg.budget_s / 2)
    nodes = len(set(hosts))
    mine = [r for r, h in enumerate(hosts) if h == host]
    group = node_group(rt, hosts) if nodes > 1 else None
    node = allreduce_figures(rt, group, len(mine), cfg.iters)
    cross = allreduce_figures(rt, None, rt.world_size, cfg.iters) if nodes > 1 else None
    if rt.device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(rt.device)  # mem/peak_gb is the training's
    return {
        "rank": rt.rank,
        "host": host,
        "local_rank": rt.local_rank,
        "device": str(rt.device),
        "matmul_size": n,
        "matmul_s": matmul,
        "matmul_tflops": 2 * n**3 / matmul / 1e12,
        "node_allreduce": node,
        "cross_node_allreduce": cross,
    }


def judge(ranks: list[dict], tolerance: float) -> tuple[list[dict], list[dict]]:
    """(slow ranks, slow nodes): each with its host and its figure in words."""
    slow_ranks = []
    for hit in outliers([r["matmul_s"] for r in ranks], tolerance):
        r = ranks[hit.index]
        slow_ranks.append(
            {
                "rank": r["rank"],
                "host": r["host"],
                "matmul_s": hit.value,
                "median_others_s": hit.median_others,
                "excess_frac": hit.excess,
                "figure": f"matmul {hit.value * 1e3:.3g} ms, {100 * hit.excess:.0f}% above the "
                f"other ranks' median {hit.median_others * 1e3:.3g} ms",
            }
        )
    per_node: dict[str, list[float]] = {}
    for r in ranks:  # a node's all-reduce takes as long as its slowest rank saw
        seen = per_node.setdefault(r["host"], [])
        if r["node_allreduce"]:
            seen.append(r["node_allreduce"]["seconds"])
    hosts = list(per_node)
    node_seconds = [max(seen) if seen else None for seen in per_node.values()]
    slow_nodes = []
    for hit in outliers(node_seconds, tolerance):
        host = hosts[hit.index]
        slow_nodes.append(
            {
                "host": host,
                "ranks": [r["rank"] for r in ranks if r["host"] == host],
                "allreduce_s": hit.value,
                "median_others_s": hit.median_others,
                "excess_frac": hit.excess,
                "figure": f"in-node all-reduce {hit.value * 1e3:.3g} ms, {100 * hit.excess:.0f}% "
                f"above the other nodes' median {hit.median_others * 1e3:.3g} ms",
            }
        )
    return slow_ranks, slow_nodes


def verdict_line(report: dict) -> str:
    """The one log line that names every slow rank and node, with its host and figure."""
    named = [f"rank {s['rank']} on {s['host']}: {s['figure']}" for s in report["slow_ranks"]]
    named += [f"node {s['host']}: {s['figure']}" for s in report["slow_nodes"]]
    action = {
        "refused": "refused: exit 6 (bad node); the host(s) are in the run directory's bad_hosts",
        "warned": "training goes on (burnin.action=warn)",
    }[report["verdict"]]
    return (
        f"burn-in: slower than the others by more than burnin.tolerance="
        f"{report['tolerance']:g}: {'; '.join(named)}; {action}"
    )


def refused_hosts(report: dict) -> dict[str, str]:
    """{host: why} of the hosts a refusal names, for bad_hosts."""
    why = {s["host"]: f"burn-in: node: {s['figure']}" for s in report["slow_nodes"]}
    for s in report["slow_ranks"]:
        why.setdefault(s["host"], f"burn-in: rank {s['rank']}: {s['figure']}")
    return why


def summary(report: dict) -> dict:
    """What env.json keeps of the report (burnin.json has every rank's figures)."""
    keep = ("verdict", "seconds", "budget_s", "tolerance", "action", "matmul_size")
    out = {k: report[k] for k in keep}
    out["matmul_s/median"] = statistics.median(r["matmul_s"] for r in report["ranks"])
    out["slow_ranks"] = [
        {k: s[k] for k in ("rank", "host", "figure")} for s in report["slow_ranks"]
    ]
    out["slow_nodes"] = [{k: s[k] for k in ("host", "figure")} for s in report["slow_nodes"]]
    return out


def keep_earlier_verdict(run_dir: Path) -> None:
    """An earlier gate's burnin.json that did not pass (the figures that named a slow node,
    which bad_hosts still lists) is moved to archive/<time>/ before this gate's replaces
    it; an earlier pass is simply replaced."""
    earlier = run_dir / REPORT
    try:
        passed = json.loads(earlier.read_text()).get("verdict") == "pass"
    except FileNotFoundError:
        return
    except (OSError, ValueError, AttributeError):
        passed = False  # unreadable: kept too, it may be the one that mattered
    if not passed:
        log.info("burn-in: the earlier gate's figures moved to %s", keep_aside(run_dir, earlier))


def gate(cfg: BurninConfig, faults: FaultInjector, rt: Runtime, record: bool = True) -> dict | None:
    """Run the gate on every rank (None when burnin.enabled is off); raise BadNode on every
    rank when it refuses. Rank 0 writes burnin.json (and, with `record`, exclude.burnin, the
    refused hosts in bad_hosts) and logs."""
    if not cfg.enabled:
        return None
    started = time.perf_counter()
    figures = measure(cfg, faults, rt, started)
    ranks = rt.all_gather_objects(figures)
    slow_ranks, slow_nodes = judge(ranks, cfg.tolerance)
    bad = list(dict.fromkeys([s["host"] for s in slow_ranks] + [s["host"] for s in slow_nodes]))
    verdict = "pass" if not bad else "refused" if cfg.action == "refuse" else "warned"
    report = {
        "verdict": verdict,
        "seconds": time.perf_counter() - started,
        "budget_s": cfg.budget_s,
        "tolerance": cfg.tolerance,
        "action": cfg.action,
        "matmul_size": ranks[0]["matmul_size"],
        "world_size": rt.world_size,
        "nodes": len({r["host"] for r in ranks}),
        "bad_hosts": bad,
        "slow_ranks": slow_ranks,
        "slow_nodes": slow_nodes,
        "ranks": ranks,
    }
    if rt.is_main:
        _report(report, rt.run_dir, record)
    rt.barrier()  # bad_hosts is whole before any rank exits
    if verdict == "refused":
        raise BadNode(verdict_line(report), report["seconds"])
    return report


def _report(report: dict, run_dir: Path, record: bool) -> None:
    keep_earlier_verdict(run_dir)
    atomic_write(run_dir / REPORT, json.dumps(report, indent=1))
    matmuls = [r["matmul_s"] for r in report["ranks"]]
    log.info(
        "burn-in: %d rank(s) on %d node(s) in %.2f s (burnin.budget_s=%g): matmul %d x %d "
        "%.3g ms (fastest rank) to %.3g ms (slowest); %s; figures in %s",
        report["world_size"],
        report["nodes"],
        report["seconds"],
        report["budget_s"],
        report["matmul_size"],
        report["matmul_size"],
        min(matmuls) * 1e3,
        max(matmuls) * 1e3,
        "no rank or node slower than the others" if report["verdict"] == "pass" else "see below",
        run_dir / REPORT,
    )
    if report["seconds"] > report["budget_s"]:
        log.warning(
            "burn-in took %.1f s, over burnin.budget_s=%g; lower burnin.iters or "
            "burnin.matmul_size",
            report["seconds"],
            report["budget_s"],
        )
    if report["verdict"] == "refused" and record:
        bad_hosts.record(run_dir, refused_hosts(report))
    if report["verdict"] == "warned":
        log.warning("%s", verdict_line(report))
