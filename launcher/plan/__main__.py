"""`python -m launcher.plan [overrides] [--from RUN_DIR] [--json]`: the experiment at its
target scale, predicted before a GPU hour is spent (docs/plan.md).

Prints one table (memory per rank and node, the checkpoint's stop budget, the step, the
time and GPU-hours to trainer.max_steps, every figure marked measured or assumed) and writes
it as `plan/plan.json` in the run directory the launch would use.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
import sys
from pathlib import Path

from launcher.config import ConfigError, compose, friendly_overrides
from launcher.config.model_shape import millions
from launcher.data.shm import human_bytes
from launcher.paths import atomic_write
from launcher.plan import forecast, goodput
from launcher.runtime import run_dir_check
from launcher.runtime.lock import LockHeld, tool_lock

USAGE = """usage: python -m launcher.plan [--from RUN_DIR] [--mfu F] [--busbw-gbps G]
                              [--overlap F] [--json] [overrides...]

Predict the experiment at its target scale (cluster.nodes, cluster.gpus_per_node,
cluster.gpu_type): memory per rank on each engine, host memory and /dev/shm per node, the
checkpoint and the stop budget, step time, tokens/s, MFU, communication, time and
GPU-hours to trainer.max_steps (and cost with cluster.gpu_hour_cost). --from RUN_DIR takes
the compute rate, overlap, bandwidth and checkpoint speed a run measured; --mfu,
--busbw-gbps and --overlap replace the device's and the link's presets; --json prints
plan.json instead of the table. Writes <run.root>/<run.id>/plan/plan.json."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        print(USAGE)
        return 0
    as_json = "--json" in argv
    args = [a for a in argv if a != "--json"]
    try:
        args, flags = split_flags(args)
        source = Path(flags["--from"]) if "--from" in flags else None
        cfg = compose(friendly_overrides(args))
        target = forecast.given(forecast.target_of(cfg), **{
            k.lstrip("-").replace("-", "_"): float(v) for k, v in flags.items() if k != "--from"
        })  # fmt: skip
        measured = forecast.measured_from(source) if source else None
        restarts = int(cfg.cluster.k8s.max_restarts) if cfg.cluster.name == "k8s" else 0
        plan = forecast.build(cfg, target, measured, restarts)
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    run_id = cfg.run.id or f"{dt.datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(4)}"
    run_dir = Path(cfg.run.root).expanduser() / str(run_id)
    out = run_dir / "plan" / "plan.json"
    problem = run_dir_check.problem(run_dir)  # every entry as the launcher writes it
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with tool_lock(run_dir, "plan"):  # a second plan of this run at once: one line
            out.parent.mkdir(exist_ok=True)
            atomic_write(out, json.dumps(plan, indent=1))
    except LockHeld as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: cannot write {out}: {exc.strerror or exc}; set run.root to a writable "
              "folder", file=sys.stderr)  # fmt: skip
        return 2
    print(json.dumps(plan, indent=1) if as_json else table(plan))
    print(f"plan written to {out}", file=sys.stderr)
    return 0


FLAGS = {
    "--from": "a run directory: --from runs/<id>",
    "--mfu": "a fraction: --mfu 0.45",
    "--busbw-gbps": "GB/s of bus bandwidth: --busbw-gbps 370",
    "--overlap": "the fraction of communication hidden: --overlap 0.8",
}


def split_flags(args: list[str]) -> tuple[list[str], dict[str, str]]:
    """(the overrides, {flag: value}) of the command line; ValueError on a flag without
    its value, or a number that is not one."""
    rest, flags = [], {}
    it = iter(args)
    for arg in it:
        if arg not in FLAGS:
            rest.append(arg)
            continue
        value = next(it, None)
        if value is None or value.startswith("-") and not value[1:2].isdigit():
            raise ValueError(f"{arg} needs {FLAGS[arg]}")
        if arg != "--from":
            try:
                if not float(value) > 0:
                    raise ValueError
            except ValueError:
                raise ValueError(f"{arg}={value}: give {FLAGS[arg]}") from None
        flags[arg] = value
    return rest, flags


