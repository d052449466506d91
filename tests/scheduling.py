"""How the parallel run hands tests to xdist workers: units of work smaller than a file.

With `--dist loadfile` a file goes to one worker whole, so the knob matrix's three engines
(6 minutes together) ran one after another on one worker, and the rehearsal's two tests on
another, while the third had finished: a tail of about 100 s in which the 2 cores were not
both busy. A unit here is a file only where its tests share module state (a module- or
class-scoped fixture, or the cluster a `tests/cluster/` file starts); otherwise every test
is a unit of its own.

The units go out in the order collected (`--no-loadscope-reorder`; xdist's default orders
files by their number of tests), which `tests/conftest.py` sorts by tier: cluster, launch,
gpu, unit, so the short unit tests fill the tail. Handing the longest units out first
(the longest-processing-time rule) was measured and was slower: 24 min 30 s against
22 min 2 s for the parallel part, as every long launch then competed with the others for
the two cores at once (docs/testing.md).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from xdist.scheduler import LoadScopeScheduling

TESTS = Path(__file__).resolve().parent
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


class UnitScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with this module's units instead of whole files."""

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)
