"""WikiText-2 (or any text dataset laid out like it) through the `datasets` loader.

`datasets` is an optional dependency, imported only here. A document is one Wikipedia
article: WikiText marks each article's start with a top-level heading line ` = Title = `
(sections use ` = = Section = = `), so lines are grouped from one such heading to the next.
The dataset's own train and validation splits are used; a dataset with only a train split
is held out by article. data.max_bytes does not apply: the splits are used whole.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from launcher.data.holdout import assign_splits

ARTICLE_HEADING = re.compile(r"^ ?= [^=].* = ?$")


@dataclass(frozen=True)
class WikitextSource:
    """The dataset's documents, with what identifies them for the cache key."""

    identity: dict
    description: str
    hf_path: str
    hf_name: str | None
    val_fraction: float

    def documents(self) -> Iterator[tuple[str, str]]:
        """(split, article text): the train split's articles, then the validation split's."""
        splits = _load(self.hf_path, self.hf_name)
        train = list(articles(splits["train"]["text"]))
        if "validation" in splits:
            yield from (("train", doc) for doc in train)
            yield from (("val", doc) for doc in articles(splits["validation"]["text"]))
            return
        names = [f"train/{i}" for i in range(len(train))]
        yield from zip(assign_splits(names, self.val_fraction), train, strict=True)


def wikitext_source(*, hf_path: str, hf_name: str | None, val_fraction: float) -> WikitextSource:
    """The source for data.hf_path / data.hf_name; a local folder is keyed by its files."""
    identity: dict = {
        "kind": "wikitext2",
        "hf_path": hf_path,
        "hf_name": hf_name,
        "val_fraction": val_fraction,
    }
    local = os.path.expanduser(hf_path)
    if os.path.isdir(local):
        identity["files"] = [
            (os.path.relpath(p, local), os.path.getsize(p), os.stat(p).st_mtime_ns)
            for p in sorted(_files_under(local))
        ]
        hf_path = os.path.abspath(local)
    description = f"wikitext2 {hf_path}" + (f" ({hf_name})" if hf_name else "")
    return WikitextSource(identity, description, hf_path, hf_name, val_fraction)


def articles(lines: Iterable[str]) -> Iterator[str]:
    """Group WikiText lines into articles, each starting at its top-level heading."""
    current: list[str] = []
    for line in lines:
        line = line.rstrip("\n")
        if ARTICLE_HEADING.match(line) and any(s.strip() for s in current):
            yield "\n".join(current).strip("\n")
            current = []
        current.append(line)
    if any(s.strip() for s in current):
        yield "\n".join(current).strip("\n")


def _load(hf_path: str, hf_name: str | None):
    try:
        import datasets
    except ImportError as exc:
        raise ImportError(
            "data.source=wikitext2 needs the `datasets` package: pip install 'launcher[hub]'"
        ) from exc
    try:
        return datasets.load_dataset(hf_path, hf_name)
    except Exception as exc:
        raise ValueError(
            f"data.hf_path={hf_path} data.hf_name={hf_name}: could not load the dataset "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); without "
            f"hub access give a local folder holding train/validation text or parquet files"
        ) from exc


def _files_under(folder: str) -> Iterator[str]:
    for parent, _, files in os.walk(folder):
        yield from (os.path.join(parent, f) for f in files)
