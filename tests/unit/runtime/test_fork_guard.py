"""The before-fork guard against python/cpython#112275 (launcher/runtime/fork_guard.py):
registered exactly on the interpreters whose forked child can inherit the thread-list lock
held."""

from __future__ import annotations

import sys

import pytest

from launcher.runtime import fork_guard


@pytest.mark.parametrize(
    ("version", "needed"),
    [
        ((3, 10, 0), True),
        ((3, 10, 14), True),
        ((3, 10, 15), False),
        ((3, 11, 2), True),  # Debian 12's python3.11
        ((3, 11, 7), True),
        ((3, 11, 9), True),
        ((3, 11, 10), False),
        ((3, 11, 14), False),
        ((3, 12, 0), False),
        ((3, 13, 1), False),
    ],
)
def test_the_guard_is_needed_before_the_fixed_releases(version, needed):
    assert fork_guard.needs_guard(version) is needed


def test_guarding_is_idempotent_and_follows_this_interpreter():
    expected = fork_guard.needs_guard(sys.version_info[:3])
    assert fork_guard.guard_forks() is expected
    assert fork_guard.guard_forks() is expected  # registered once, not once per loader
