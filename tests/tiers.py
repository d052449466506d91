"""Which tier a test belongs to: the folder it lives in, checked against what its source does.

The folders mirror the tiers: `unit/<package>/` (pure and in-process, the fast tier; one
folder per package of `launcher`), `launches/` (real processes), `scale/` (real launches at
16 ranks: processes, agents as nodes, Slurm nodes; docs/scale.md), `cluster/` (a Slurm
cluster or pods), `gpu/` (skipped here with "needs a CUDA GPU", the one allowed skip).

The source is read too: a function "starts a process" when its body names (or reads an
attribute named) one of PROCESS_NAMES (the launch helpers of tests/launch.py, `subprocess`,
the reference runs) or another function of its module that does (`x.start()` is a
thread's, not tests/launch.py's), itself or through a fixture it uses (at any depth, in its
module or among the shared reference runs). A test under `unit/` that starts a process, or
one under `launches/` that does not, is misplaced: collection stops naming it and where it
belongs. tests/launch.py also refuses to start anything under the unit tier.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

TESTS = Path(__file__).resolve().parent
FOLDER_TIERS = {
    "unit": "unit",
    "launches": "launch",
    "scale": "scale",
    "cluster": "cluster",
    "gpu": "gpu",
}
# Tiers whose every test must start a process (tests/launch.py's helpers or a subprocess).
LAUNCHING_TIERS = ("launch", "scale")
PROCESS_NAMES = {
    "subprocess",
    "torchrun",
    "python_train",
    "start",
    "start_torchrun",
    "start_agent",
    "start_agents",
    "tune_launch",
    "stop_once_checkpointed",
    "launch_once",
}
TIER_ENV = "LAUNCHER_TEST_TIER"
# Tests (or fixtures: every test using one) whose assertions are timing decisions: the tuner
# keeping a change only if it beats the measured noise. On a machine shared with other
# workers the noise is not the run's own, so they run alone (`-m serial`, README). The scale
# tier runs there too, whole: a 16-rank launch fills both cores by itself, and its timing
# verdicts (the hang's allowance, the burn-in's outlier) are the launch's own only alone.
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
    if tier_of(path) == "scale":
        return True
    names = SERIAL.get(path.name, set())
    return function in names or bool(names.intersection(fixtures))


def tier_of(path: Path) -> str:
    """The tier of a test file, from its folder under tests/ (ValueError elsewhere)."""
    parts = path.resolve().relative_to(TESTS).parts
    if len(parts) < 2 or parts[0] not in FOLDER_TIERS:
        raise ValueError(
            f"{path.name} sits outside the tier folders: move it to tests/unit/<package>/ "
            "(pure, in-process), tests/launches/ (real processes), tests/scale/ (16 ranks), "
            "tests/cluster/ or tests/gpu/"
        )
    return FOLDER_TIERS[parts[0]]


def starts_a_process(path: Path, function: str, fixtures: list[str], shared: frozenset[str]):
    """Whether the test, or a fixture it uses at any depth, starts a process."""
    starting = starting_functions(path, shared) | shared
    return function in starting or bool(starting.intersection(fixtures))


def misplaced(path: Path, function: str, fixtures: list[str], shared: frozenset[str]) -> str:
    """Why a test is in the wrong tier folder, or "" when its folder fits what it does."""
    tier = tier_of(path)
    if tier not in ("unit", *LAUNCHING_TIERS):
        return ""
    starts = starts_a_process(path, function, fixtures, shared)
    if tier == "unit" and starts:
        return f"{path.name}::{function} starts a process: move it to tests/launches/"
    if tier in LAUNCHING_TIERS and not starts:
        return f"{path.name}::{function} starts no process: move it to tests/unit/<package>/"
    return ""
