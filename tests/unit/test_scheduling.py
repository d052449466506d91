"""tests/scheduling.py: which tests travel together to one xdist worker."""

from __future__ import annotations

import scheduling

SLURM = "tests/cluster/test_slurm.py"  # a cluster file: one cluster for all its tests
COMM = "tests/launches/test_comm.py"  # module-scoped runs
REHEARSE = "tests/launches/test_rehearse.py"  # independent launches
UNIT = "tests/unit/test_tiers.py"


def test_a_file_sharing_module_state_is_one_unit_and_the_others_split():
    assert scheduling.unit_of(f"{SLURM}::test_a") == SLURM
    assert scheduling.unit_of(f"{COMM}::test_b[x]") == COMM
    assert scheduling.unit_of(f"{REHEARSE}::test_c") == f"{REHEARSE}::test_c"
    assert scheduling.unit_of(f"{UNIT}::test_d") == f"{UNIT}::test_d"
