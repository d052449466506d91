"""`python -m launcher.doctor [--json] [overrides]`: what this machine offers the job, and
what blocks it.

Prints versions, devices, topology and /dev/shm against this config's need, then every
problem the trainer would refuse the same overrides for, one line each (all of them, where
a launch stops at the first; an override that does not compose also as an `error:` line),
and exits as the trainer would: 2 when there is any (bad input: an impossible config, or a
machine that cannot run it), 0 otherwise, so that it can gate a job script.
"""

from __future__ import annotations

import json
import sys

from launcher.config import ConfigError, compose, friendly_overrides
from launcher.config.compose import compose_problems
from launcher.config.validate import problems as config_problems
from launcher.data.shm import human_bytes
from launcher.plan.memory import shm_need
from launcher.preflight import check_config, machine_problems
from launcher.resilience import exit_codes
from launcher.runtime import envinfo
from launcher.runtime.placement import env_world, ranks_per_node

USAGE = """usage: python -m launcher.doctor [--json] [overrides...]

Report versions, devices, GPU topology and /dev/shm against the shared memory this
config's DataLoader workers need, then every problem the trainer would refuse these
overrides for; exit 2 on any (as the trainer), 0 otherwise."""
FLAGS = ("--json", "-h", "--help")


def _size(n: int | None) -> str:
    return "?" if n is None else human_bytes(n)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        print(USAGE)
        return exit_codes.DONE
    unknown = [a for a in argv if a.startswith("-") and a not in FLAGS]
    if unknown:
        print(f"error: {unknown[0]}: not a flag of launcher.doctor (--json, --help); "
              "overrides are key=value", file=sys.stderr)  # fmt: skip
        return exit_codes.BAD_INPUT
    overrides = friendly_overrides([a for a in argv if a != "--json"])
    refused, accepted = compose_problems(overrides)
    for line in refused:
        print(f"error: {line}", file=sys.stderr)
    cfg = compose(accepted)
    world = env_world()[2]
    problems = [*refused, *config_problems(cfg.copy(), world)]
    # A config with problems has no need to measure (-3 workers need no negative bytes).
    need = None if problems else shm_need(cfg, ranks_per_node(), world)
    problems = problems or engine_and_machine_problems(cfg, world)
    facts = envinfo.collect(need)
    facts["problems"] = problems
    if "--json" in argv:
        print(json.dumps(facts, indent=1))
    else:
        _print_report(facts, cfg)
    return exit_codes.BAD_INPUT if problems else exit_codes.DONE


def engine_and_machine_problems(cfg, world: int) -> list[str]:
    """For a config that holds, what the trainer refuses next, in its order: the engine's
    own config, then each of this machine's problems."""
    try:
        checked = check_config(cfg, world)
    except ConfigError as exc:
        return [str(exc)]
    return machine_problems(checked, ranks_per_node(), world)


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
    if shm["need_bytes"] is None:
        need = "an unknown amount until the problems below are fixed"
    else:
        need = (
            f"{_size(shm['need_bytes'])} ({cfg.data.num_workers} workers x prefetch "
            f"{cfg.data.prefetch_factor} x {ranks_per_node()} ranks on this node)"
        )
    print(
        f"/dev/shm    size {_size(shm['size_bytes'])}, free {_size(shm['free_bytes'])}; "
        f"this config needs {need}"
    )
    if facts["nccl_env"]:
        print("NCCL_*      " + " ".join(f"{k}={val}" for k, val in facts["nccl_env"].items()))
    for p in facts["problems"]:
        print(f"PROBLEM     {p}")
    print("ok" if not facts["problems"] else f"{len(facts['problems'])} blocking problem(s)")


if __name__ == "__main__":
    sys.exit(main())
