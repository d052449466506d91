"""`python -m launcher.doctor [overrides]`: what this machine offers the job, and what blocks it.

Prints versions, devices, topology and /dev/shm against this config's need, and exits
non-zero when something would stop the run (so it can gate a job script).
"""

from __future__ import annotations

import json
import sys

from launcher.config import ConfigError, compose, friendly_overrides
from launcher.data.shm import human_bytes
from launcher.plan.memory import shm_need
from launcher.preflight import check_config, machine_problems
from launcher.runtime import envinfo
from launcher.runtime.process import env_world, ranks_per_node

USAGE = """usage: python -m launcher.doctor [--json] [overrides...]

Report versions, devices, GPU topology and /dev/shm against the shared memory this
config's DataLoader workers need; exit 1 on a blocking problem, 2 on a bad override."""


def _size(n: int | None) -> str:
    return "?" if n is None else human_bytes(n)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        print(USAGE)
        return 0
    as_json = "--json" in argv
    overrides = friendly_overrides([a for a in argv if a != "--json"])
    try:
        cfg = compose(overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    world = env_world()[2]
    need = shm_need(cfg, ranks_per_node(), world)
    facts = envinfo.collect(need)
    problems = []
    try:  # what the trainer refuses, in the order it would: the config, then this machine
        checked = check_config(cfg, world)
    except ConfigError as exc:
        problems.append(str(exc))
    else:
        problems += machine_problems(checked, ranks_per_node(), world)
    facts["problems"] = problems
    if as_json:
        print(json.dumps(facts, indent=1))
    else:
        _print_report(facts, cfg)
    return 1 if problems else 0


def _print_report(facts: dict, cfg) -> None:
    v = facts["versions"]
    print(f"host        {facts['hostname']} ({facts['platform']}), {facts['cpu_count']} CPUs")
    print("versions    " + ", ".join(f"{k} {val}" for k, val in v.items() if val))
    if facts["devices"]:
        for d in facts["devices"]:
            print(f"device      cuda:{d['index']} {d['name']} {d['memory_gb']} GB")
    else:
        print("device      no CUDA device: training runs on the CPU with gloo")
    if facts["gpu_topology"]:
        print("topology\n" + facts["gpu_topology"])
    shm = facts["shm"]
    print(
        f"/dev/shm    size {_size(shm['size_bytes'])}, free {_size(shm['free_bytes'])}; "
        f"this config needs "
        f"{_size(shm['need_bytes'])} ({cfg.data.num_workers} workers x prefetch "
        f"{cfg.data.prefetch_factor} x {ranks_per_node()} ranks on this node)"
    )
    if facts["nccl_env"]:
        print("NCCL_*      " + " ".join(f"{k}={val}" for k, val in facts["nccl_env"].items()))
    for p in facts["problems"]:
        print(f"PROBLEM     {p}")
    print("ok" if not facts["problems"] else f"{len(facts['problems'])} blocking problem(s)")


if __name__ == "__main__":
    sys.exit(main())
