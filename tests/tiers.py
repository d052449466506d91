"""Which tier a test belongs to, decided from its source so no test file has to say it.

- `cluster`: the files that need a Slurm cluster or pods (CLUSTER_FILES).
- `gpu`: GPU_FILES; they skip here with "needs a CUDA GPU" (the one allowed skip).
- `launch`: a test that starts a process, itself or through a fixture it uses (at any depth,
  in its module or among the shared reference runs).
- `unit`: everything else, pure and in-process: the fast tier.

A function "starts a process" when its body names (or reads an attribute named) one of
PROCESS_NAMES (the launch helpers of tests/launch.py, `subprocess`, the reference runs) or
another function of its module that does (`x.start()` is a thread's, not tests/launch.py's).
tests/launch.py refuses to start anything under the unit tier, so a test this reading gets
wrong fails at once instead of slowing the fast tier.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

CLUSTER_FILES = {"test_slurm.py", "test_k8s.py"}
GPU_FILES = {"test_gpu.py"}
PROCESS_NAMES = {
    "subprocess",
    "torchrun",
    "python_train",
    "start",
    "start_torchrun",
    "stop_once_checkpointed",
    "launch_once",
}
TIER_ENV = "LAUNCHER_TEST_TIER"
# Tests (or fixtures: every test using one) whose assertions are timing decisions: the tuner
# keeping a change only if it beats the measured noise. On a machine shared with other
# workers the noise is not the run's own, so they run alone (`-m serial`, README).
SERIAL = {
    "test_tune.py": {
        "slow_start",
        "test_tiny_buckets_kept_bigger_and_compression_rejected_for_its_loss",
        "test_nothing_to_fix_ends_after_one_round_saying_so",
    }
}


@functools.cache
def starting_functions(path: Path, shared: frozenset[str]) -> frozenset[str]:
    """Names of the functions (tests and fixtures) in `path` that start a process; `shared`
    names fixtures defined elsewhere (conftest) that do."""
    tree = ast.parse(path.read_text())
    bodies = {
        node.name: {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        | {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)} - {"start"}
        | {a.arg for a in node.args.args}
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
    }
    starting = set(PROCESS_NAMES | shared)
    changed = True
    while changed:
        changed = False
        for name, used in bodies.items():
            if name not in starting and used & starting:
                starting.add(name)
                changed = True
    return frozenset(starting & bodies.keys())


def is_serial(path: Path, function: str, fixtures: list[str]) -> bool:
    names = SERIAL.get(path.name, set())
    return function in names or bool(names.intersection(fixtures))


def tier_of(path: Path, function: str, fixtures: list[str], shared: frozenset[str]) -> str:
    if path.name in CLUSTER_FILES:
        return "cluster"
    if path.name in GPU_FILES:
        return "gpu"
    starting = starting_functions(path, shared) | shared
    if function in starting or starting.intersection(fixtures):
        return "launch"
    return "unit"
