"""The docs' commands (tests/doc_commands.py): each has a decision, and each training launch
too long to run here composes and validates at its world size."""

from __future__ import annotations

import pytest

from launcher.config import friendly_overrides, sweep
from launcher.config.schema import register_schema
from launcher.preflight import check_config

from doc_commands import DECISIONS, all_commands, checked_commands, launch_of


def test_every_doc_command_has_a_decision():
    found, decided = set(all_commands()), set(DECISIONS)
    assert sorted(found - decided) == [], "commands in the docs without a decision"
    assert sorted(decided - found) == [], "decisions for commands no longer in the docs"
    assert all(kind in ("run", "check", "dry", "skip") for kind, _ in DECISIONS.values())


@pytest.mark.parametrize("command", checked_commands())
def test_a_training_command_of_the_docs_composes_and_validates(command):
    register_schema()
    worlds, overrides, multirun = launch_of(command)
    _, configs = sweep.compose_points(friendly_overrides(overrides), multirun)
    for cfg in configs:
        for world in worlds:
            check_config(cfg.copy(), world)
