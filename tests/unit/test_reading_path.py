"""The docs' reading path (issue 53): README -> quickstart -> one page per task (train,
profile and tune, plan, cluster, faults), each ending with what to read next; the README
lists the path in that order; every other page is either marked as reference or linked
from a page of the path, so no page is left without a way in."""

from __future__ import annotations

import re
from pathlib import Path

from paths import REPO

PATH = ["README.md", "docs/quickstart.md", "docs/train.md", "docs/profiling.md",
        "docs/tuning.md", "docs/plan.md", "docs/cluster.md", "docs/faults.md"]  # fmt: skip
REFERENCE = "> Reference page: look things up here."
LINK = re.compile(r"\[[^\]]*\]\(([^)#\s]+\.md)(?:#[^)]*)?\)")


def text(page: str) -> str:
    return (REPO / page).read_text()


def links(page: str) -> list[str]:
    """The .md pages `page` links to, as paths from the repository's root, in order."""
    folder = (REPO / page).parent
    return [
        (folder / target).resolve().relative_to(REPO).as_posix()
        for target in LINK.findall(text(page))
    ]


def read_next(page: str) -> str:
    """The section `## Read next` of `page` (empty when it has none)."""
    found = re.search(r"^## Read next\n(.*?)(?=^## |\Z)", text(page), re.S | re.M)
    return found[1] if found else ""


def test_each_page_of_the_path_names_the_next_one_first():
    for page, following in zip(PATH[1:-1], PATH[2:], strict=True):
        section = read_next(page)
        assert section, f"{page} has no `## Read next`"
        folder = (REPO / page).parent
        first = LINK.search(section)[1]
        assert (folder / first).resolve() == (REPO / following).resolve(), (page, first)
    assert read_next(PATH[-1]), "the last page says where to go from there"


def test_the_readme_lists_the_path_in_order():
    section = re.search(r"^## The reading path\n(.*?)(?=^## )", text("README.md"), re.S | re.M)[1]
    listed = [f"docs/{Path(target).name}" for target in LINK.findall(section)]
    assert listed == PATH[1:], listed


def test_every_page_is_on_the_path_marked_reference_or_linked_from_the_path():
    pages = {p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md")}
    reference = {p for p in pages if REFERENCE in text(p).split("\n\n", 2)[1]}
    from_path = {target for page in PATH for target in links(page)}
    assert sorted(pages - set(PATH) - reference - from_path) == []
    # a reference page is no page of the path
    assert reference.isdisjoint(PATH)
    assert {"docs/configuration.md", "docs/metrics.md", "docs/run-directory.md"} <= reference
