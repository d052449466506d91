"""Where cached tokens live, what names them, and how a build is published atomically.

Every cache entry is named by a hash of everything that decides its content, so a changed
source or tokenizer lands in a new entry instead of silently reusing an old one. An entry
is built in a uniquely named temporary folder and renamed into place: a reader sees a
complete entry or none, and two builders sharing a filesystem (one per node) both finish,
the later one discarding its own copy so that everyone reads the first.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import uuid
from collections.abc import Callable
from pathlib import Path

CACHE_ENV = "LAUNCHER_CACHE_DIR"


def cache_root(cache_dir: str) -> Path:
    """$LAUNCHER_CACHE_DIR when set, else data.cache_dir with ~ expanded."""
    return Path(os.path.expanduser(os.environ.get(CACHE_ENV) or cache_dir))


def fingerprint(obj: object) -> str:
    """A short stable hash of a JSON-able description."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def temp_name(final: Path) -> Path:
    """A sibling of `final` no other process (on this or another host) will pick."""
    return final.with_name(
        f".{final.name}.tmp-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    )


def publish_dir(final: Path, build: Callable[[Path], None]) -> bool:
    """Build `final` through `build(tmp)` unless it exists; True if this call published it."""
    if final.is_dir():
        return False
    tmp = temp_name(final)
    tmp.mkdir(parents=True)
    try:
        build(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
            return False  # another builder published first; its entry is equivalent
        return True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
