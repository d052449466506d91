"""Where a process sits in its job, read from the environment each launcher sets: torchrun,
Slurm's srun, a pod. A table of environments over every function, the empty one included."""

from __future__ import annotations

import socket

import pytest

from launcher.runtime import placement

TORCHRUN = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
SRUN = {"RANK": "3", "WORLD_SIZE": "4", "SLURM_LOCALID": "1", "SLURMD_NODENAME": "n7",
        "SLURM_JOB_ID": "42", "NODE_NAME": "k8s-node"}  # fmt: skip
POD = {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "NODE_NAME": "k8s-node",
       "TORCHELASTIC_RUN_ID": "job-1"}  # fmt: skip
STANDALONE = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "TORCHELASTIC_RUN_ID": "none"}


@pytest.fixture
def environ(monkeypatch):
    """Set the process's environment to exactly the given launcher variables."""

    def use(values: dict[str, str]) -> None:
        for name in {*TORCHRUN, *SRUN, *POD, "SLURM_ARRAY_TASK_ID"}:
            monkeypatch.delenv(name, raising=False)
        for name, value in values.items():
            monkeypatch.setenv(name, value)

    return use


@pytest.mark.parametrize(
    ("env", "world", "per_node", "node", "key"),
    [
        ({}, (0, 0, 1), 1, socket.gethostname(), None),
        (TORCHRUN, (5, 1, 8), 4, socket.gethostname(), None),
        (SRUN, (3, 1, 4), 4, "n7", "slurm42"),
        (POD, (2, 0, 4), 4, "k8s-node", "job-1"),
        (STANDALONE, (0, 0, 2), 2, socket.gethostname(), None),
    ],
    ids=["nothing set", "torchrun", "srun", "pod", "torchrun --standalone"],
)
def test_each_launchers_environment(environ, env, world, per_node, node, key):
    environ(env)
    assert placement.env_world() == world
    assert placement.ranks_per_node() == per_node
    assert placement.node_name() == node
    assert placement.launch_key() == key


@pytest.mark.parametrize(
    ("ranks", "text"),
    [([], ""), ([3], "3"), ([0, 1], "0-1"), ([9, 4, 5, 6, 7], "4-7, 9"), ([2, 0], "0, 2")],
)
def test_ranks_are_named_as_runs(ranks, text):
    assert placement.ranks_text(ranks) == text
