"""Name the culprit of a detected hang from what the watchdog left in `logs/`: the verdict
`python -m launcher.analyze` reports, and the one the watchdog's declaring rank records in
the run directory's `bad_hosts` (launcher.resilience.bad_hosts) as the job ends.

Evidence, strongest first:
1. A rank that wrote no `hang.rank<r>.json` could not run at all when the others noticed
   the hang (stopped, swapped out, stuck in the kernel or a driver): it is the culprit.
2. The flight recorder (`fr/rank_<r>`): per process group, the last collective each rank
   enqueued. Ranks waiting in collective #n while another rank's last is below n are
   waiting for that rank: it never entered the collective.
3. The main thread's Python stack: a rank whose innermost frames are not in a collective
   or in the backward pass that runs them was busy elsewhere, and its frame says where.

Reads no torch: the recorder's dumps are pickles of plain Python values, loaded with an
unpickler that refuses anything else.
"""

from __future__ import annotations

import io
import json
import pickle
import re
from pathlib import Path

# Frames that mean "waiting for other ranks": torch.distributed calls, the autograd
# engine running DDP's all-reduce hooks, the launcher's own collectives.
WAITING_FILES = ("torch/distributed/", "torch/autograd/", "launcher/resilience/preemption.py")
WAITING_FUNCTIONS = (
    "all_gather_floats",
    "all_gather_objects",
    "gather_objects",
    "broadcast_object",
    "barrier",
)
RANK_LINE = re.compile(r"rank (\d+)/\d+ \(local \d+, pid (\d+)\) on host (\S+),")


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"unexpected object {module}.{name} in a recorder dump")


def load_flight_recorder(path: Path) -> dict:
    return _PlainUnpickler(io.BytesIO(path.read_bytes())).load()


def has_hang(run_dir: Path) -> bool:
    return any((run_dir / "logs").glob("hang.rank*.json"))


def _world_size(run_dir: Path, skipped: list[str]) -> int:
    """env.json's world size; else (no env.json, or one that does not say: noted in
    `skipped`) the number of rank logs."""
    env = run_dir / "env.json"
    if env.is_file():
        try:
            world = json.loads(env.read_text())["world_size"]
            if isinstance(world, int) and not isinstance(world, bool) and world > 0:
                return world
            skipped.append(f"{env}: its world_size is {world!r}, not a number of ranks")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            skipped.append(f"{env}: unreadable ({type(exc).__name__})")
    return len(list((run_dir / "logs").glob("rank*.log")))


def _hang_records(logs: Path, skipped: list[str]) -> dict[int, dict]:
    """Each rank's logs/hang.rank<r>.json; one that is not a record is noted in `skipped`
    and its rank counts as silent."""
    records = {}
    for path in sorted(logs.glob("hang.rank*.json")):
        try:
            record = json.loads(path.read_text())
            if not isinstance(record, dict) or not isinstance(record.get("main_stack"), list):
                raise TypeError("not a hang record")
            records[int(path.stem.removeprefix("hang.rank"))] = record
        except (OSError, ValueError, TypeError) as exc:
            skipped.append(f"{path}: not a hang record ({type(exc).__name__})")
    return records


def _identities(run_dir: Path) -> dict[int, dict]:
    """Host and pid of each rank's latest attempt, from the first line its log has."""
    out: dict[int, dict] = {}
    for path in (run_dir / "logs").glob("rank*.log"):
        for match in RANK_LINE.finditer(path.read_text(errors="replace")):
            out[int(match[1])] = {"pid": int(match[2]), "host": match[3]}
    return out


def _where(stack: list[dict]) -> str:
    """The innermost frame of the launcher's own code (or the innermost at all)."""
    own = [f for f in stack if "/launcher/" in f["file"]]
    frame = (own or stack or [{"file": "?", "line": 0, "function": "?"}])[-1]
    return f"{Path(frame['file']).name}:{frame['line']} in {frame['function']}"


