"""Shared test set-up: one token cache for the session, and strict skips in CI.

Under LAUNCHER_STRICT_SKIPS=1 (set by .ci/run) a skip fails unless its reason starts with
one of ALLOWED_SKIPS: only tests that need hardware this machine cannot have may skip.
"""

from __future__ import annotations

import os

import pytest

ALLOWED_SKIPS = ("needs a CUDA GPU",)


@pytest.fixture(scope="session", autouse=True)
def token_cache(tmp_path_factory):
    """Tokenized data is built once per session and shared by every launch."""
    path = tmp_path_factory.mktemp("token-cache")
    os.environ["LAUNCHER_CACHE_DIR"] = str(path)
    return path


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("LAUNCHER_STRICT_SKIPS") != "1" or not report.skipped:
        return
    reason = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    if not reason.startswith(ALLOWED_SKIPS):
        report.outcome = "failed"
        report.longrepr = f"skip not allowed in CI: {reason}"
