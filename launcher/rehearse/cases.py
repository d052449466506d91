"""The cases table: each fault, what the launcher promises for it, and how the rehearsal
provokes it and checks the promise from the run's own files.

Every case uses what users and the tests use: the `fault.*` keys (launcher.resilience.faults),
the exit codes (launcher.resilience.exit_codes), the watchdog and launcher.analyze's hang
analysis, launcher.submit's renderers. A case raises CaseFailed with what it saw; what it
returns is the row's observation.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass

from launcher.analyze.hang import analyze_hang, write_hang_report
from launcher.checkpoint.protocol import read_meta, step_name
from launcher.config import ConfigError
from launcher.config.backends import backend
from launcher.plan.forecast import checkpoint_bytes
from launcher.rehearse.launches import (
    CaseFailed,
    last_step,
    latest_checkpoint,
    losses,
    records,
    summary,
    worker_pid,
)
from launcher.rehearse.rehearsal import Rehearsal
from launcher.rehearse.report import StopCheckpoint
from launcher.rehearse.shrink import CHECKPOINT_INTERVAL, STEPS
from launcher.resilience import exit_codes
from launcher.submit import stop_time
from launcher.submit.job import prepare

STOP_AFTER = 4  # SIGTERM once this step is logged
HANG_STEP = 5
# The watchdog's limits for the hang case, so that it is declared in seconds: its other
# settings (enabled, the flight recorder's size) are the experiment's.
QUICK_WATCHDOG = ["watchdog.min_s=3", "watchdog.step_multiple=10"]
HANG_DETECT_S = 20.0  # from the stall's start to the job's end, generously
SLOW_STEPS = 16
SLOW_SECONDS = 0.2  # many times a shrunk step
BAD_OVERRIDE = "trainer.max_step=10"  # a one-letter slip of trainer.max_steps
WORLD_SIZE_TOLERANCE = 1e-5  # another accumulation order: fp32 reordering, not drift


class Seen:
    """The observations of one case, in order: the row's `observed` cell."""

    def __init__(self):
        self.items: list[str] = []

    def ok(self, text: str) -> None:
        self.items.append(text)

    def require(self, holds: bool, problem: str) -> None:
        if not holds:
            raise CaseFailed("; ".join([*self.items, problem]))

    def __str__(self) -> str:
        return "; ".join(self.items)


def _first_difference(
    got: dict[int, float], want: dict[int, float], rel: float = 0.0
) -> str | None:
    if got.keys() != want.keys():
        missing = sorted(set(want) - set(got))[:3]
        extra = sorted(set(got) - set(want))[:3]
        return f"logged steps differ (missing {missing}, extra {extra})"
    for step in sorted(want):
        if abs(got[step] - want[step]) > rel * abs(want[step]):
            return f"step {step}: loss {got[step]!r} vs {want[step]!r} uninterrupted"
    return None


def _code(code: int) -> str:
    return f"exit {code} ({exit_codes.MEANING.get(code, 'a rank chose it')})"


def stop(r: Rehearsal) -> str:
    want, seen = r.baseline(), Seen()
    run = r.case_dir("stop")
    first = r.launch("stop", "first")
    first.wait_until(f"step {STOP_AFTER}", lambda: last_step(run) >= STOP_AFTER)
    first.signal(signal.SIGTERM)
    code = first.finish()
    stopped = summary(run)
    at = int(stopped.get("steps", 0))
    seen.require(code == exit_codes.STOPPED, f"SIGTERM at step {STOP_AFTER}: {_code(code)}")
    seen.require(stopped.get("status") == "stopped", f"summary status {stopped.get('status')!r}")
    seen.require(latest_checkpoint(run) == at, f"latest checkpoint is not step {at}")
    meta = read_meta(run / "checkpoints" / step_name(at)) or {}
    r.checkpoint = StopCheckpoint(
        float(meta.get("write_s") or 0.0),
        sum(int(n) for n in (meta.get("files") or {}).values()),
        checkpoint_bytes(r.cfg, 1)["total"],  # the real model's (launcher.plan)
        str(r.cfg.model.name),
    )
    seen.ok(f"SIGTERM: exit 143, stop checkpoint of step {at} in {r.checkpoint.measured_s:g} s")
    again = r.launch("stop", "resume")
    code = again.finish()
    seen.require(code == exit_codes.DONE, f"relaunch: {_code(code)}")
    seen.require(f"resumed from step {at}" in again.output(), f"relaunch did not resume from {at}")
    diff = _first_difference(losses(run), want)
    seen.require(diff is None, f"resumed from step {at}, but {diff}")
    seen.ok(
        f"relaunch resumed from step {at}; all {len(want)} losses equal the uninterrupted run's"
    )
    return str(seen)


