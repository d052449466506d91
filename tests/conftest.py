"""Shared test set-up: tiers, xdist units of work, one token cache, and strict skips in CI.

Tiers are the folders (tests/tiers.py, which also checks each test's source fits its folder):
`-m unit` (tests/unit/<package>/) is the fast tier, `-m launch` (tests/launches/) the real
launches, `-m scale` (tests/scale/) launches at 16 ranks, `-m cluster` (tests/cluster/) Slurm
and pods, `-m gpu` (tests/gpu/) what needs CUDA. `serial` marks the tests whose assertions
are timing decisions (the tuner keeping or rejecting a change) and the whole scale tier:
they run alone, after the parallel part (README).

Under LAUNCHER_STRICT_SKIPS=1 (set by .ci/run) a skip fails unless its reason starts with
one of ALLOWED_SKIPS: only tests that need hardware this machine cannot have may skip.
"""

from __future__ import annotations

import compileall
import os
import sys
from pathlib import Path

import pytest

import scheduling
import tiers
from paths import REPO

ALLOWED_SKIPS = ("needs a CUDA GPU", "needs a CPU without fp16")  # hardware this one lacks
# Units go to the xdist workers in this order (tests/scheduling.py): clusters and launches
# first, so the short unit tests fill the tail.
TIER_ORDER = ("cluster", "scale", "launch", "gpu", "unit")

# Fixtures every tier folder may use: the shared reference runs, a one-rank gloo group, a
# clean NCCL environment; and each test's CPU seconds in its report.
pytest_plugins = ["reference_runs", "in_process", "nccl_fixtures", "cpu_accounting"]


def pytest_configure(config):
    if sys.dont_write_bytecode:
        write_bytecode(config)
    for tier, what in (
        ("unit", "pure, in-process: the fast tier"),
        ("launch", "starts real processes (torchrun, python -m launcher...)"),
        ("scale", "real launches at 16 ranks (processes, agents as nodes); run with serial"),
        ("cluster", "needs the test Slurm cluster or pods in network namespaces"),
        ("gpu", "needs a CUDA GPU"),
        ("serial", "asserts timing decisions: run alone, not under -n"),
    ):
        config.addinivalue_line("markers", f"{tier}: {what}")


def write_bytecode(config) -> None:
    """Write the bytecode of `launcher` and of the tests, where the environment sets
    PYTHONDONTWRITEBYTECODE (this machine's does) and so no process writes any.

    Without it every rank and front door the suite starts (a few hundred) would compile the
    modules of `launcher` it imports again (the whole package, 19,000 lines, takes 0.19
    CPU-seconds here): the controller compiles the package once, before any test starts a
    process. And every pytest process (each xdist worker, then the serial part) would
    rewrite and compile all 200 test modules while collecting: 3.5 of its 11 seconds,
    measured. So pytest's own processes write what they import (pytest keeps rewritten test
    modules apart, named for its version, and replaces files atomically, so workers writing
    at once is safe). Existing bytecode is still read, and a file whose source changed since
    is compiled again."""
    if not hasattr(config, "workerinput"):
        compileall.compile_dir(REPO / "launcher", quiet=1)
    sys.dont_write_bytecode = False


def pytest_xdist_make_scheduler(config, log):
    """Units of work smaller than a file (tests/scheduling.py) in place of the project's
    `--dist loadfile`; another `--dist` given on the command line is xdist's own."""
    if config.getvalue("dist") == "loadfile":
        return scheduling.UnitScheduling(config, log)
    return None


def pytest_collection_modifyitems(config, items):
    shared = frozenset(config.pluginmanager.getplugin("reference_runs").STARTING)
    wrong = []
    for item in items:
        path = Path(item.fspath)
        try:
            tier = tiers.tier_of(path)
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
        wrong.append(tiers.misplaced(path, item.originalname, item.fixturenames, shared))
        item.add_marker(tier)
        if tiers.is_serial(path, item.originalname, item.fixturenames):
            item.add_marker("serial")
        item.user_properties.append(("tier", tier))
    if any(wrong):
        raise pytest.UsageError("misplaced tests: " + "; ".join(sorted(set(filter(None, wrong)))))
    items.sort(key=lambda item: TIER_ORDER.index(_tier(item)))


def _tier(item) -> str:
    return next(value for key, value in item.user_properties if key == "tier")


@pytest.fixture(autouse=True)
def _tier_env(request, monkeypatch):
    """tests/launch.py reads this to refuse starting a process from a unit test."""
    monkeypatch.setenv(tiers.TIER_ENV, _tier(request.node))


@pytest.fixture(scope="session", autouse=True)
def token_cache(shared_root):
    """Tokenized data is built once and shared by every launch of every worker."""
    path = shared_root / "token-cache"
    path.mkdir(exist_ok=True)
    os.environ["LAUNCHER_CACHE_DIR"] = str(path)
    return path


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("LAUNCHER_STRICT_SKIPS") != "1" or not report.skipped:
        return
    reason = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    if not reason.startswith(ALLOWED_SKIPS):
        report.outcome = "failed"
        report.longrepr = f"skip not allowed in CI: {reason}"
