"""Hang detection: notice when no step completes, say where every rank is, exit with 5.

A rank that stops making progress (a stalled process, a collective another rank never
enters, a dead link) otherwise holds the others until `dist.timeout_s` runs out, and then
nothing says which rank, where or why. A daemon thread on every rank compares the time
since the last completed step with a limit derived from the recent step times; when the
limit passes, every rank that can still run writes

- `logs/stacks.rank<r>.txt`: the Python stack of every thread,
- `logs/hang.rank<r>.json`: rank, host, pid, last completed step, phase, the main thread's
  frames (what `python -m launcher.analyze` reads to name the culprit),
- `logs/fr/rank_<r>`: the flight recorder's buffer of recent collectives (torch's
  `fr_trace` reads the folder), where the process group keeps one,

and the process exits with exit_codes.HANG so that torchrun, Slurm or Kubernetes restarts
the job from its last complete checkpoint. A rank that cannot run at all (stopped, stuck in
the kernel) writes nothing, and that absence names it.

Each rank's limit comes from its own step times, so the ranks of one hung job notice at
different moments; the first to exit makes torchrun stop the others, which then wrote
nothing and were named as the culprit (and torch's `fr_trace` refused the folder: "Missing
dump files from ranks {1}"). So a rank that declares a hang says so first
(`logs/hang.declared`) and waits, a few of the watchdog's polls at most, for the others'
records, and a rank whose watchdog finds that declaration of this job writes its own at
once and exits the same way: every rank that can run writes, whichever noticed first.
Each record also names the ranks of its own node that are stopped (SIGSTOP: state T in
/proc): they will never write, so the wait ends as soon as every rank is either written or
named stopped by a rank beside it, not at its deadline (5 s with a 10 s allowance).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import statistics
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

from omegaconf import DictConfig

from launcher.resilience import bad_hosts, exit_codes
from launcher.resilience.hang_verdict import analyze_hang
from launcher.runtime.nccl_capture import FR_BUFFER_ENV, FR_LEGACY_ENV
from launcher.runtime.placement import node_name
from launcher.runtime.process_tree import children, stopped_workers

log = logging.getLogger("launcher")

DECLARED = "hang.declared"  # in logs/: the rank that declared a hang, and when


# The watchdog of this process's job, if one is running: what a stop request asks (which
# phase the rank is in, and whether it can be cut short).
_current: list[HangWatchdog] = []


def job_started() -> bool:
    """Whether this process's job has begun (its watchdog runs)."""
    return bool(_current)


def current_phase() -> str:
    """The phase this rank is in ("start-up" before its job's watchdog starts)."""
    return _current[-1].current_phase() if _current else "start-up"


# The phases a stop request cuts short (a step ends within a step, an eval between two
# batches); the others (config.schema.PHASES) each have their own allowance (docs/faults.md).
CUT_SHORT = ("training", "eval")


def can_be_cut_short(phase: str) -> bool:
    """Whether a stop request in `phase` is acted on within a step or an eval batch."""
    return phase in CUT_SHORT or phase.startswith("after ")


