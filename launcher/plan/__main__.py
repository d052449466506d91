"""`python -m launcher.plan [overrides] [--from RUN_DIR ...] [--out PATH] [--json]`: the
experiment at its target scale, predicted before a GPU hour is spent (docs/plan.md).

Prints one table (memory per rank and node, the checkpoint's stop budget, the step, the
time and GPU-hours to trainer.max_steps, every figure marked measured or assumed) and writes
it as plan.json under the plans folder `<run.root>/plans/`, or where `--out` says (a run
directory: its plan/ folder). The config is checked as the job checks it: a value the job
would refuse is refused here, in the job's one line, with exit 2.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
import sys
from pathlib import Path

from launcher.config import ConfigError, compose, friendly_overrides
from launcher.config.model_shape import millions
from launcher.config.ranges import Range
from launcher.data.shm import human_bytes
from launcher.paths import atomic_write
from launcher.plan import forecast, goodput
from launcher.plan.shape import checked, shape_of
from launcher.runtime import run_dir_check
from launcher.runtime.lock import LockHeld, tool_lock

PLANS = "plans"  # <run.root>/plans/: where plans go unless --out says otherwise

USAGE = """usage: python -m launcher.plan [--from RUN_DIR ...] [--mfu F] [--busbw-gbps G]
                              [--overlap F] [--out PATH] [--json] [overrides...]

Predict the experiment at its target scale (cluster.nodes, cluster.gpus_per_node,
cluster.gpu_type): memory per rank on each engine, host memory and /dev/shm per node, the
checkpoint and the stop budget, step time, tokens/s, MFU, communication, time and
GPU-hours to trainer.max_steps (and cost with cluster.gpu_hour_cost). The config is checked
as the job checks it.
  --from RUN_DIR  runs on the target hardware (a run directory, or a sweep's folder; give it
                  again for more): the compute model (a FLOP rate and each engine's fixed
                  costs), the links per collective size, the overlap, the data wait and the
                  per-writer checkpoint speed are fitted to them
  --mfu F         the device's MFU instead of its preset (0 < F <= 1)
  --busbw-gbps G  the links' bus bandwidth in GB/s instead of the presets'
  --overlap F     the share of communication hidden behind backward (0 <= F <= 1)
  --out PATH      write plan.json there (a file, a folder, or a run directory: its plan/);
                  default <run.root>/plans/<run.id or a new id>.json
  --json          print plan.json instead of the table"""

# flag -> (its value's range, how to give it)
FLAGS = {
    "--from": (None, "a run directory: --from runs/<id>"),
    "--out": (None, "a path: --out plans/xl.json"),
    "--mfu": (Range(low=0.0, high=1.0, low_open=True), "a fraction of the peak: --mfu 0.45"),
    "--busbw-gbps": (Range(low=0.0, high=1e5, low_open=True),
                     "GB/s of bus bandwidth: --busbw-gbps 370"),
    "--overlap": (Range(low=0.0, high=1.0),
                  "the fraction of communication hidden: --overlap 0.8"),
}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        print(USAGE)
        return 0
    as_json = "--json" in argv
    try:
        args, flags = split_flags([a for a in argv if a != "--json"])
        cfg = compose(friendly_overrides(args))
        target = forecast.given(forecast.target_of(cfg), **{
            k.lstrip("-").replace("-", "_"): float(v[-1]) for k, v in flags.items()
            if k not in ("--from", "--out")
        })  # fmt: skip
        cfg = checked(cfg, target.world_size)
        sources = [Path(p) for p in flags.get("--from", [])]
        cal = forecast.calibration(sources, target) if sources else None
        restarts = int(cfg.cluster.k8s.max_restarts) if cfg.cluster.name == "k8s" else 0
        shape = shape_of(cfg, target.world_size)
        plan = forecast.build(shape, target, cal, restarts)
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = flags.get("--out", [None])[-1]
    where = write(plan, Path(out) if out else default_path(cfg))
    if isinstance(where, str):
        print(f"error: {where}", file=sys.stderr)
        return 2
    print(json.dumps(plan, indent=1) if as_json else table(plan))
    print(f"plan written to {where}", file=sys.stderr)
    return 0


def default_path(cfg) -> Path:
    """`<run.root>/plans/<run.id>.json`, or a new id's: one folder for every plan, which no
    listing of runs takes for a run."""
    name = cfg.run.id or f"{dt.datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(4)}"
    return Path(cfg.run.root).expanduser() / PLANS / f"{name}.json"


def write(plan: dict, out: Path) -> Path | str:
    """plan.json at `out` (a run directory: its plan/, under the run's lock; a folder:
    plan.json in it); where it went, or the one line that says why it could not."""
    run_dir = out if (out / "config.yaml").is_file() else None
    if run_dir is not None:
        problem = run_dir_check.problem(run_dir)  # every entry as the launcher writes it
        if problem:
            return problem
        out = run_dir / "plan" / "plan.json"
    elif out.is_dir() or out.suffix != ".json":
        out = out / "plan.json"
    try:
        if run_dir is None:
            out.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(out, json.dumps(plan, indent=1))
            return out
        with tool_lock(run_dir, "plan"):  # a second plan of this run at once: one line
            out.parent.mkdir(exist_ok=True)
            atomic_write(out, json.dumps(plan, indent=1))
    except LockHeld as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot write {out}: {exc.strerror or exc}; give --out a writable path"
    return out


def split_flags(args: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """(the overrides, {flag: its values}) of the command line; ValueError, worded for the
    user, on a flag without its value or a number outside the flag's range."""
    rest: list[str] = []
    flags: dict[str, list[str]] = {}
    it = iter(args)
    for arg in it:
        if arg not in FLAGS:
            rest.append(arg)
            continue
        allowed, how = FLAGS[arg]
        value = next(it, None)
        if value is None or value.startswith("--"):
            raise ValueError(f"{arg} needs {how}")
        if allowed is not None:
            try:
                number = float(value)
            except ValueError:
                number = None
            if number is None or not allowed.holds(number):
                raise ValueError(f"{arg} {value}: give {how} ({allowed.rule()})")
        flags.setdefault(arg, []).append(value)
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
        f"plan: {j['model']} ({millions(j['parameters'])} parameters, vocabulary "
        f"{j['vocabulary']:,}), strategy={j['strategy']}, {j['nodes']} node(s) x "
        f"{j['procs_per_node']} rank(s) on {j['device']} ({j['link']}), global batch "
        f"{j['global_batch']} x {j['seq_len']} tokens (micro-batch {j['micro_batch']}, "
        f"accumulation {j['accum']})",
        *(f"  note: {note}" for note in j["notes"]),
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
        f"checkpoint: {_b(c['bytes_total'])} in all, {c['writers']} rank(s) writing, the "
        f"largest {_b(c['bytes_per_rank'])}, written in {_s(c['write_s'])}; a stop needs "
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
        lines.append(f"to step {t['start_step'] + t['steps']}: {_s(t['time_s'])}{hours}{cost}")
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
