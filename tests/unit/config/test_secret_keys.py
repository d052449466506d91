"""Secret keys are whole words, and the redacted config masks their values only."""

from __future__ import annotations

import pytest

from launcher.config import compose, typed
from launcher.train.job import is_secret_key, redacted


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("WANDB_API_KEY", True),
        ("hf_token", True),
        ("db-password", True),
        ("wandb_secret", True),
        ("tokenizer", False),
        ("shard_tokens", False),
        ("keep_checkpoints", False),
        ("monkey", False),
    ],
)
def test_secret_keys_are_whole_words(key, secret):
    """A key is masked when one of its words is a secret word, never for a word that only
    contains one (data.tokenizer, data.shard_tokens are settings a reader needs)."""
    assert is_secret_key(key) is secret


def test_redacted_config_masks_secret_values_only():
    cfg = typed(compose(["+cluster.env.WANDB_API_KEY=abc", "data.tokenizer=gpt2"]))
    out = redacted(cfg)
    assert out["cluster"]["env"]["WANDB_API_KEY"] == "***"
    assert out["data"]["tokenizer"] == "gpt2" and out["data"]["shard_tokens"] == 100_000_000
