"""tests/scheduling.py: which tests travel together to one xdist worker, and the order in
which the units are handed out (longest first, each unit whole and in its own order)."""

from __future__ import annotations

from dataclasses import dataclass

import scheduling

SLURM = "tests/cluster/test_slurm.py"  # a cluster file: one cluster for all its tests
COMM = "tests/launches/test_comm.py"  # module-scoped runs
REHEARSE = "tests/launches/test_rehearse.py"  # independent launches
UNIT = "tests/unit/test_tiers.py"


@dataclass
class Item:
    nodeid: str
    tier: str = "launch"


def test_a_file_sharing_module_state_is_one_unit_and_the_others_split():
    assert scheduling.unit_of(f"{SLURM}::test_a") == SLURM
    assert scheduling.unit_of(f"{COMM}::test_b[x]") == COMM
    assert scheduling.unit_of(f"{REHEARSE}::test_c") == f"{REHEARSE}::test_c"
    assert scheduling.unit_of(f"{UNIT}::test_d") == f"{UNIT}::test_d"


def test_units_go_longest_first_each_whole_and_in_order(monkeypatch):
    seconds = {f"{REHEARSE}::long": 100.0, f"{COMM}::one": 30.0, f"{COMM}::two": 40.0}
    monkeypatch.setattr(scheduling, "measured", lambda: seconds)
    items = [
        Item(f"{UNIT}::pure", "unit"),  # unlisted: its tier's typical time
        Item(f"{COMM}::one"),
        Item(f"{REHEARSE}::short"),  # unlisted: 15 s
        Item(f"{COMM}::two"),
        Item(f"{REHEARSE}::long"),
    ]
    scheduling.longest_first(items, lambda item: item.tier)
    assert [i.nodeid.split("/")[-1] for i in items] == [
        "test_rehearse.py::long",  # 100 s
        "test_comm.py::one",  # the file's 70 s together, in the order collected
        "test_comm.py::two",
        "test_rehearse.py::short",  # 15 s
        "test_tiers.py::pure",  # 0.05 s
    ]


def test_every_measured_file_is_in_the_suite_now():
    """A removed or moved test file leaves stale lines that order nothing: refresh
    tests/seconds.json (docs/testing.md)."""
    files = {nodeid.split("::")[0] for nodeid in scheduling.measured()}
    assert all((scheduling.TESTS.parent / f).is_file() for f in files), sorted(files)