def killed_rank(r: Rehearsal) -> str:
    want, seen = r.baseline(), Seen()
    run, victim = r.case_dir("killed_rank"), r.nproc - 1
    job = r.launch("killed_rank", torchrun_args=("--max-restarts=1",))
    job.wait_until(f"checkpoint of step {CHECKPOINT_INTERVAL}",
                   lambda: latest_checkpoint(run) >= CHECKPOINT_INTERVAL)  # fmt: skip
    pid = worker_pid(run, victim)
    seen.require(pid is not None, f"rank {victim} logged no pid")
    r.kill_pid(pid)
    seen.ok(f"SIGKILL to rank {victim} after step {latest_checkpoint(run)}'s checkpoint")
    code = job.finish()
    seen.require(code == exit_codes.DONE, f"with --max-restarts=1: {_code(code)}")
    log = (run / "logs" / "rank0.log").read_text(errors="replace")
    seen.require("resumed from step" in log, "the restarted ranks did not resume")
    diff = _first_difference(losses(run), want)
    seen.require(diff is None, f"restarted and resumed, but {diff}")
    seen.ok(
        f"restarted (--max-restarts=1), resumed, final loss {want[max(want)]:.6f} as uninterrupted"
    )
    return str(seen)


def hung_rank(r: Rehearsal) -> str:
    seen, culprit = Seen(), r.nproc - 1
    run = r.case_dir("hung_rank")
    fault = ["fault.kind=stall", f"fault.rank={culprit}", f"fault.step={HANG_STEP}",
             "fault.seconds=3600"]  # fmt: skip
    job = r.launch("hung_rank", extra=[*fault, *QUICK_WATCHDOG])
    marker = run / "logs" / f"fault.rank{culprit}"
    job.wait_until(f"stall of rank {culprit} at step {HANG_STEP}", marker.exists)
    seen.ok(f"rank {culprit} stalled at step {HANG_STEP}")
    try:
        code = job.finish(HANG_DETECT_S)
    except CaseFailed:
        seen.require(False, f"no hang detected within {HANG_DETECT_S:g} s (job killed)")
    seen.require(code == exit_codes.HANG, f"{_code(code)}, not 5")
    logs = run / "logs"
    stacks = [r_ for r_ in range(r.nproc) if (logs / f"stacks.rank{r_}.txt").is_file()]
    seen.require(bool(stacks), "exit 5 but no stacks in logs/")
    recorded = (
        sorted(p.name for p in (logs / "fr").glob("rank_*")) if (logs / "fr").is_dir() else []
    )
    if r.cfg.watchdog.flight_recorder_entries:
        seen.require(bool(recorded), "no flight-recorder dump in logs/fr/")
    seen.ok(f"exit 5, stacks of ranks {stacks}, {len(recorded)} flight-recorder dump(s)")
    result = analyze_hang(run)
    write_hang_report(run, result)
    named = result["culprits"] or "no rank"
    seen.require(result["culprits"] == [culprit], f"launcher.analyze names {named}, not {culprit}")
    seen.ok(f"launcher.analyze: culprit rank {culprit} ({result['ranks'][culprit]['where']})")
    return str(seen)


def world_size(r: Rehearsal) -> str:
    want, seen = r.baseline(), Seen()
    mid = [s for s in r.baseline_checkpoints() if s < STEPS]
    seen.require(bool(mid), "the uninterrupted run kept no mid-run checkpoint")
    start, half = mid[-1], r.nproc // 2
    source = r.case_dir("baseline") / "checkpoints" / step_name(start)
    job = r.launch("world_size", extra=[f"resume={source}"], nproc=half)
    code = job.finish()
    out = job.output()
    if code == exit_codes.BAD_INPUT:
        errors = [ln for ln in out.splitlines() if ln.startswith("error: ")]
        seen.require(len(errors) == 1, f"refused with {len(errors)} error lines, not one")
        seen.ok(f"resume on {half} rank(s) refused in one line: {errors[0][7:]}")
        return str(seen)
    seen.require(
        code == exit_codes.DONE, f"resume of step {start} on {half} rank(s): {_code(code)}"
    )
    seen.require(f"resumed from step {start}" in out, f"did not resume from step {start}")
    after = {s: v for s, v in want.items() if s > start}
    diff = _first_difference(losses(r.case_dir("world_size")), after, WORLD_SIZE_TOLERANCE)
    seen.require(diff is None, f"resumed on {half} rank(s), but {diff}")
    seen.ok(f"step {start} of {r.nproc} ranks resumed on {half}; losses {start + 1}-{STEPS} "
            f"within {WORLD_SIZE_TOLERANCE:g} of the uninterrupted run's")  # fmt: skip
    return str(seen)


