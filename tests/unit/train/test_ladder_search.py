"""The optimisation ladder's micro-batch search (benchmarks/ladder.py), on a table of figures
in place of training runs: it doubles while a size fits and adds at least 3% tokens/s, and
keeps the best size it ran. The search on real runs: the GPU check (16 -> 32 -> 64 on an
H200, docs/performance.md); the suite's CPU run of the ladder caps it at its first size,
since every size is a fresh compile."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from paths import REPO


def ladder_module():
    spec = importlib.util.spec_from_file_location("ladder", REPO / "benchmarks" / "ladder.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def table(tokens_per_s: dict[int, float | None]):
    """A `train` that reads its size from the overrides; None: out of memory."""
    ran = []

    def train(overrides, root, name):
        micro = int(overrides[-1].split("=")[1])
        ran.append(micro)
        if tokens_per_s[micro] is None:
            raise torch.OutOfMemoryError(f"micro {micro}")
        return {"micro_batch_size": micro, "tokens_per_s": tokens_per_s[micro], "name": name}

    return train, ran


@pytest.mark.parametrize(
    "figures, limit, ran, best",
    [
        ({2: 100, 4: 110, 8: 120, 16: 130}, 16, [2, 4, 8, 16], 16),  # every doubling pays
        ({2: 100, 4: 110, 8: 112, 16: 200}, 16, [2, 4, 8], 4),  # 8 adds under 3%: stop at 4
        ({2: 100, 4: None}, 16, [2, 4], 2),  # the first doubling does not fit
        ({2: 100, 4: 102.9}, 16, [2, 4], 2),  # just under 3%: the first size stays
        ({2: 100, 4: 150, 8: None}, 16, [2, 4, 8], 4),  # out of memory: the best that fit
        ({2: 100, 4: 150}, 2, [2], 2),  # the cap: nothing above it runs
        ({2: 100, 4: 150, 8: 200}, 4, [2, 4], 4),
    ],
)
def test_the_search_doubles_while_it_fits_and_pays(figures, limit, ran, best):
    train, seen = table(figures)
    got = ladder_module().best_micro_batch(["model=gpt2"], Path("/nowhere"), 2, limit, train)
    assert seen == ran
    assert got["micro_batch_size"] == best and got["name"] == f"micro{best}"
