"""Which config keys, environment variables and values hold secrets.

One definition for everything that must keep a secret out of sight: config.yaml and W&B
mask these keys' values (launcher.train.job.redacted), and the cluster renderers refuse to write
them into a job script, a manifest or a command line (launcher.submit.job): by name (a
key or variable such as HF_TOKEN, GH_PAT) and by value (a token of a known kind, or a long
random-looking string given to a key), wherever in a setting's text they stand.
"""

from __future__ import annotations

import math
import re
from collections import Counter

# A key is secret when one of its words (split at _ - .) is one of these: WANDB_API_KEY,
# hf_token, db_password, GH_PAT, AWS_CREDENTIALS; not `data.tokenizer`, `data.shard_tokens`
# or TOKENIZERS_PARALLELISM.
SECRET_WORDS = frozenset(
    {"key", "apikey", "token", "secret", "password", "passwd", "pat", "credential", "credentials"}
)
# Tokens whose kind shows in their first characters (Hugging Face, GitHub, GitLab, Slack,
# OpenAI-style, Stripe, AWS access key ids, Google API keys, JWTs).
TOKEN_PREFIXES = re.compile(
    r"(?<![A-Za-z0-9])(hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,}"
    r"|glpat-[\w-]{20,}|xox[abposr]-[\w-]{10,}|sk-[\w-]{20,}|sk_live_\w{16,}"
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}|AIza[\w-]{35}|eyJ[\w-]{10,}\.[\w-]{10,}\.[\w-]{10,})"
)
# A value given to a key (`name=value`) at least this long, of one word-like piece, mixing
# upper case, lower case and digits this unpredictably (Shannon entropy, bits per
# character), or a long run of hex digits (a W&B key): a random token. Paths, versions,
# dates and run ids are left alone (a /, one case, or dashes between the digits).
RANDOM_MIN_LENGTH = 20
RANDOM_MIN_BITS = 3.5
HEX_MIN_LENGTH = 32
# `name=` (the value is looked at, not consumed: `--comment=password=x` holds two pairs)
_PAIR = re.compile(r"([A-Za-z_][\w.-]*)=(?=([^\s'\"`;&|=,]*))")
_RANDOM_SHAPE = re.compile(r"^[A-Za-z0-9+_\-.~]+={0,2}$")


def is_secret_key(key) -> bool:
    """Whether a config key or variable name names a secret."""
    return any(word in SECRET_WORDS for word in re.split(r"[_\-.]", str(key).lower()))


def looks_random(value: str) -> bool:
    """A long token of letters and digits mixed as only a generator mixes them."""
    if re.fullmatch(rf"[0-9a-fA-F]{{{HEX_MIN_LENGTH},}}", value):
        return True
    if len(value) < RANDOM_MIN_LENGTH or not _RANDOM_SHAPE.match(value):
        return False
    if not all(re.search(c, value) for c in (r"\d", "[a-z]", "[A-Z]")):
        return False
    counts = Counter(value)
    bits = -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())
    return bits >= RANDOM_MIN_BITS


def secret_in(text: str) -> str | None:
    """Why `text` (a shell line, an sbatch option, a value) holds a secret, naming what
    was found but never the secret itself; None when nothing looks like one."""
    text = str(text)
    found = TOKEN_PREFIXES.search(text)
    if found:
        return f"a token of a known kind ({found.group(0)[:3]}...)"
    for name, value in _PAIR.findall(text):
        value = value.strip()
        if value and not value.startswith("$") and is_secret_key(name):
            return f"{name}=... (a secret's name)"
        if looks_random(value):
            return f"{name}=... (a long random-looking value)"
    return None