class HangWatchdog:
    """Call `begin_steps(step)` before the first step, `step_done(step)` after every step,
    and wrap the other stretches in `phase(...)`.

    Every phase has its own allowance, said in the hang line: after a step,
    max(min_s, step_multiple x median of the recent step times); start-up (data
    preparation, model build, resume) startup_s; the first step of a launch (compilation,
    warm-up) first_step_s; an eval step_multiple x its batches x the measured step time; a
    checkpoint or a profiler flush checkpoint_s the first time, then step_multiple x the
    longest earlier one (the state, or the trace, is the same size every time; with
    `async_writes` never below checkpoint_s, as a write still going on is waited for inside
    the next one); the end of the run (the profiler's final close) a flush's. Every allowance
    is at least min_s. `on_hang` runs in the watchdog thread before the dumps (rank 0 uses it
    to write summary.json).
    """

    def __init__(
        self,
        cfg: DictConfig,
        *,
        rank: int,
        run_dir: Path,
        start_step: int,
        on_hang: Callable[[int], None],
        async_writes: bool = False,
        record_culprits: bool = False,
    ):
        self.cfg = cfg
        self.record_culprits = record_culprits  # exclude.hang: the culprits' hosts to bad_hosts
        self.rank = rank
        self.run_dir = run_dir
        self.on_hang = on_hang
        self.async_writes = async_writes
        self._lock = threading.Lock()
        self._durations: deque[float] = deque(maxlen=20)
        self._last_step_s: float | None = None  # any step's, the first one's too
        self._longest: dict[str, float] = {}  # the longest time each phase took so far
        self._last = time.monotonic()
        self._step = start_step
        self._phase = "start-up"
        self._limit, self._why = cfg.startup_s, "watchdog.startup_s"
        self._started = time.time()  # a peer's record older than this is another job's
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="launcher-watchdog", daemon=True)
        _current[:] = [self]
        if cfg.enabled:
            self._thread.start()

    @property
    def step(self) -> int:
        """The last step completed (the start step before the first)."""
        return self._step

    def begin_steps(self, step: int) -> None:
        """Start-up is over: the first step of this launch comes (compilation, warm-up)."""
        with self._lock:
            self._step, self._phase, self._last = step, "first step", time.monotonic()
            self._limit, self._why = self.cfg.first_step_s, "watchdog.first_step_s"

    def step_done(self, step: int) -> None:
        now = time.monotonic()
        with self._lock:
            if self._phase == "training":
                self._durations.append(now - self._last)
            if not self._phase.startswith("after "):
                self._last_step_s = now - self._last
            self._last, self._step, self._phase = now, step, "training"
            self._limit, self._why = self._step_allowance()

    def _step_allowance(self) -> tuple[float, str]:
        # Until steps are timed, the first one's time (compilation included) is the estimate:
        # storage that makes every step slow must not make the second one a hang.
        recent = self._step_estimate()
        limit = self.cfg.step_multiple * recent
        if limit <= self.cfg.min_s:
            return self.cfg.min_s, "watchdog.min_s"
        return limit, f"watchdog.step_multiple x the step time {recent:.3g} s"

    def _step_estimate(self) -> float:
        """The median of the recent step times, or the first step's (lock held)."""
        return statistics.median(self._durations) if self._durations else self._last_step_s or 0.0

    def allowance(self, name: str, *, batches: int = 0) -> tuple[float, str]:
        """The allowance of phase `name` now, and how it was reached (for the hang line)."""
        c = self.cfg
        with self._lock:
            if name == "eval":
                step_s = self._step_estimate()
                limit = c.step_multiple * batches * step_s
                why = f"watchdog.step_multiple x {batches} batches x the step time {step_s:.3g} s"
            else:
                measured = name if name != "end of run" else "profiler flush"
                took = self._longest.get(measured)
                if took is None:
                    return c.checkpoint_s, "watchdog.checkpoint_s"
                limit = c.step_multiple * took
                why = f"watchdog.step_multiple x the longest earlier {measured} {took:.3g} s"
                if self.async_writes and name == "checkpoint" and limit < c.checkpoint_s:
                    return c.checkpoint_s, "watchdog.checkpoint_s (asynchronous checkpoints)"
        return (limit, why) if limit > c.min_s else (c.min_s, "watchdog.min_s")

    @contextlib.contextmanager
    def phase(self, name: str, *, batches: int = 0, step: int | None = None) -> Iterator[None]:
        """A stretch that is not a step, with its own allowance (see `allowance`); it does
        not count as a step time, and how long it took sets its next allowance. `step`: the
        step it follows, when that step is not yet `step_done` (an eval, a checkpoint)."""
        limit, why = self.allowance(name, batches=batches)
        with self._lock:
            self._step = self._step if step is None else step
            saved = (self._phase, self._limit, self._why)
            self._phase, self._limit, self._why = name, limit, why
            self._last = started = time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                now = time.monotonic()
                self._longest[name] = max(self._longest.get(name, 0.0), now - started)
                self._phase, self._limit, self._why = saved
                self._last = now
                if self._phase == "training":
                    self._phase = "after " + name  # the next interval is not a step time

    def current_phase(self) -> str:
        with self._lock:
            return self._phase

    def retire(self) -> None:
        """The job is over: leave the process's current watchdog, so that a stop request
        between jobs is the next one's start-up, and nothing of this job (its loop, through
        `on_hang`, and the loop's model and engine) stays reachable once the job lets go."""
        if self in _current:
            _current.remove(self)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        with self._lock:
            self._phase = "end of run"  # what is left: the sinks, summary.json, teardown

    # -- the watchdog thread -------------------------------------------------------------
    def _poll_s(self) -> float:
        return min(1.0, self.cfg.min_s / 10)

    def _watch(self) -> None:
        while not self._stop.wait(self._poll_s()):
            with self._lock:
                idle = time.monotonic() - self._last
                limit, why, step, phase = self._limit, self._why, self._step, self._phase
            if idle > limit:
                self._fire(idle, limit, step, phase, why)
            elif (peer := self.peer_declaring()) is not None:
                self._fire(idle, limit, step, phase, why, declared_by=peer)

    def peer_declaring(self) -> int | None:
        """The rank that declared a hang during this job (`logs/hang.declared`), if another.
        One file, so that each rank's poll is one lookup on a shared file system, whatever
        the number of ranks."""
        declared = self._record(self.run_dir / "logs" / DECLARED)
        if declared is None or declared.get("rank") == self.rank:
            return None
        return declared.get("rank")

    def await_peers(self, world: int) -> list[int]:
        """Wait (a few polls at most) until every other rank of `world` has written its
        record of this job; the ranks that have not, when the wait ends. One listing of
        logs/ a tenth of a second, each record read once it is there."""
        if world <= 1:
            return []
        logs = self.run_dir / "logs"
        deadline = time.monotonic() + 3 * self._poll_s() + 2.0
        wrote, stopped = {self.rank}, set(stopped_peers())
        while True:
            with contextlib.suppress(OSError):
                names = set(os.listdir(logs))
                for r in range(world):
                    if r not in wrote and f"hang.rank{r}.json" in names:
                        record = self._record(logs / f"hang.rank{r}.json")
                        if record is not None:
                            wrote.add(r)
                            stopped |= set(record.get("stopped_peers") or [])
            missing = [r for r in range(world) if r not in wrote]
            if set(missing) <= stopped or time.monotonic() > deadline:
                return missing
            time.sleep(0.1)

    def _record(self, path: Path) -> dict | None:
        """The JSON record at `path` if it was written during this job (a record of an
        earlier attempt, or one being written, is None)."""
        try:
            record = json.loads(path.read_text())
            return record if record["time"] >= self._started else None
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _fire(
        self,
        idle: float,
        limit: float,
        step: int,
        phase: str,
        why: str,
        declared_by: int | None = None,
    ) -> None:
        logs = self.run_dir / "logs"
        if declared_by is None:
            with contextlib.suppress(OSError):  # first: the others write theirs meanwhile
                (logs / DECLARED).write_text(json.dumps({"rank": self.rank, "time": time.time()}))
            log.error(
                "hang: no progress for %.0f s (%s allowance %.0f s: %s) on rank %d after step "
                "%d (%s); stacks in %s, flight recorder in %s; exiting with code %d so the job "
                "restarts from its last checkpoint (see docs/faults.md)",
                idle,
                phase,
                limit,
                why,
                self.rank,
                step,
                phase,
                logs / f"stacks.rank{self.rank}.txt",
                logs / "fr",
                exit_codes.HANG,
            )
        else:
            log.error(
                "hang: rank %d declared a hang; rank %d (%.0f s since its last progress, %s "
                "after step %d) writes its stacks and flight recorder too and exits with code %d",
                declared_by,
                self.rank,
                idle,
                phase,
                step,
                exit_codes.HANG,
            )
        for write in (self._write_stacks, self._write_flight_recorder):
            try:
                write(logs, idle=idle, limit=limit, step=step, phase=phase)
            except Exception as exc:  # noqa: BLE001 - write what can be written, then exit
                log.error("hang: could not write %s: %s", write.__name__, exc)
        with contextlib.suppress(Exception):
            self.on_hang(step)
        missing = self.await_peers(int(os.environ.get("WORLD_SIZE", "1")))
        if missing and declared_by is None:
            log.error("hang: no record from rank(s) %s: they could not run", missing)
            end_stopped_peers(missing)
        # One rank records the verdict: the declaration's last writer (every rank that fired
        # by its own allowance wrote it). The others exit at once: torchrun restarts the job
        # only when every rank of the attempt has ended.
        if declared_by is None and self.record_culprits and self.peer_declaring() is None:
            with contextlib.suppress(Exception):  # the exit and its stacks come first
                keep_culprits_off(self.run_dir, step, self._started)
        exit_codes.report(exit_codes.HANG)
        logging.shutdown()
        os._exit(exit_codes.HANG)

    def _write_stacks(self, logs: Path, *, idle: float, limit: float, step: int, phase: str):
        frames = sys._current_frames()
        names = {t.ident: t.name for t in threading.enumerate()}
        text = []
        for ident, frame in frames.items():
            text.append(f"--- thread {names.get(ident, ident)}\n")
            text.extend(traceback.format_stack(frame))
        (logs / f"stacks.rank{self.rank}.txt").write_text("".join(text))
        main = frames.get(threading.main_thread().ident)
        record = {
            "rank": self.rank,
            "host": node_name(),
            "pid": os.getpid(),
            "step": step,
            "phase": phase,
            "idle_s": round(idle, 3),
            "limit_s": round(limit, 3),
            "time": time.time(),
            "stopped_peers": stopped_peers(),
            "main_stack": [
                {"file": f.filename, "line": f.lineno, "function": f.name}
                for f in (traceback.extract_stack(main) if main is not None else [])
            ],
        }
        (logs / f"hang.rank{self.rank}.json").write_text(json.dumps(record, indent=1))

    def _write_flight_recorder(self, logs: Path, **_) -> None:
        if int(os.environ.get(FR_BUFFER_ENV, os.environ.get(FR_LEGACY_ENV, "0"))) <= 0:
            return
        from torch._C._distributed_c10d import _dump_fr_trace

        folder = logs / "fr"
        folder.mkdir(exist_ok=True)
        dump = with_process_groups(_dump_fr_trace(True, True, False))
        (folder / f"rank_{self.rank}").write_bytes(dump)


