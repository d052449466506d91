"""Secret keys are whole words, and the redacted config masks their values only."""

from __future__ import annotations

import pytest

from launcher.config import compose, typed
from launcher.config.secret_keys import (
    ambiguous_secret_in,
    exposed_secret_in,
    is_secret_key,
    secret_in,
)
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


KEY = "0123456789abcdef" * 2 + "01234567"  # 40 hex digits: a W&B key's shape, and a commit's
RANDOM = "aZ3kq9Xw7Lm2Pv8Rt5Yb1Nc4"


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
        # the NAME=value form in any quoting
        (f"export WANDB_API_KEY='{KEY}'", "WANDB_API_KEY=... (a secret's name)"),
        (f'export WANDB_API_KEY="{KEY}"', "WANDB_API_KEY=... (a secret's name)"),
        (f"export WANDB_API_KEY=$'{KEY}'", "WANDB_API_KEY=... (a secret's name)"),
        ('export WANDB_API_KEY="$FROM_ELSEWHERE"', None),
        ("export HF_TOKEN_FILE=/run/secrets/hf", None),  # where it is kept, not the secret
        # login commands given their token, written out or expanded onto the command line
        (f"wandb login {KEY}", "`wandb login KEY` (a key on a command line)"),
        ('wandb login --relogin "$WANDB_API_KEY"', "`wandb login KEY` (a key on a command line)"),
        ("wandb login", None),
        ("wandb login --host https://wandb.example.com", None),
        (
            "huggingface-cli login --token x1",
            "`huggingface-cli login --token ...` (a token on a command line)",
        ),
        (
            "hf auth login --token=$HF_TOKEN",
            "`hf auth login --token=...` (a token on a command line)",
        ),
        ("docker login -u me -p x1 reg.io", "`docker login -p ...` (a token on a command line)"),
        ("echo $REG | docker login --password-stdin reg.io", None),
        ("my-tool --api-key x1", "--api-key ... (a secret on a command line)"),
        ("my-tool --token-file /run/secrets/t", None),
        ("git clone https://me:x1@git.example.com/r", "a password in a URL"),
        ("git clone https://me:$PASS@git.example.com/r", None),
        (f"curl -H 'Authorization: Bearer {RANDOM}'", "an Authorization header's credentials"),
        ('curl -H "Authorization: Bearer $TOKEN"', None),
        (f"echo {RANDOM} > ~/.token", "a long random-looking word"),
        # a commit is no secret by shape alone: secret_in leaves it (ambiguous_secret_in)
        (f"git checkout {KEY}", None),
        (f"export GIT_COMMIT={KEY}", None),
        (f"pip install git+https://example.com/r@{KEY}", None),
        ("--container-image=repo/launcher@sha256:" + "ab" * 32, None),
        ("sk-" + "a1" * 12, "a token of a known kind (sk-...)"),
        ("AKIA" + "ABCDEFGHIJ234567", "a token of a known kind (AKI...)"),
        ("xoxb-" + "1234-abcdef", "a token of a known kind (xox...)"),
        ("github_pat_" + "a1" * 11, "a token of a known kind (git...)"),
    ],
)
def test_secret_values_are_found_by_kind_name_and_randomness(text, found):
    """What the cluster renderers refuse by value, and what they must let pass; the
    reason names the kind or the name, never the secret."""
    assert secret_in(text) == found


@pytest.mark.parametrize(
    ("text", "exposed", "ambiguous"),
    [
        (KEY, "a run of 40 hex digits (a W&B API key has 40)", "40 hex digits (a git commit"),
        (f"j{KEY}", "a run of 40 hex digits", "40 hex digits"),
        (f"git checkout {KEY}", "a run of 40 hex digits", "40 hex digits"),
        (f"export GIT_COMMIT={KEY}", "a run of 40 hex digits", "40 hex digits"),
        ("0123456789abcdef" * 2, "a run of 32 hex digits", "32 hex digits"),
        ("0123456789abcdef" + "0123456789abcde", None, None),  # 31: shorter than any key
        ("launcher-gpt2-tiny", None, None),
        ("20261205-174100-abcd1234", None, None),  # the run ids the launcher makes
        ("repo/launcher@sha256:" + "ab" * 32, None, None),  # an image's digest
        (f"wandb login {KEY}", "`wandb login KEY`", None),  # a secret before a shape
    ],
)
def test_hex_runs_are_refused_where_every_user_reads_them_and_warned_elsewhere(
    text, exposed, ambiguous
):
    """A job's name, comment and labels (exposed_secret_in) take no run of 32 or more hex
    digits; elsewhere such a run may be a commit, and is only said (ambiguous_secret_in),
    unless something else marks it as a secret first."""
    found = exposed_secret_in(text)
    assert (found is None) if exposed is None else (found and exposed in found), found
    if secret_in(text) is None:
        said = ambiguous_secret_in(text)
        assert (said is None) if ambiguous is None else (said and ambiguous in said), said
