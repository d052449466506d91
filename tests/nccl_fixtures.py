"""Real-format NCCL INFO logs (tests/fixtures/nccl) and a clean NCCL_* environment."""

from __future__ import annotations

import os

import pytest

from paths import FIXTURES

FIXTURES = FIXTURES / "nccl"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.fixture
def nccl_env(monkeypatch):
    """A clean NCCL_* environment and no capture left from another test."""
    for name in {k for k in os.environ if k.startswith("NCCL_")} | {"NCCL_DEBUG_FILE"}:
        monkeypatch.setenv(name, "")  # remembers the value to restore, also "unset"
        monkeypatch.delenv(name)
    return monkeypatch
