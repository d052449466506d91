"""How the parallel run hands tests to xdist workers: units of work, longest first.

On 2 cores the suite is CPU-bound (user + system time is about 90% of twice the wall time),
so its wall time is the total work divided by the cores plus the tail: the time the last
worker runs alone. Two things make the tail long and this module removes both:

- a unit of work too big to share: with `--dist loadfile` a file goes to one worker whole,
  so the knob matrix's three engines (6 minutes together) ran one after another on one
  worker while the others had finished. A unit here is a file only where its tests share
  module state (a module- or class-scoped fixture, or the cluster a `tests/cluster/` file
  starts); otherwise every test is a unit of its own;
- long units handed out last: xdist orders the units by their number of tests
  (`--loadscope-reorder`, its default), which put the two-test rehearsal file and the
  three-test knob matrix at the end. The run uses `--no-loadscope-reorder` and
  `tests/conftest.py` sorts the collection by each unit's measured seconds, longest first
  (the longest-processing-time rule), from `tests/seconds.json`.

`tests/seconds.json` is written by a run with LAUNCHER_WRITE_SECONDS=tests/seconds.json
(docs/testing.md); a test it does not list counts as its tier's typical time.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

from xdist.scheduler import LoadScopeScheduling

TESTS = Path(__file__).resolve().parent
SECONDS_FILE = TESTS / "seconds.json"
WRITE_ENV = "LAUNCHER_WRITE_SECONDS"
TYPICAL_S = {"cluster": 20.0, "launch": 15.0, "gpu": 1.0, "unit": 0.05}
SHARED_SCOPE = re.compile(r"scope=\"(module|class|package)\"")


@functools.cache
def shares_module_state(file: str) -> bool:
    """True when the tests of `file` (a path relative to the repository) must run on one
    worker: they share a module-, class- or package-scoped fixture, or a cluster."""
    path = TESTS.parent / file
    return path.parent.name == "cluster" or bool(SHARED_SCOPE.search(path.read_text()))


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its file where the file shares state, else itself."""
    file = nodeid.split("::", 1)[0]
    return file if shares_module_state(file) else nodeid


@functools.cache
def measured() -> dict[str, float]:
    return json.loads(SECONDS_FILE.read_text()) if SECONDS_FILE.is_file() else {}


def seconds_of(nodeid: str, tier: str) -> float:
    return measured().get(nodeid, TYPICAL_S[tier])


def longest_first(items: list, tier_of) -> None:
    """Sort `items` in place so that units come longest first (ties: the order collected),
    each unit's tests kept together and in their own order."""
    unit_s: dict[str, float] = {}
    for item in items:
        unit = unit_of(item.nodeid)
        unit_s[unit] = unit_s.get(unit, 0.0) + seconds_of(item.nodeid, tier_of(item))
    first_seen = {}
    for index, item in enumerate(items):
        first_seen.setdefault(unit_of(item.nodeid), index)
    items.sort(key=lambda item: (-unit_s[unit_of(item.nodeid)], first_seen[unit_of(item.nodeid)]))


class UnitScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with this module's units instead of whole files."""

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)


class SecondsRecorder:
    """Sums each test's setup, call and teardown seconds as the controller receives them,
    and writes them to the file LAUNCHER_WRITE_SECONDS names at the session's end."""

    def __init__(self, path: str):
        self.path = Path(path)
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report):
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self, session):
        """Merged into what the file holds: the README's command is two runs (parallel, then
        serial), each recording its own tests."""
        known = json.loads(self.path.read_text()) if self.path.is_file() else {}
        known.update({k: round(v, 2) for k, v in self.seconds.items()})
        self.path.write_text(json.dumps(dict(sorted(known.items())), indent=0) + "\n")
