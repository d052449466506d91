"""The hosts a run keeps off its next attempts: the run directory's `bad_hosts`, one host a
line as its scheduler names it (Slurm's node name, what `--exclude` takes; the Kubernetes
node), then the reason.

Four kinds of failure put a host there, each with its switch (`exclude.*`, on by default):
the burn-in gate's refusal (`exclude.burnin`), a hang's culprit as the hang verdict names it
(`exclude.hang`), a rank that failed with a device error (`exclude.device_error`), and a
straggler that stays the slowest for `exclude.straggler_intervals` log intervals in a row
(`exclude.straggler`). The sbatch script adds the hosts to the job's excluded nodes when it
requeues the job (and ends it in one line when too few nodes would be left), the pod
renderers keep the next pods off them (node anti-affinity). docs/faults.md explains them.
"""

from __future__ import annotations

import re
from pathlib import Path

from launcher.paths import atomic_write
from launcher.resilience.first_failure import says_any

FILE = "bad_hosts"

# What a device failure says (CUDA, its libraries, the driver), as opposed to the program's
# own errors on a device (a device-side assert, running out of memory): a host to avoid.
DEVICE_ERRORS = (
    "ECC error",  # an uncorrectable memory error on the GPU
    "fallen off the bus",  # the GPU is gone from the PCIe bus
    "Xid",  # the driver's error report
    "unspecified launch failure",  # a kernel that died on the device
    "CUBLAS_STATUS_EXECUTION_FAILED",
    "CUDNN_STATUS_EXECUTION_FAILED",
    "unhandled cuda error",  # NCCL's word for a CUDA failure under it
    "CUDA error: unknown error",
    "busy or unavailable",  # a device another process holds, or a broken one
)
_SPACE = re.compile(r"\s+")


def parse(text: str) -> dict[str, str]:
    """{host: reason} of a bad_hosts file's text (a line of a host alone has no reason)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        host, _, reason = line.strip().partition(" ")
        if host:
            found.setdefault(host, reason.strip())
    return found


def reasons(run_dir: Path) -> dict[str, str]:
    """{host: why} of every host this run keeps off its next attempts, in the order recorded."""
    try:
        return parse((Path(run_dir) / FILE).read_text())
    except FileNotFoundError:
        return {}


def read(run_dir: Path) -> list[str]:
    """The hosts this run keeps off its next attempts (none when bad_hosts is absent)."""
    return list(reasons(run_dir))


def record(run_dir: Path, found: dict[str, str]) -> None:
    """Add each host of `found` with its reason (one line; a host recorded before keeps its
    first reason), the file written whole: the batch script reads it after the step."""
    merged = reasons(run_dir)
    for host, why in found.items():
        merged.setdefault(host, _SPACE.sub(" ", why).strip())
    text = "".join(f"{host} {why}".rstrip() + "\n" for host, why in merged.items())
    atomic_write(Path(run_dir) / FILE, text)


def is_device_error(exc: BaseException) -> bool:
    """Whether `exc` (or what it was raised from) is a failure of the device, not the code."""
    return says_any(exc, DEVICE_ERRORS)