def _b(n) -> str:
    return "-" if n is None else human_bytes(int(n))


def _s(seconds) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    if seconds < 60:
        return f"{seconds:.2f} s"
    return str(dt.timedelta(seconds=round(seconds)))


def table(plan: dict) -> str:
    """The plan as the terminal shows it: one block each, the basis of every estimate."""
    j, m, c, s, t = (plan[k] for k in ("job", "memory", "checkpoint", "step", "totals"))
    device = m["gpu_per_rank"]
    lines = [
        f"plan: {j['model']} ({millions(j['parameters'])} parameters), strategy={j['strategy']}, "
        f"{j['nodes']} node(s) x {j['procs_per_node']} rank(s) on {j['device']} "
        f"({j['link']}), global batch {j['global_batch']} x {j['seq_len']} tokens "
        f"(micro-batch {j['micro_batch']}, accumulation {j['accum']})",
        "",
        "| memory per rank | bytes |",
        "|---|---:|",
        *(
            f"| {k} | {_b(device[k])} |"
            for k in (
                "weights",
                "grads",
                "optimizer",
                "gathered",
                "activations",
                "headroom",
                "total",
            )
        ),  # fmt: skip
        f"| (activations with trainer.grad_checkpointing={not j['grad_checkpointing']}) | "
        f"{_b(device['activations_if_grad_checkpointing_flipped'])} |",
    ]
    if m["device_memory_bytes"]:
        verdict = "fits" if m["fits"] else "does NOT fit"
        lines.append(f"| device memory | {_b(m['device_memory_bytes'])} ({verdict}) |")
    lines += ["", "| engine | state per rank | device memory per rank |", "|---|---:|---:|"]
    lines += [f"| {name} | {_b(v['state_bytes'])} | {_b(v['total_bytes'])} |"
              for name, v in m["by_engine"].items()]  # fmt: skip
    stop = c["stop"]
    host = m["host_per_node"]
    lines += [
        "",
        f"host memory per node {_b(m['host_per_node_bytes'])}: a rank at its peak "
        f"{_b(host['rank_process'])} ({_host_parts(host['rank'])}), its DataLoader workers "
        f"{_b(host['workers'])}, /dev/shm {_b(m['shm_per_node_bytes'])}",
        f"checkpoint: {_b(c['bytes_per_rank'])} on the largest rank, {_b(c['bytes_total'])} in "
        f"all, written in {_s(c['write_s'])}; a stop needs "
        + ", ".join(f"{_s(b['need_s'])} of {b['key']}={b['window_s']} "
                    f"({'ok' if b['fits'] else 'TOO SHORT'})"
                    for b in stop["by_backend"].values()),
    ]  # fmt: skip
    if s.get("time_s"):
        mfu = f", MFU {s['mfu']:.1%}" if s.get("mfu") else ""
        lines.append(
            f"step: {_s(s['time_s'])} (compute {_s(s['compute_s'])}, communication "
            f"{_s(s['comm_s'])} of which exposed {_s(s['comm_exposed_s'])}, "
            f"{s['comm_share']:.1%} of the step), {s['tokens_per_s']:,.0f} tokens/s{mfu}"
        )
        hours = f", {t['gpu_hours']:,.1f} GPU-hours" if t.get("gpu_hours") is not None else ""
        cost = f", cost {t['cost']:,.2f}" if t.get("cost") is not None else ""
        lines.append(f"to step {t['steps']}: {_s(t['time_s'])}{hours}{cost}")
    else:
        lines.append(f"step: no time forecast ({plan['basis']['step.compute_s']['why']})")
    lines += ["", *goodput.lines(plan["goodput"])]
    lines += ["", "basis (measured or assumed):"]
    for key, b in plan["basis"].items():
        lines.append(f"  {key}: {'measured' if b['measured'] else 'assumed'}: {b['why']}")
    return "\n".join(lines)


def _host_parts(rank: dict) -> str:
    """A rank's host memory by part, the ones it has (launcher.plan.host.rank_bytes)."""
    return ", ".join(f"{k.replace('_', ' ')} {_b(v)}" for k, v in rank.items()
                     if v and k != "total")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
