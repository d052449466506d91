"""A stale lock (a dead pid here, another host's expired heartbeat) is taken over by a real
launch with one warning naming why."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time

import pytest

from launcher.runtime import lock

from run_dir_tools import write_lock


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize(
    ("fields", "age", "why"),
    [
        ({"pid": "dead"}, 0, "is no longer running"),
        (
            {"host": "elsewhere", "launch_key": "mine"},
            lock.HANDOVER_S + 5,
            "an earlier attempt of this launch",
        ),
        ({"host": "elsewhere"}, lock.STALE_AFTER_S + 5, "no heartbeat"),
        (None, 0, "its content is unreadable"),
    ],
    ids=["dead pid here", "own restart elsewhere", "silent elsewhere", "garbage"],
)
def test_stale_lock_is_taken_over_with_one_warning(tmp_path, caplog, fields, age, why):
    if fields is None:
        path = tmp_path / lock.LOCK
        path.write_bytes(b"\xff\x00")
    else:
        fields = {**fields, "pid": dead_pid()} if fields.get("pid") == "dead" else fields
        path = write_lock(tmp_path, **fields)
    os.utime(path, (time.time() - age, time.time() - age))
    taker = lock.RunLock(tmp_path, "mine")
    with caplog.at_level(logging.WARNING):
        taker.acquire()
    assert len(caplog.records) == 1 and why in caplog.records[0].getMessage()
    assert json.loads(path.read_text())["nonce"] == taker.me.nonce
    taker.release()
