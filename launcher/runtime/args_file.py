"""Arguments from a file: a cluster job's overrides reach its ranks this way rather than
on their command lines, which every user of a node can read (`ps`, /proc/*/cmdline).

The Slurm script writes the trainer's overrides as a JSON list into a file only the
submitting user can read and names it in LAUNCHER_ARGS_FILE; torchrun passes the variable
on to its workers, whose front door (launcher.train, launcher.tune) reads the list in front
of its own arguments.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

ARGS_FILE_ENV = "LAUNCHER_ARGS_FILE"


def with_args_file(argv: list[str]) -> list[str]:
    """`argv` with the file's arguments in front of it, when the variable names one."""
    path = os.environ.get(ARGS_FILE_ENV)
    if not path:
        return argv
    args = json.loads(Path(path).read_text())
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ValueError(f"{ARGS_FILE_ENV}={path}: not a JSON list of strings")
    return [*args, *argv]
