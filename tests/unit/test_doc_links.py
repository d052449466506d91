"""Every relative link in README.md and docs/*.md reaches a file, and every `#anchor` a
heading of that file, as GitHub renders them (a renamed heading left dead links before); and
every Markdown file of the repository stands alone: it cites no file outside it."""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import pytest

from paths import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of `path`'s headings (outside code blocks); a repeated one gets -1, -2."""
    seen: dict[str, int] = {}
    found = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        match = re.match(r"^#{1,6} (.*)", line)
        if not match:
            continue
        base = slug(match[1])
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def dead_links(doc: Path) -> list[str]:
    dead = []
    for target in LINK.findall(FENCE.sub("", doc.read_text())):
        if re.match(r"^[a-z]+:", target):  # https:, mailto: ...
            continue
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        if not path.exists():
            dead.append(f"{doc.name}: {target} (no such file)")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            dead.append(f"{doc.name}: {target} (no such heading)")
    return dead


def test_slug_matches_github():
    assert (
        slug("A non-finite loss: stop, skip or rewind") == "a-non-finite-loss-stop-skip-or-rewind"
    )
    assert (
        slug("Which transport NCCL chose (`nccl=debug`)") == "which-transport-nccl-chose-nccldebug"
    )


def test_every_link_and_anchor_in_the_docs_resolves():
    assert [d for doc in DOCS for d in dead_links(doc)] == []


# Folders that hold no document of the repository (.gitignore's: runs, environments, builds)
NOT_THE_REPOSITORY = {
    "runs", "outputs", "multirun", "build", "dist", "wandb", "gpu-check", "__pycache__"
}  # fmt: skip


@functools.cache
def markdown_files() -> tuple[Path, ...]:
    """Every Markdown file of the repository (none of a hidden folder, an environment's, a
    build's or a run's)."""
    found = []
    for folder, subfolders, files in os.walk(REPO):
        subfolders[:] = [
            name
            for name in subfolders
            if not (name.startswith(".") or name in NOT_THE_REPOSITORY or name.endswith("-info"))
        ]
        found += [Path(folder) / name for name in files if name.endswith(".md")]
    return tuple(sorted(found))


# What this project's docs once cited from outside the repository: the house plan the
# project was built from and the notes of the machines it was built on.
OUTSIDE = ("DESIGN", "/work/", "shared/notes")
# A file named by a path relative to the document (`../x/y.md`), or a capitalised document
# (`NOTES.md`)
RELATIVE_PATH = re.compile(r"(?<![\w/.=])(?:\.\./)+[\w./-]*\w\.\w+")
CAPITALISED_DOC = re.compile(r"\b[A-Z][A-Z_-]+\.md\b")


def citations_outside(doc: Path) -> list[str]:
    """What `doc` cites that the repository does not hold: a link or a relative path that
    leaves the repository or reaches nothing, a capitalised document (`NOTES.md`) that is not
    in it, or one of the outside documents this project once cited."""
    text = doc.read_text()
    where = doc.relative_to(REPO)
    found = []
    links = [t.partition("#")[0] for t in LINK.findall(text) if not re.match(r"^[a-z]+:", t)]
    paths = RELATIVE_PATH.findall(LINK.sub("", FENCE.sub("", text)))
    for target in [t for t in links if t] + paths:
        path = (doc.parent / target.rstrip(".,;:)")).resolve()
        if not path.is_relative_to(REPO) or not path.exists():
            found.append(f"{where}: {target}")
    held = {p.name for p in markdown_files()}
    found += [f"{where}: {name}" for name in CAPITALISED_DOC.findall(text) if name not in held]
    found += [f"{where}: {word}" for word in OUTSIDE if word in text]
    return found


def test_the_reader_finds_a_citation_outside():
    doc = REPO / "docs" / "architecture.md"
    assert RELATIVE_PATH.findall("as measured (`../shared/notes/performance.md`).") == [
        "../shared/notes/performance.md"
    ]
    assert CAPITALISED_DOC.findall("one package per concern (DESIGN.md's layout)") == ["DESIGN.md"]
    assert citations_outside(doc) == []
    assert [p for p in markdown_files() if p.name == "README.md"][0].is_file()


@pytest.mark.parametrize("doc", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_markdown_file_cites_nothing_outside_the_repository(doc):
    assert citations_outside(doc) == []
