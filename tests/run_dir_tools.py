"""Damage done to run directories (garbage files, a lock held by another launch), and what
a test reads back: the bytes of a folder, what a failed write left behind."""

from __future__ import annotations

import hashlib
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


def digest(folder: Path) -> dict[str, str]:
    """{relative path: sha1} of every file under `folder` ({} when there is none)."""
    return {
        str(p.relative_to(folder)): hashlib.sha1(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def leftovers(run: Path) -> list[str]:
    """What a failed write may leave: temporary files and folders, the lock."""
    return sorted(
        str(p.relative_to(run))
        for p in run.rglob(".*")
        if p.name.startswith((".tmp-", ".lock")) or p.name.endswith(".tmp")
    )
