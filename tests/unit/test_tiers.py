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
    ("test", "fixtures", "starts"),
    [
        ("test_pure", [], False),
        ("test_direct", ["tmp_path"], True),
        ("test_through_fixtures", ["derived", "run", "tmp_path"], True),
        ("test_through_a_shared_reference", ["ddp_run", "shared_root"], True),
    ],
)
def test_a_test_that_starts_a_process_at_any_depth_is_read_as_one(module, test, fixtures, starts):
    shared = frozenset({"ddp_run"})
    assert tiers.starts_a_process(module, test, fixtures, shared) is starts


@pytest.mark.parametrize(
    ("folder", "tier"),
    [("unit/config", "unit"), ("unit", "unit"), ("launches", "launch"), ("scale", "scale"),
     ("cluster", "cluster"), ("gpu", "gpu")],
)  # fmt: skip
def test_the_folder_is_the_tier(folder, tier):
    assert tiers.tier_of(tiers.TESTS / folder / "test_x.py") == tier


def test_a_file_outside_the_tier_folders_is_refused():
    with pytest.raises(ValueError, match="move it to tests/unit/<package>/"):
        tiers.tier_of(tiers.TESTS / "test_x.py")


@pytest.mark.parametrize(
    ("folder", "test", "fixtures", "why"),
    [
        ("unit/x", "test_direct", [], "starts a process: move it to tests/launches/"),
        ("unit/x", "test_through_fixtures", ["derived", "run"], "move it to tests/launches/"),
        ("launches", "test_pure", [], "starts no process: move it to tests/unit/<package>/"),
        ("unit/x", "test_pure", [], ""),
        ("launches", "test_direct", [], ""),
        ("scale", "test_pure", [], "starts no process: move it to tests/unit/<package>/"),
        ("scale", "test_direct", [], ""),
        ("cluster", "test_pure", [], ""),
    ],
)
def test_a_test_in_the_wrong_folder_is_named_with_where_it_belongs(
    monkeypatch, tmp_path, folder, test, fixtures, why
):
    monkeypatch.setattr(tiers, "TESTS", tmp_path)
    path = tmp_path / folder / "test_sample.py"
    path.parent.mkdir(parents=True)
    path.write_text(textwrap.dedent(SOURCE))
    found = tiers.misplaced(path, test, fixtures, frozenset())
    assert (why in found) if why else found == ""


def test_this_test_runs_in_the_unit_tier_and_may_not_start_a_process(request):
    assert request.node.get_closest_marker("unit")
    with pytest.raises(AssertionError, match="unit tier started a process"):
        launch.refuse_in_unit_tier()  # what torchrun(), python_train() and start() call first


def test_the_scale_tier_runs_whole_in_the_serial_part():
    """16-rank launches fill both cores alone, and their timing verdicts (a hang's
    allowance, the burn-in's outlier) are theirs only when nothing else runs."""
    assert tiers.is_serial(tiers.TESTS / "scale" / "test_x.py", "test_any", [])
    assert not tiers.is_serial(tiers.TESTS / "launches" / "test_x.py", "test_any", [])
