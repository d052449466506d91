"""Each test's CPU seconds in its report: the `cpu_s` property, which `--junitxml` writes
and tests/durations.py sums (docs/testing.md).

The seconds are those of the test's pytest process and of every process it started and
reaped (torchrun, the ranks, their loader workers, the front doors), setup and teardown
included. On 2 cores the parallel part is CPU-bound, its wall time about its CPU time over
two: CPU seconds, not a test's wall time, say what a test costs the suite.
"""

from __future__ import annotations

import resource

import pytest

CPU_AT_START = pytest.StashKey[float]()


def cpu_seconds() -> float:
    """User and system seconds of this process and of its reaped children (and theirs)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    item.stash[CPU_AT_START] = cpu_seconds()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if call.when == "teardown" and CPU_AT_START in item.stash:
        spent = cpu_seconds() - item.stash[CPU_AT_START]
        report.user_properties.append(("cpu_s", round(spent, 1)))
