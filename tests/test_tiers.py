"""The tier reading of tests/tiers.py, on module sources written here, and the guard that
keeps a misread launch out of the fast tier."""

from __future__ import annotations

import textwrap

import pytest

import launch
import tiers

SOURCE = """
import pytest
from launch import torchrun

def helper():
    return launch.python_train(["x"])

@pytest.fixture
def run(tmp_path):
    return helper()

@pytest.fixture
def derived(run):
    return run / "a"

def test_pure():
    assert 1

def test_direct(tmp_path):
    torchrun([])

def test_through_fixtures(derived):
    assert derived

def test_through_a_shared_reference(ddp_run):
    assert ddp_run
"""


@pytest.fixture
def module(tmp_path):
    path = tmp_path / "test_sample.py"
    path.write_text(textwrap.dedent(SOURCE))
    return path


@pytest.mark.parametrize(
    ("test", "fixtures", "tier"),
    [
        ("test_pure", [], "unit"),
        ("test_direct", ["tmp_path"], "launch"),
        ("test_through_fixtures", ["derived", "run", "tmp_path"], "launch"),
        ("test_through_a_shared_reference", ["ddp_run", "shared_root"], "launch"),
    ],
)
def test_a_test_that_starts_a_process_at_any_depth_is_a_launch(module, test, fixtures, tier):
    shared = frozenset({"ddp_run"})
    assert tiers.tier_of(module, test, fixtures, shared) == tier


def test_cluster_and_gpu_files_by_name(tmp_path):
    for name, tier in (("test_slurm.py", "cluster"), ("test_k8s.py", "cluster")):
        assert tiers.tier_of(tmp_path / name, "test_x", [], frozenset()) == tier
    assert tiers.tier_of(tmp_path / "test_gpu.py", "test_x", [], frozenset()) == "gpu"


def test_this_test_runs_in_the_unit_tier_and_may_not_start_a_process(request):
    assert request.node.get_closest_marker("unit")
    with pytest.raises(AssertionError, match="unit tier started a process"):
        launch.refuse_in_unit_tier()  # what torchrun(), python_train() and start() call first
