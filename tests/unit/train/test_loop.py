"""The learning-rate schedule: linear warm-up to lr, cosine to min exactly at the decay end."""

from __future__ import annotations

import itertools

import pytest

from launcher.train.loop import lr_at

from in_process import trainer


def test_lr_warmup_is_linear_up_to_lr():
    """Step s < warmup trains at lr * (s + 1) / warmup: the first step at lr / warmup, the
    last warm-up step at lr, and the first decay step at lr too (cosine at 0)."""
    t = trainer(lr=1e-3, warmup_steps=4, max_steps=20, min_lr_ratio=0.1)
    assert [lr_at(s, t) for s in range(4)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert lr_at(4, t) == pytest.approx(1e-3)


def test_lr_cosine_reaches_min_exactly_at_decay_end_then_stays():
    """Cosine from lr to lr * min_lr_ratio: halfway at the midpoint, exactly the minimum
    at lr_decay_steps (default max_steps) and flat after it."""
    t = trainer(lr=1e-3, warmup_steps=4, max_steps=20, min_lr_ratio=0.1)
    assert lr_at(12, t) == pytest.approx(1e-4 + 0.5 * (1e-3 - 1e-4))
    assert lr_at(20, t) == 1e-3 * 0.1
    assert [lr_at(s, t) for s in (21, 50, 1000)] == [1e-3 * 0.1] * 3
    early = trainer(lr=1e-3, warmup_steps=4, max_steps=20, min_lr_ratio=0.1, lr_decay_steps=10)
    assert lr_at(7, early) == pytest.approx(1e-4 + 0.5 * (1e-3 - 1e-4))
    assert [lr_at(s, early) for s in range(10, 21)] == [1e-3 * 0.1] * 11
    assert lr_at(9, early) > 1e-4


def test_lr_is_monotone_after_warmup_and_bounded():
    """After warm-up the rate never rises, and it always lies in [lr * min_lr_ratio, lr]."""
    for warmup, ratio in ((0, 0.0), (3, 0.1), (10, 0.5)):
        t = trainer(lr=6e-4, warmup_steps=warmup, max_steps=50, min_lr_ratio=ratio)
        rates = [lr_at(s, t) for s in range(warmup, 60)]
        assert rates[0] == pytest.approx(6e-4)
        assert all(a >= b for a, b in itertools.pairwise(rates))
        assert all(6e-4 * ratio <= r <= 6e-4 * (1 + 1e-12) for r in rates)
    assert lr_at(0, trainer(lr=6e-4, warmup_steps=0, max_steps=50)) == pytest.approx(6e-4)
