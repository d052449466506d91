"""A DataLoader worker's side of a rank's death: multiprocessing's resource sharer run for
real in a process of its own (the workers' init function changes the process's
excepthook, so it gets a process of its own)."""

from __future__ import annotations

import subprocess
import sys

import pytest

_RANK_LEAVES_MID_HANDOFF = """
import os, socket, sys, time
from multiprocessing import resource_sharer
from launcher.data.loader import start_worker
if sys.argv[1] == "worker":
    start_worker(0)
read, write = os.pipe()
resource_sharer.DupFd(read)  # a batch's descriptor offered to the rank: the sharer listens
for _ in range(2):  # the rank connects, then dies before it reads the challenge
    rank = socket.socket(socket.AF_UNIX)
    rank.connect(resource_sharer._resource_sharer._address)
    time.sleep(0.2)
    rank.close()
    time.sleep(0.3)
print("served")
"""


@pytest.mark.parametrize("init", ["worker", "none"])
def test_a_worker_leaves_no_traceback_when_its_rank_dies_mid_handoff(init):
    """multiprocessing's resource sharer, the thread that hands a batch's shared memory to
    the rank, run for real: a rank that connects and dies prints a ConnectionResetError
    traceback from a bare process (what CI saw under a SIGKILLed rank's name), and nothing
    from a process that ran the DataLoader workers' init function."""
    done = subprocess.run(
        [sys.executable, "-c", _RANK_LEAVES_MID_HANDOFF, init],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip() == "served", done.stderr
    if init == "worker":
        assert done.stderr == "", done.stderr
    else:
        assert "Traceback" in done.stderr and "Error" in done.stderr, done.stderr