def slow_rank(r: Rehearsal) -> str:
    seen, slow = Seen(), r.nproc - 1
    run = r.case_dir("slow_rank")
    fault = ["fault.kind=slow", f"fault.rank={slow}", "fault.step=3",
             f"fault.seconds={SLOW_SECONDS}", f"trainer.max_steps={SLOW_STEPS}"]  # fmt: skip
    code = r.launch("slow_rank", extra=fault).finish()
    seen.require(code == exit_codes.DONE, f"{_code(code)}")
    named = [(m["step"], m.get("straggler/rank")) for m in records(run) if "loss" in m]
    ranks = {rank for _, rank in named if rank is not None}
    seen.require(bool(ranks), f"rank {slow} slept {SLOW_SECONDS} s a step; no straggler/rank named")
    seen.require(ranks == {slow}, f"metrics named rank(s) {sorted(ranks)}, not {slow}")
    first = min(step for step, rank in named if rank == slow)
    seen.ok(
        f"rank {slow} {SLOW_SECONDS} s slower a step from step 3: "
        f"straggler/rank={slow} from step {first}"
    )
    return str(seen)


def bad_input(r: Rehearsal) -> str:
    seen, run = Seen(), r.case_dir("bad_input")
    job = r.launch("bad_input", extra=[BAD_OVERRIDE])
    code = job.finish()
    out = job.output()
    errors = [ln for ln in out.splitlines() if ln.startswith("error: ")]
    seen.require(code == exit_codes.BAD_INPUT, f"{BAD_OVERRIDE}: {_code(code)}, not 2")
    seen.require(len(errors) == 1, f"{len(errors)} error lines, not one")
    started = run.exists() or "process group created" in out
    seen.require(not started, "refused, but the run had started (run directory or process group)")
    seen.ok(f"{BAD_OVERRIDE}: exit 2, nothing started: {errors[0][7:]}")
    return str(seen)


def cluster(r: Rehearsal) -> str:
    """The job launcher.submit would render, with the checks it makes against the stop
    checkpoint's time (the rehearsal's figure, when the stop case ran, else submit's own)."""
    seen, target = Seen(), str(r.cfg.cluster.name)
    renderer = backend(target).renderer()
    try:
        job = prepare(target, [*r.user_overrides, f"run.root={r.run_dir.parent}",
                               f"run.id={r.run_dir.name}"])  # fmt: skip
        files = renderer.render(job)
    except ConfigError as exc:
        seen.require(False, f"launcher.submit {target} refuses it: {exc}")
    out = r.case_dir("cluster")
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (out / name).write_text(text)
    key = f"cluster.{target}"
    group = r.cfg.cluster[target]
    checks = getattr(renderer, "rehearse", None)  # the backend's, of its section
    if checks:
        checks(seen, group, key, stop_time.checkpoint_write(job, group, key))
    return str(seen)


@dataclass(frozen=True)
class Case:
    name: str
    fault: str
    expected: str
    run: Callable[[Rehearsal], str]
    needs_cluster: bool = False
    evidence: str = ""  # under rehearse/; empty: the case's run directory

    def __post_init__(self):
        if not self.evidence:
            object.__setattr__(self, "evidence", self.name)


CASES = (
    Case("stop", "stop (SIGTERM mid-run)",
         "stop checkpoint, exit 143; relaunch resumes to the uninterrupted losses exactly", stop),
    Case("killed_rank", "killed rank (SIGKILL)",
         "elastic restart (--max-restarts=1) resumes; same losses as uninterrupted", killed_rank),
    Case("hung_rank", "hung rank (fault.kind=stall)",
         "hang detected, stacks and recorder dumped, exit 5, launcher.analyze names the rank",
         hung_rank),
    Case("world_size", "world-size change (half the ranks)",
         "resumes on half the ranks with the same losses (within fp32 reordering), "
         "or a one-line refusal", world_size),
    Case("slow_rank", "slow rank (fault.kind=slow)",
         "named as the straggler in metrics (straggler/rank)", slow_rank),
    Case("bad_input", "bad input (a misspelt key)",
         "refused in one line, exit 2, nothing started", bad_input,
         evidence="console/bad_input.txt"),
    Case("cluster", "the rendered cluster job",
         "renders; grace period or signal lead holds the stop checkpoint; restarts limited",
         cluster, needs_cluster=True),
)  # fmt: skip
NAMES = tuple(c.name for c in CASES)