def _waiting(stack: list[dict]) -> bool:
    inner = stack[-6:]
    return any(
        any(w in f["file"] for w in WAITING_FILES) or f["function"] in WAITING_FUNCTIONS
        for f in inner
    )


def _pending_collectives(fr: dict) -> dict[str, dict]:
    """Per process group: the last collective this rank enqueued, with where it came from."""
    last: dict[str, dict] = {}
    for entry in fr.get("entries", []):
        pg = str(entry["pg_id"])
        if pg not in last or entry["collective_seq_id"] >= last[pg]["seq"]:
            frames = [f["name"] for f in entry.get("frames", [])]
            last[pg] = {
                "seq": entry["collective_seq_id"],
                "op": entry["profiling_name"],
                "from": " <- ".join(frames[:4]),
            }
    return last


def analyze_hang(run_dir: Path) -> dict:
    """The culprit and the evidence, as a dict (see `markdown_hang` for the wording)."""
    logs = run_dir / "logs"
    skipped: list[str] = []
    world = _world_size(run_dir, skipped)
    ids = _identities(run_dir)
    reports = _hang_records(logs, skipped)
    recorders = {}
    for path in sorted((logs / "fr").glob("rank_*")) if (logs / "fr").is_dir() else []:
        try:
            recorders[int(path.name.removeprefix("rank_"))] = _pending_collectives(
                load_flight_recorder(path)
            )
        except (pickle.UnpicklingError, EOFError, KeyError, ValueError, TypeError,
                AttributeError, IndexError, OSError) as exc:  # fmt: skip
            skipped.append(f"{path}: not a flight-recorder dump ({type(exc).__name__})")
    silent = [r for r in range(world) if r not in reports]
    behind = _behind_in_collectives(recorders)
    busy = [r for r, rep in sorted(reports.items()) if not _waiting(rep["main_stack"])]
    if silent:
        culprits, reason = (
            silent,
            (
                "wrote no stacks: the process could not run at all (stopped, swapped out, or "
                "stuck in the kernel or a driver)"
            ),
        )
    elif behind:
        culprits, reason = (
            sorted(behind),
            "never entered the collective that the other ranks wait in",
        )
    elif busy:
        culprits, reason = busy, "was busy in its own code, not in a collective"
    else:
        culprits, reason = [], "every rank waits in a collective (a network or peer problem)"
    steps = [rep["step"] for rep in reports.values()]
    ranks = []
    for r in range(world):
        rep = reports.get(r)
        ranks.append(
            {
                "rank": r,
                "host": (rep or {}).get("host") or ids.get(r, {}).get("host"),
                "pid": (rep or {}).get("pid") or ids.get(r, {}).get("pid"),
                "reported": rep is not None,
                "step": rep["step"] if rep else None,
                "phase": rep["phase"] if rep else None,
                "where": _where(rep["main_stack"]) if rep else None,
                "waiting": _waiting(rep["main_stack"]) if rep else None,
                "last_collectives": recorders.get(r, {}),
            }
        )
    return {
        "culprits": culprits,
        "reason": reason,
        "step": min(steps) if steps else None,
        "idle_s": max((rep["idle_s"] for rep in reports.values()), default=None),
        "ranks": ranks,
        "skipped": skipped,
    }


def _behind_in_collectives(recorders: dict[int, dict[str, dict]]) -> set[int]:
    """Ranks whose last enqueued collective in some group is below the others' last."""
    behind: set[int] = set()
    groups = {pg for per_rank in recorders.values() for pg in per_rank}
    for pg in groups:
        seqs = {r: per_rank[pg]["seq"] for r, per_rank in recorders.items() if pg in per_rank}
        if len(seqs) > 1 and len(set(seqs.values())) > 1:
            top = max(seqs.values())
            behind |= {r for r, s in seqs.items() if s < top}
    return behind
