"""Text the tests make: seeded prose, and a local folder laid out like WikiText-2."""

from __future__ import annotations

import random
from pathlib import Path

WORDS = ["the", "a", "model", "token", "data", "loader", "shard", "window", "rank", "step"]


def prose(seed: int, words: int) -> str:
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(WORDS) for _ in range(12)) + "." for _ in range(words // 12)]
    return "\n".join(lines) + "\n"


def article_folder(folder: Path) -> Path:
    """A local folder laid out like WikiText-2: 6 train and 2 validation articles."""
    folder.mkdir()

    def article(title: str, seed: int) -> str:
        return (
            f" = {title} = \n \n {prose(seed, 600)} \n = = History = = \n \n {prose(seed + 1, 300)}"
        )

    (folder / "train.txt").write_text("".join(article(f"T{i}", i) for i in range(6)))
    (folder / "validation.txt").write_text("".join(article(f"V{i}", 50 + i) for i in range(2)))
    return folder
