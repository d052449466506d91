"""Damage done to run directories: garbage files and a lock held by another launch."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from launcher.runtime import lock


def garbage(path: Path) -> None:
    path.write_bytes(b"\xff\xfe\x00garbage" * 3)


def write_lock(run: Path, **fields) -> Path:
    holder = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": None,
        "launch_key": "other-launch",
        "nonce": "n0",
        "since": time.time(),
        **fields,
    }
    path = run / lock.LOCK
    path.write_text(json.dumps(holder))
    return path
