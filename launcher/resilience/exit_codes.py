"""The exit codes: a contract with schedulers, kept here and in docs/faults.md only.

Slurm (`--requeue` decisions in the sbatch script), a Kubernetes `podFailurePolicy` and
PyTorchJob's `restartPolicy: ExitCode` act on the code of the process they wait on, so
each code says what to do next: 2 is never worth retrying, 3 and 4 need a change before a
retry helps, 5, 7, 8 and 143 resume from the last complete checkpoint, 6 is worth retrying
on other nodes (the refused host is recorded in the run directory's `bad_hosts`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import sys
from pathlib import Path

from launcher.paths import atomic_write

DONE = 0
CRASH = 1  # an unexpected error: a traceback is in logs/rank<r>.log
BAD_INPUT = 2  # a config or file problem, one line names it; retrying cannot help
NONFINITE = 3  # the loss became NaN/inf; the last good checkpoint is kept
OOM = 4  # out of device memory; a memory snapshot is named in the error line
HANG = 5  # no step completed in time; stacks (and flight-recorder dumps) are in logs/
# The burn-in gate refused a slow node before any step (burnin.action=refuse); its host is in
# the run directory's bad_hosts. 6: free in the shell's (126, 127, 128+n) and Slurm's codes.
BAD_NODE = 6
# stopped on request in a phase that cannot be cut short (start-up, a first compile, a
# checkpoint or trace write, the end of the run), and killed by torchrun's shutdown timeout
# before its end: no stop checkpoint; the steps since the last complete one are lost
STOPPED_NO_CHECKPOINT = 7
# A node of the job left it (its processes gone, its heartbeat silent) and no node took its
# place before the restart's rendezvous gave up (launcher.resilience.node_presence): every
# other node ends with 8, naming the node's ranks; a requeue or restart on a full set of
# nodes resumes from the last checkpoint of either tier.
NODE_LOST = 8
STOPPED = 143  # stopped on request (SIGTERM/SIGINT) after a complete checkpoint

MEANING = {
    DONE: "done",
    CRASH: "unexpected crash",
    BAD_INPUT: "bad input",
    NONFINITE: "non-finite loss",
    OOM: "out of memory",
    HANG: "hang detected",
    BAD_NODE: "bad node refused by the burn-in gate",
    STOPPED_NO_CHECKPOINT: "stopped without a checkpoint",
    NODE_LOST: "node lost",
    STOPPED: "stopped with a checkpoint",
}

# Set by `python -m launcher.torchrun` for its workers: where each rank leaves its code.
OUTCOME_DIR_ENV = "LAUNCHER_OUTCOME_DIR"

# Set by the sbatch script for each node's `python -m launcher.torchrun`: where each node
# leaves its code. srun exits with the highest of the nodes' codes (143 over one node's 4),
# so the script takes the job's code from these by PRIORITY instead (`nodes_code`).
NODE_CODES_ENV = "LAUNCHER_NODE_CODES"

# When ranks end differently, the most specific diagnosis is the job's: a bad input or a
# non-finite loss explains why the other ranks were stopped, not the other way round.
# A rank that wrote the stop checkpoint (143) shows it is complete: every rank wrote its part.
PRIORITY = (BAD_INPUT, BAD_NODE, NONFINITE, OOM, NODE_LOST, HANG, STOPPED, STOPPED_NO_CHECKPOINT)


def report(code: int, chosen: bool = False) -> None:
    """Leave this rank's exit code where the launching front door reads it (if any).

    torchrun itself exits 1 whatever its workers returned; `launcher.torchrun` reads these
    files after torchrun ends and exits with `job_code` of them instead. `chosen`: a code
    a rank chose to leave the job with (`fault.kind=exit`), which the job then ends with,
    0 included, whatever its peers' collectives did when it left.
    """
    folder = os.environ.get(OUTCOME_DIR_ENV)
    if not folder:
        return
    rank = os.environ.get("RANK", "0")
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    path = Path(folder) / f"attempt{int(attempt):04d}.rank{int(rank):05d}"
    with contextlib.suppress(OSError):  # the front door is gone; nobody is left to read it
        atomic_write(path.with_name(path.name + CHOSEN) if chosen else path, f"{code}\n")


CHOSEN = ".chosen"
STARTED = ".started"  # a worker's word that it runs: its run directory, pid and attempt


def report_start(run_dir: Path, attempt: str | None) -> None:
    """Tell the launching front door (if any) that this rank of this attempt runs, in which
    run directory, as which process, and the attempt's name (every rank of its process group
    has the same, runtime.process.attempt_name) and its world size: what its node's
    heartbeat says, which of the agent's workers are this attempt's, and which of the
    attempt's ranks no node's heartbeat names (launcher.resilience.node_presence)."""
    folder = os.environ.get(OUTCOME_DIR_ENV)
    if not folder:
        return
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))  # this agent's own count
    record = {"run_dir": str(run_dir), "pid": os.getpid(), "attempt": attempt, "world": world}
    with contextlib.suppress(OSError):
        atomic_write(
            Path(folder) / f"attempt{restart:04d}.rank{rank:05d}{STARTED}", json.dumps(record)
        )


PID = ".pid"  # a warm-started rank's pid (launcher.warm_start): its /proc environ lacks RANK


def report_pid() -> None:
    """Tell the launching front door which rank this process is. A rank torchrun started
    has RANK in its /proc/<pid>/environ; one forked by a warm start's fork server has the
    server's there, so its front door (and its peers' hang watchdog, which end a frozen
    rank) find its rank here instead (`rank_of_pid`)."""
    folder = os.environ.get(OUTCOME_DIR_ENV)
    if folder:
        with contextlib.suppress(OSError):
            atomic_write(Path(folder) / f"{os.getpid()}{PID}", os.environ.get("RANK", "0"))


def rank_of_pid(pid: int) -> str | None:
    """The rank that `report_pid` says process `pid` is, if it said so."""
    folder = os.environ.get(OUTCOME_DIR_ENV)
    if not folder:
        return None
    try:
        return (Path(folder) / f"{pid}{PID}").read_text()
    except OSError:
        return None


def read_starts(folder: Path) -> tuple[int | None, dict[int, dict]]:
    """(the latest attempt whose ranks started, {rank: {"run_dir", "pid", "attempt",
    "world"}})."""
    latest: dict[int, dict[int, dict]] = {}
    for path in Path(folder).iterdir():
        match = re.fullmatch(rf"attempt(\d+)\.rank(\d+){re.escape(STARTED)}", path.name)
        if match:
            with contextlib.suppress(OSError, ValueError):
                latest.setdefault(int(match[1]), {})[int(match[2])] = json.loads(path.read_text())
    if not latest:
        return None, {}
    return max(latest), latest[max(latest)]


def read_reports(folder: Path, chosen: bool = False) -> dict[int, int]:
    """{rank: code} of the latest attempt whose ranks reported (`chosen`: the codes ranks
    chose to leave with, `report(code, chosen=True)`)."""
    latest: dict[int, dict[int, int]] = {}
    for path in Path(folder).iterdir():
        match = re.fullmatch(r"attempt(\d+)\.rank(\d+)(\.chosen)?", path.name)
        if not match or bool(match[3]) != chosen:
            continue
        attempt, rank = int(match[1]), int(match[2])
        try:
            latest.setdefault(attempt, {})[rank] = int(path.read_text())
        except (OSError, ValueError):
            continue
    return latest[max(latest)] if latest else {}


def job_code(
    rank_codes: dict[int, int], succeeded: bool, chosen: dict[int, int] | None = None
) -> int:
    """The one code for the scheduler, from what each rank reported.

    A contract code in PRIORITY order wins; then a code a rank chose to leave with
    (`chosen`: fault.kind=exit, for rehearsing a policy; 0 too: its peers' crash when it
    left is its doing), or any other non-zero code a rank reported; a rank that reported
    nothing was killed or crashed hard, which is CRASH.
    """
    if succeeded:
        return DONE
    codes = set(rank_codes.values())
    for code in PRIORITY:
        if code in codes:
            return code
    if chosen:
        return chosen[min(chosen)]
    chosen = [c for _, c in sorted(rank_codes.items()) if c not in (DONE, CRASH)]
    return chosen[0] if chosen else CRASH


def report_node(code: int) -> None:
    """Leave this node's code where the batch script reads it (if it asked): one file per
    node, named by Slurm's node name (several nodes may share a host name)."""
    folder = os.environ.get(NODE_CODES_ENV)
    if not folder:
        return
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    with contextlib.suppress(OSError):  # the script then decides on srun's code alone
        Path(folder).mkdir(parents=True, exist_ok=True)
        atomic_write(Path(folder) / node, f"{code}\n")


def nodes_code(folder: Path, step_code: int) -> int:
    """The job's one code from each node's and srun's own (which also stands for a node
    killed before it could report), in PRIORITY order as for ranks."""
    codes = [step_code]
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        with contextlib.suppress(OSError, ValueError):
            codes.append(int(path.read_text()))
    return job_code(dict(enumerate(codes)), succeeded=not any(codes))


if __name__ == "__main__":  # the batch script: python -m launcher.resilience.exit_codes DIR CODE
    print(nodes_code(Path(sys.argv[1]), int(sys.argv[2])))