def keep_culprits_off(run_dir: Path, step: int, since: float) -> None:
    """The hang verdict's culprits (launcher.resilience.hang_verdict: what `launcher.analyze`
    names), their hosts recorded in bad_hosts with the reason (exclude.hang). A rank that
    wrote no record because it had already ended on an error of its own since `since` (its
    peer lost, say) is not the hang's culprit: its host is not recorded."""
    verdict = analyze_hang(run_dir)
    found = {}
    for rank in verdict["culprits"]:
        host = verdict["ranks"][rank]["host"]
        if host and not ended_on_error(run_dir / "logs" / f"rank{rank}.log", since):
            found.setdefault(host, f"hang: rank {rank} {verdict['reason']} (after step {step})")
    if found:
        bad_hosts.record(run_dir, found)
        log.error("hang: the culprit's host(s) %s go to bad_hosts, kept off the run's next "
                  "attempts (exclude.hang=false keeps them)", ", ".join(found))  # fmt: skip


LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) \[rank \d+\] ERROR ")


def ended_on_error(rank_log: Path, since: float) -> bool:
    """Whether the rank's log (its last 64 KiB) holds an error line written since `since`."""
    try:
        with open(rank_log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 65536))
            tail = f.read().decode(errors="replace")
    except OSError:
        return False
    for line in tail.splitlines():
        m = LOG_TIME.match(line)
        if m and time.mktime(time.strptime(m[1], "%Y-%m-%d %H:%M:%S")) + int(m[2]) / 1e3 >= since:
            return True
    return False


