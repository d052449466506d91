"""Which documents are held out for validation.

A document goes to validation when a stable hash of its name falls under the fraction, so
the split depends on nothing but the names: the same on every machine, in every run, and a
document keeps its side when others are added. Two guarantees keep tiny corpora usable: at
least one validation document when there are two or more, and at least one training
document always.
"""

from __future__ import annotations

import hashlib


def name_hash(name: str) -> float:
    """A uniform number in [0, 1) drawn from the document's name alone."""
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def assign_splits(names: list[str], val_fraction: float) -> list[str]:
    """ "train" or "val" for each name, in order."""
    hashes = [name_hash(n) for n in names]
    val = {i for i, h in enumerate(hashes) if h < val_fraction}
    if not val and len(names) >= 2:
        val = {min(range(len(names)), key=hashes.__getitem__)}
    if names and len(val) == len(names):
        val.discard(max(val, key=hashes.__getitem__))
    return ["val" if i in val else "train" for i in range(len(names))]
