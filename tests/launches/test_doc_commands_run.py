"""The docs' commands that run here (tests/doc_commands.py): as written, or a submission with
--dry-run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from doc_commands import DECISIONS
from launch import base_env, refuse_in_unit_tier

RUN = [(c, int(v)) for (_, c), (k, v) in DECISIONS.items() if k == "run"]
DRY = [c for (_, c), (k, _) in DECISIONS.items() if k == "dry"]


def shell(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """`command` in bash as a user types it, with this venv's python first on PATH."""
    refuse_in_unit_tier()
    env = base_env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


@pytest.mark.parametrize(("command", "code"), RUN, ids=[c for c, _ in RUN])
def test_a_doc_command_runs_as_written(command, code, tmp_path):
    proc = shell(command, tmp_path)
    assert proc.returncode == code, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("command", DRY)
def test_a_submission_of_the_docs_renders(command, tmp_path):
    kind = command.split()[3]  # python -m launcher.submit {slurm,k8s} ...
    rest = command.split(None, 4)[4]
    dry = f"python -m launcher.submit {kind} --dry-run {rest} run.root={tmp_path / 'runs'}"
    proc = shell(dry, tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
