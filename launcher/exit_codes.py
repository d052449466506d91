"""The exit codes: a contract with schedulers, kept here and in docs/faults.md only.

Slurm (`--requeue` decisions in the sbatch script), a Kubernetes `podFailurePolicy` and
PyTorchJob's `restartPolicy: ExitCode` act on the code of the process they wait on, so
each code says what to do next: 2 is never worth retrying, 3 and 4 need a change before a
retry helps, 5 and 143 resume from the last complete checkpoint.
"""

from __future__ import annotations

DONE = 0
CRASH = 1  # an unexpected error: a traceback is in logs/rank<r>.log
BAD_INPUT = 2  # a config or file problem, one line names it; retrying cannot help
NONFINITE = 3  # the loss became NaN/inf; the last good checkpoint is kept
OOM = 4  # out of device memory; a memory snapshot is named in the error line
HANG = 5  # no step completed in time; stacks (and flight-recorder dumps) are in logs/
STOPPED = 143  # stopped on request (SIGTERM/SIGINT) after a complete checkpoint

MEANING = {
    DONE: "done",
    CRASH: "unexpected crash",
    BAD_INPUT: "bad input",
    NONFINITE: "non-finite loss",
    OOM: "out of memory",
    HANG: "hang detected",
    STOPPED: "stopped with a checkpoint",
}
