"""Text sources made of files: the standard library's sources and the user's text files.

Each file is one document. The file list, its sizes and modification times are taken up
front, because they are the source's identity in the cache key and fix the holdout split;
the text itself is read only when the cache is built, one file at a time.
"""

from __future__ import annotations

import glob
import os
import platform
import re
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass

from launcher.data.holdout import assign_splits

# The standard library's own packaging and caches, and the test suite's fixture folders
# (deliberately broken encodings, binary blobs) are not Python a model should learn from.
SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}
TEST_DATA_DIR = re.compile(r"data\d*$")


@dataclass(frozen=True)
class FileDoc:
    """One document: the first `nbytes` bytes of `path`, known to the holdout as `name`."""

    path: str
    name: str
    nbytes: int
    split: str


@dataclass(frozen=True)
class FileSource:
    """Documents read from files, with what identifies them for the cache key."""

    identity: dict
    description: str
    docs: tuple[FileDoc, ...]

    def documents(self) -> Iterator[tuple[str, str]]:
        """(split, text) per file, in path order; undecodable bytes become U+FFFD."""
        for doc in self.docs:
            with open(doc.path, "rb") as f:
                yield doc.split, f.read(doc.nbytes).decode("utf-8", errors="replace")


def stdlib_source(*, max_bytes: int | None, val_fraction: float) -> FileSource:
    """The running Python's standard-library .py files, sorted, capped at max_bytes."""
    root = sysconfig.get_paths()["stdlib"]
    paths = sorted(_stdlib_files(root))
    files = [(p, os.path.relpath(p, root)) for p in paths]
    docs = _budgeted_docs(files, max_bytes, val_fraction)
    identity = {
        "kind": "stdlib",
        "root": root,
        "python": platform.python_version(),
        "max_bytes": max_bytes,
        "val_fraction": val_fraction,
    }
    return FileSource(identity, _describe("stdlib " + root, docs), docs)


def text_files_source(
    *, patterns: list[str], max_bytes: int | None, val_fraction: float
) -> FileSource:
    """Every file the globs match (~ expanded, ** recursive), sorted, capped at max_bytes."""
    paths = sorted(
        {
            os.path.abspath(p)
            for pattern in patterns
            for p in glob.glob(os.path.expanduser(pattern), recursive=True)
            if os.path.isfile(p)
        }
    )
    if not paths:
        raise ValueError(f"data.paths={list(patterns)}: no file matches; fix the globs")
    docs = _budgeted_docs([(p, p) for p in paths], max_bytes, val_fraction)
    identity = {
        "kind": "text_files",
        "files": [(d.path, d.nbytes, os.stat(d.path).st_mtime_ns) for d in docs],
        "max_bytes": max_bytes,
        "val_fraction": val_fraction,
    }
    return FileSource(identity, _describe("text_files", docs), docs)


def _stdlib_files(root: str) -> Iterator[str]:
    for folder, dirs, files in os.walk(root):
        parts = os.path.relpath(folder, root).split(os.sep)
        in_tests = "test" in parts or "tests" in parts
        dirs[:] = [
            d for d in dirs if d not in SKIP_DIRS and not (in_tests and TEST_DATA_DIR.search(d))
        ]
        yield from (os.path.join(folder, f) for f in files if f.endswith(".py"))


def _budgeted_docs(
    files: list[tuple[str, str]], max_bytes: int | None, val_fraction: float
) -> tuple[FileDoc, ...]:
    """Files in order until max_bytes is reached, the last one cut to fit; empty ones skipped."""
    kept: list[tuple[str, str, int]] = []
    budget = max_bytes
    for path, name in files:
        if budget == 0:
            break
        size = os.path.getsize(path)
        nbytes = size if budget is None else min(size, budget)
        if nbytes:
            kept.append((path, name, nbytes))
        if budget is not None:
            budget -= nbytes
    splits = assign_splits([name for _, name, _ in kept], val_fraction)
    return tuple(FileDoc(p, n, b, s) for (p, n, b), s in zip(kept, splits, strict=True))


def _describe(what: str, docs: tuple[FileDoc, ...]) -> str:
    val = sum(d.split == "val" for d in docs)
    total = sum(d.nbytes for d in docs)
    return f"{what} ({len(docs)} files, {total / 1e6:.1f} MB, {val} held out)"
