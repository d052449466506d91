"""A process leaves its objects to the OS at exit (launcher.runtime.exit_gc): once the front
door asked, torch's objects are frozen before the interpreter's teardown, so its last
collection walks none of them (1-2 s of every agent's and rank's end on a loaded 2-core
machine, measured at a preemption), and asking twice registers it once. Run in a Python of
its own: only an exit shows it."""

from __future__ import annotations

import subprocess
import sys

from launch import base_env, refuse_in_unit_tier

PROGRAM = """
import atexit, gc
import torch
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count()))
from launcher.runtime.exit_gc import skip_collection_at_exit
skip_collection_at_exit()
skip_collection_at_exit()
print("frozen before exit:", gc.get_freeze_count())
"""


def test_torchs_objects_are_frozen_before_the_interpreters_teardown():
    refuse_in_unit_tier()
    out = subprocess.run([sys.executable, "-c", PROGRAM], env=base_env(), capture_output=True,
                         text=True, timeout=120, check=True).stdout  # fmt: skip
    lines = out.splitlines()
    assert lines[0] == "frozen before exit: 0"
    (at_exit,) = [ln for ln in lines[1:] if ln.startswith("frozen at exit:")]  # once
    assert int(at_exit.split(":")[1]) > 100_000  # torch's objects, out of the last collection
