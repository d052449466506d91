"""Which config keys and environment variables hold secrets.

One definition for everything that must keep a secret out of sight: config.yaml and W&B
mask these keys' values (launcher.train.job.redacted), and the cluster renderers refuse to write
them into a job script, a manifest or a command line (launcher.submit.job).
"""

from __future__ import annotations

import re

# A key is secret when one of its words (split at _ - .) is one of these: WANDB_API_KEY,
# hf_token, db_password; not `data.tokenizer`, `data.shard_tokens` or TOKENIZERS_PARALLELISM.
SECRET_WORDS = frozenset({"key", "apikey", "token", "secret", "password", "passwd"})


def is_secret_key(key) -> bool:
    """Whether a config key or variable name names a secret."""
    return any(word in SECRET_WORDS for word in re.split(r"[_\-.]", str(key).lower()))
