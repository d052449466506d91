"""The front doors that plan, render or list runs answer without importing torch (about 2
CPU seconds of every process on this machine, nearly all of `launcher.plan`'s time): each
one run as users type it, under tests/no_torch.py, which stops the process at the first
`import torch` and names the launcher modules on the way. The trainer, `launcher.torchrun`,
`doctor` (it reports torch's build and devices), `analyze` (it reads the attention kernels'
argument positions from torch's own schemas), `export`, `generate` and `tune` (its trials
train in its own processes) need torch and are not here."""

from __future__ import annotations

import subprocess
import sys

import pytest

from launch import base_env, explain
from paths import TESTS

NO_TORCH = TESTS / "no_torch.py"
XL_ON_TWO_NODES = [
    "model=gpt2-xl",
    "trainer.seq_len=1024",
    "trainer.micro_batch_size=4",
    "trainer.global_batch_size=64",
    "cluster.nodes=2",
    "cluster.procs_per_node=8",
]


def doors(root, runs) -> dict[str, tuple[list[str], int]]:
    """{case: (module and arguments, the exit code it ends with)}."""
    out = [f"run.root={root}"]
    return {
        "plan": (["launcher.plan"], 0),
        "plan gpt2-xl on 2 nodes": (["launcher.plan", *XL_ON_TWO_NODES], 0),
        "plan bad input": (["launcher.plan", "trainer.max_steps=0"], 2),
        "submit slurm": (["launcher.submit", "slurm", "--dry-run", *out, "run.id=s"], 0),
        "submit k8s": (["launcher.submit", "k8s", "--dry-run", *out, "run.id=k"], 0),
        "submit slurm --tune": (["launcher.submit", "slurm", "--dry-run", "--tune", *out], 0),
        "runs": (["launcher.runs", str(runs)], 0),
        "rehearse bad input": (["launcher.rehearse", "trainer.max_steps=0"], 2),
    }


CASES = list(doors("r", TESTS))


@pytest.mark.parametrize("case", CASES)
def test_front_door_answers_without_torch(case, ddp_run, tmp_path):
    args, code = doors(tmp_path, ddp_run.parent)[case]
    proc = subprocess.run(
        [sys.executable, str(NO_TORCH), *args],
        env=base_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "imported torch" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == code, explain(proc)
