"""Every relative link in README.md and docs/*.md reaches a file, and every `#anchor` a
heading of that file, as GitHub renders them (a renamed heading left dead links before)."""

from __future__ import annotations

import re
from pathlib import Path

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