def stopped_peers() -> list[int]:
    """The ranks beside this one (children of its parent: torchrun's agent, or a warm
    start's fork server) that are stopped: they cannot write a hang record."""
    found = stopped_workers(children(os.getppid()), exit_codes.rank_of_pid)
    return sorted(int(r) for pid, r in found.items() if r.isdigit() and pid != os.getpid())


def end_stopped_peers(missing: list[int]) -> None:
    """SIGKILL the ranks of `missing` that are stopped (SIGSTOP) on this node, children of
    the same parent (torchrun's agent): they cannot take the SIGTERM torchrun sends once
    this rank exits, so plain torchrun would wait its fixed 30 s before its SIGKILL, and
    the job would end past the documented 90 s after the freeze."""
    for pid, rank in stopped_workers(children(os.getppid()), exit_codes.rank_of_pid).items():
        if rank.isdigit() and int(rank) in missing and pid != os.getpid():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                log.error("hang: rank %s (pid %d) is stopped (SIGSTOP) and cannot take "
                          "SIGTERM; killed it", rank, pid)  # fmt: skip


def with_process_groups(dump: bytes) -> bytes:
    """The flight recorder's dump with its table of process groups filled in where torch
    left it empty (its gloo recorder does, in torch 2.13), so that torch's own analyser,
    `python -m torch.distributed.flight_recorder.fr_trace`, can read it: every group of
    this process by name, with its description and its ranks."""
    import pickle

    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    record = pickle.loads(dump)
    if any(pg.get("ranks", "[]") != "[]" for pg in record.get("pg_config", {}).values()):
        return dump
    groups = {}
    for pg, name in c10d._world.pg_names.items():  # no public list of a process's groups
        desc = getattr(pg, "group_desc", "undefined")
        groups[name] = {"name": name, "desc": desc, "ranks": str(dist.get_process_group_ranks(pg))}
    record["pg_config"] = groups
    return pickle.dumps(record)
