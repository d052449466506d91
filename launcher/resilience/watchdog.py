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
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import statistics
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

from omegaconf import DictConfig

from launcher.resilience import exit_codes

log = logging.getLogger("launcher")

FR_BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
FR_LEGACY_ENV = "TORCH_NCCL_TRACE_BUFFER_SIZE"  # the NCCL-only name older torch reads


def enable_flight_recorder(entries: int) -> None:
    """Ask the process group (created after this) to keep its last `entries` collectives.

    Only when the user set neither variable: theirs wins. Must run before the group exists.
    """
    if entries > 0 and FR_BUFFER_ENV not in os.environ and FR_LEGACY_ENV not in os.environ:
        os.environ[FR_BUFFER_ENV] = str(entries)


class HangWatchdog:
    """Call `step_done(step)` after every step and wrap long phases in `phase(...)`.

    The limit after a step is max(min_s, step_multiple x median of the recent step times);
    the first step gets first_step_s, a checkpoint checkpoint_s. `on_hang` runs in the
    watchdog thread before the dumps (rank 0 uses it to write summary.json).
    """

    def __init__(
        self,
        cfg: DictConfig,
        *,
        rank: int,
        run_dir: Path,
        start_step: int,
        on_hang: Callable[[int], None],
    ):
        self.cfg = cfg
        self.rank = rank
        self.run_dir = run_dir
        self.on_hang = on_hang
        self._lock = threading.Lock()
        self._durations: deque[float] = deque(maxlen=20)
        self._last = time.monotonic()
        self._step = start_step
        self._phase = "first step"
        self._limit = cfg.first_step_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="launcher-watchdog", daemon=True)
        if cfg.enabled:
            self._thread.start()

    def step_done(self, step: int) -> None:
        now = time.monotonic()
        with self._lock:
            if self._phase == "training":
                self._durations.append(now - self._last)
            self._last, self._step, self._phase = now, step, "training"
            recent = statistics.median(self._durations) if self._durations else 0.0
            self._limit = max(self.cfg.min_s, self.cfg.step_multiple * recent)

    @contextlib.contextmanager
    def phase(self, name: str, limit_s: float | None = None) -> Iterator[None]:
        """A stretch that is not a step (a checkpoint, an eval): its own limit (None: the
        current one, a step's), and it does not count as a step time."""
        with self._lock:
            saved = (self._phase, self._limit)
            limit = self._limit if limit_s is None else limit_s
            self._phase, self._limit, self._last = name, limit, time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                self._phase, self._limit = saved
                self._last = time.monotonic()
                if self._phase == "training":
                    self._phase = "after " + name  # the next interval is not a step time

    def progress(self) -> None:
        """Part of a phase is done (one eval batch): the limit applies to each part, so
        a phase of many parts is never a hang for its length alone."""
        with self._lock:
            self._last = time.monotonic()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    # -- the watchdog thread -------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, self.cfg.min_s / 10)):
            with self._lock:
                idle = time.monotonic() - self._last
                limit, step, phase = self._limit, self._step, self._phase
            if idle > limit:
                self._fire(idle, limit, step, phase)

    def _fire(self, idle: float, limit: float, step: int, phase: str) -> None:
        logs = self.run_dir / "logs"
        log.error(
            "hang: no progress for %.0f s (limit %.0f s) on rank %d after step %d (%s); "
            "stacks in %s, flight recorder in %s; exiting with code %d so the job restarts "
            "from its last checkpoint (see docs/faults.md)",
            idle,
            limit,
            self.rank,
            step,
            phase,
            logs / f"stacks.rank{self.rank}.txt",
            logs / "fr",
            exit_codes.HANG,
        )
        for write in (self._write_stacks, self._write_flight_recorder):
            try:
                write(logs, idle=idle, limit=limit, step=step, phase=phase)
            except Exception as exc:  # noqa: BLE001 - write what can be written, then exit
                log.error("hang: could not write %s: %s", write.__name__, exc)
        with contextlib.suppress(Exception):
            self.on_hang(step)
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
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "step": step,
            "phase": phase,
            "idle_s": round(idle, 3),
            "limit_s": round(limit, 3),
            "time": time.time(),
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
        (folder / f"rank_{self.rank}").write_bytes(_dump_fr_trace(True, True, False))
