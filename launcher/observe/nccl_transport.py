"""env.json's `nccl_transport`: every rank's NCCL log summarised (launcher.observe.nccl_log) and
gathered by rank 0, as a sink that acts once, at the first logged interval."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from launcher.observe.nccl_log import merge, parse_nccl_log
from launcher.observe.sinks import Sink
from launcher.paths import atomic_write
from launcher.runtime.nccl_capture import read_own_log
from launcher.runtime.process import Runtime


class TransportRecorder(Sink):
    """At the first logged interval, every rank parses its NCCL log; rank 0 writes them all
    to env.json as `nccl_transport`: `ranks` (one summary per rank, with `rank`, `host` and
    `log`, the log's path relative to the run directory) and `job` (see `merge`).

    The gather is a collective on the CPU control group: it relies on the loop calling its
    sinks on every rank at the same steps, which it does (rank 0 merely has more sinks).
    """

    def __init__(self, rt: Runtime):
        self.rt = rt
        self.done = False

    def log(self, record: dict) -> None:
        if self.done:
            return
        self.done = True
        from launcher.runtime.envinfo import nccl_version  # torch: only where training runs

        entry = {
            "rank": self.rt.rank,
            "host": socket.gethostname(),
            "nccl_library": nccl_version(),  # only rank 0's log names the version
            "log": None,
        }
        capture = self.rt.launch.nccl_capture
        try:
            text = read_own_log(capture)
            if text is not None:
                path = capture.path.resolve()
                run_dir = self.rt.run_dir.resolve()
                entry["log"] = str(
                    path.relative_to(run_dir) if path.is_relative_to(run_dir) else path
                )
                entry.update(parse_nccl_log(text))
        except OSError as exc:  # every rank must still reach the gather
            entry["error"] = f"reading NCCL's log failed: {exc}"
        entries = self.rt.all_gather_objects(entry)
        if self.rt.is_main:
            write_transport(self.rt.run_dir, entries)


def write_transport(run_dir: Path, entries: list[dict]) -> None:
    """Add `nccl_transport` to the run's env.json (written whole, then renamed)."""
    path = run_dir / "env.json"
    env = json.loads(path.read_text()) if path.exists() else {}
    env["nccl_transport"] = {"job": merge(entries), "ranks": entries}
    atomic_write(path, json.dumps(env, indent=1))


def transport_recorders(rt: Runtime) -> list[Sink]:
    """The recorder when this job's NCCL writes a log the launcher reads, else nothing."""
    captured = rt.launch.nccl_capture is not None
    return [TransportRecorder(rt)] if captured and rt.backend == "nccl" else []
