"""Secret keys are whole words, and the redacted config masks their values only."""

from __future__ import annotations

import pytest

from launcher.config import compose, typed
from launcher.config.secret_keys import is_secret_key, secret_in
from launcher.train.run_files import redacted


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


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("export HF_TOKEN=hf_" + "aZ3kq9Xw7Lm2Pv8Rt5Yb1Nc4", "a token of a known kind (hf_...)"),
        (
            "git clone https://ghp_" + "a" * 36 + "@github.com/x/y",
            "a token of a known kind (ghp...)",
        ),
        ("--comment=password=hunter2", "password=... (a secret's name)"),
        ("export GH_PAT=abc", "GH_PAT=... (a secret's name)"),
        ("curl -d build=aZ3kq9Xw7Lm2Pv8Rt5Yb1Nc4", "build=... (a long random-looking value)"),
        ("WANDB=" + "0123456789abcdef" * 2 + "01234567", "WANDB=... (a long random-looking value)"),
        ("export HF_TOKEN=$MY_TOKEN", None),  # a reference: the value stays in the environment
        ("source /shared/launcher/.venv/bin/activate", None),
        ("--container-image=nvcr.io#nvidia/pytorch:24.05-py3", None),
        ("run.id=20261205-174100-abcd1234ef", None),
        ("NCCL_SOCKET_IFNAME=eth0", None),
        ("data.tokenizer=openai-community/gpt2", None),
        ("echo $(printf %s $WANDB_API_KEY | wc -c)", None),
    ],
)
def test_secret_values_are_found_by_kind_name_and_randomness(text, found):
    """What the cluster renderers refuse by value, and what they must let pass; the
    reason names the kind or the name, never the secret."""
    assert secret_in(text) == found
