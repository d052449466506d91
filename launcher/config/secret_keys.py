"""Which config keys, environment variables and values hold secrets.

One definition for everything that must keep a secret out of sight: config.yaml and W&B
mask these keys' values (launcher.train.job.redacted), and the cluster renderers refuse to write
them into a job script, a manifest or a command line (launcher.submit.secrets): by name (a
key or variable such as HF_TOKEN, GH_PAT, in `NAME=value` with the value quoted or not), by
the command that takes one (`wandb login KEY`, `huggingface-cli login --token KEY`,
`docker login -p KEY`), and by value (a token of a known kind, or a long random-looking
word), wherever in a setting's text they stand.

Three verdicts, by where a text lands:
- `secret_in`: a secret anywhere; refused.
- `exposed_secret_in`: in text every user of the cluster can read (a job's name and
  comment, its other sbatch options, a pod's name, labels and annotations), also any long
  run of hex digits or random-looking word inside a word; refused.
- `ambiguous_secret_in`: a run of 32 or more hex digits that nothing else marks as a
  secret, which a git commit (40), a content hash or a W&B API key (40) all are; warned
  about, not refused.
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
# A name with one of these words says where a secret is kept, not the secret:
# HF_TOKEN_FILE=/run/secrets/hf, --password-stdin.
REFERENCE_WORDS = frozenset({"file", "path", "dir", "stdin", "env", "var", "name"})
# Options that take a secret as their value (`--token X`, `--api-key=X`); `-p` only in a
# login command (docker login -p X). Not `--key`, which mostly names a key file.
SECRET_OPTION_WORDS = frozenset(SECRET_WORDS - {"key"} | {"api", "auth"})
# Tokens whose kind shows in their first characters (Hugging Face, GitHub, GitLab, Slack,
# OpenAI-style, Stripe, AWS access key ids, Google API keys, npm, PyPI, Docker Hub, JWTs).
TOKEN_PREFIXES = re.compile(
    r"(?<![A-Za-z0-9])(hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,}"
    r"|glpat-[\w-]{20,}|xox[abposr]-[\w-]{10,}|sk-[\w-]{20,}|sk_live_\w{16,}"
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}|AIza[\w-]{35}|npm_[A-Za-z0-9]{30,}|pypi-[\w-]{30,}"
    r"|dckr_pat_[\w-]{20,}|eyJ[\w-]{10,}\.[\w-]{10,}\.[\w-]{10,})"
)
# A word at least this long, of one word-like piece, mixing upper case, lower case and
# digits this unpredictably (Shannon entropy, bits per character): a random token. Paths,
# versions, dates and run ids are left alone (a /, one case, or dashes between the digits).
RANDOM_MIN_LENGTH = 20
RANDOM_MIN_BITS = 3.5
# A W&B API key is 40 hex digits; so is a git commit, and a sha256 is 64.
HEX_MIN_LENGTH = 32
# A name that says its hex value is a commit or a digest (GIT_COMMIT=<40 hex>): ambiguous.
COMMIT_WORDS = frozenset({"commit", "sha", "rev", "revision", "hash", "digest", "ref", "version"})
# Commands that log in with a token given on their command line.
_LOGIN = re.compile(
    r"(?P<command>\b(?P<tool>wandb|huggingface-cli|hf|docker|podman|nerdctl|helm|oras|skopeo"
    r"|buildah|apptainer|singularity|gh)\b(?:\s+(?:auth|registry|remote))?\s+login)\b"
    r"(?P<rest>[^;&|]*)"
)
# A value: quoted ('...', "...", $'...') or a bare word (up to a shell separator).
_VALUE = r"""(\$?'[^']*'|"[^"]*"|[^\s'"`;&|=,)]*)"""
# `name=` (the value is looked at, not consumed: `--comment=password=x` holds two pairs)
_PAIR = re.compile(rf"([A-Za-z_][\w.-]*)=(?={_VALUE})")
_OPTION = re.compile(rf"(?<![\w-])--?([A-Za-z][\w-]*)(?:=|\s+)(?={_VALUE})")
_BEARER = re.compile(
    r"(?:\b(?:Bearer|Basic)|Authorization:\s*\w+)\s+([A-Za-z0-9+/_.~=-]{8,}|\$\S*)"
)
_URL_PASSWORD = re.compile(r"://[^/\s:@'\"]+:([^@\s/'\"]+)@")
_WORD_SPLIT = re.compile(r"[\s'\"`;&|()<>=,\[\]{}]+")
_RANDOM_SHAPE = re.compile(r"^[A-Za-z0-9+_\-.~]+={0,2}$")
_HEX_WORD = re.compile(rf"[0-9a-fA-F]{{{HEX_MIN_LENGTH},}}")
_HEX_RUN = re.compile(rf"(?<![0-9a-fA-F])(?<!sha256:)(?<!sha512:)[0-9a-fA-F]{{{HEX_MIN_LENGTH},}}")


def is_secret_key(key) -> bool:
    """Whether a config key or variable name names a secret."""
    return any(word in SECRET_WORDS for word in _words_of(key))


def _words_of(name) -> list[str]:
    return re.split(r"[_\-.]", str(name).lower())


def looks_random(value: str) -> bool:
    """A long token of letters and digits mixed as only a generator mixes them, or a long
    run of hex digits (a W&B key, or a commit: `looks_hex` tells them apart where it may)."""
    if looks_hex(value):
        return True
    if len(value) < RANDOM_MIN_LENGTH or not _RANDOM_SHAPE.match(value):
        return False
    if not all(re.search(c, value) for c in (r"\d", "[a-z]", "[A-Z]")):
        return False
    counts = Counter(value)
    bits = -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())
    return bits >= RANDOM_MIN_BITS


def looks_hex(value: str) -> bool:
    """Nothing but 32 or more hex digits: a W&B key, a git commit, a content hash."""
    return bool(_HEX_WORD.fullmatch(value))


def secret_in(text: str) -> str | None:
    """Why `text` (a shell line, an sbatch option, a value) holds a secret, naming what
    was found but never the secret itself; None when nothing looks like one."""
    text = str(text)
    found = TOKEN_PREFIXES.search(text)
    if found:
        return f"a token of a known kind ({found.group(0)[:3]}...)"
    return (
        _login_problem(text)
        or _pair_problem(text)
        or _option_problem(text)
        or _header_or_url_problem(text)
        or _random_word(text)
    )


def exposed_secret_in(text: str) -> str | None:
    """`secret_in`, or for text every user can read (squeue, scontrol, kubectl get) also a
    long run of hex digits or a random-looking word anywhere in it, even inside a word
    (`j<key>`): none of those belongs in a job's name, comment or labels."""
    text = str(text)
    why = secret_in(text)
    if why:
        return why
    if _HEX_RUN.search(text):
        return f"a run of {len(_HEX_RUN.search(text).group(0))} hex digits (a W&B API key has 40)"
    return None


def ambiguous_secret_in(text: str) -> str | None:
    """A run of 32 or more hex digits where `secret_in` found nothing (alone, in a word, or
    given to a name such as GIT_COMMIT): a git commit or a content hash, or a W&B API key:
    said, not refused."""
    found = _HEX_RUN.search(str(text))
    if found:
        return f"{len(found.group(0))} hex digits (a git commit, or a W&B API key?)"
    return None


def _names_a_commit(name: str) -> bool:
    return any(word in COMMIT_WORDS for word in _words_of(name))


def _literal(value: str) -> str | None:
    """The text of a shell value as written (its quotes taken off); None for a reference
    to a variable or a command ($VAR, "$VAR", $(cat file)): the secret stays where it is."""
    if value.startswith("$'") and value.endswith("'") and len(value) > 2:
        return value[2:-1]
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        inner = value[1:-1]
        return None if value[0] == '"' and "$" in inner else inner
    return None if "$" in value else value


def _is_path(value: str) -> bool:
    return value.startswith(("/", "~", "./", "../"))


def _pair_problem(text: str) -> str | None:
    """`NAME=value` with a secret's name and a value written out, in any quoting; or any
    name given a random-looking value (a hex one given to a commit's name is ambiguous)."""
    for name, value in _PAIR.findall(text):
        value = _literal(value)
        if not value:
            continue
        reference = any(w in REFERENCE_WORDS for w in _words_of(name)) or _is_path(value)
        if is_secret_key(name) and not reference:
            return f"{name}=... (a secret's name)"
        if looks_random(value) and not (looks_hex(value) and _names_a_commit(name)):
            return f"{name}=... (a long random-looking value)"
    return None


def _option_problem(text: str) -> str | None:
    """`--token X`, `--password=X`, `--api-key X`: a secret on a command line, which every
    user of the node reads (ps), whether written out or expanded from a variable."""
    for name, value in _OPTION.findall(text):
        words = name.lower().split("-")
        if not any(w in SECRET_OPTION_WORDS for w in words) or any(
            w in REFERENCE_WORDS for w in words
        ):
            continue
        if value and not value.startswith("-") and not _is_path(value.strip("'\"")):
            return f"--{name} ... (a secret on a command line)"
    return None


def _login_problem(text: str) -> str | None:
    """A login command given its token: `wandb login KEY`, `huggingface-cli login --token
    KEY`, `docker login -p KEY` (also as $VAR: its value is then on the command line)."""
    for found in _LOGIN.finditer(text):
        tool, words = found.group("tool"), found.group("rest").split()
        command = " ".join(found.group("command").split())
        for i, word in enumerate(words):
            if word in ("-p", "--password", "--token", "--key", "--api-key") and i + 1 < len(words):
                return f"`{command} {word} ...` (a token on a command line)"
            if word.startswith(("--password=", "--token=", "-p=", "--key=")):
                return f"`{command} {word.split('=')[0]}=...` (a token on a command line)"
            if tool == "wandb" and not word.startswith("-") and "://" not in word:
                previous = words[i - 1] if i else ""
                if previous not in ("--host", "--cloud", "--timeout"):
                    return "`wandb login KEY` (a key on a command line)"
    return None


def _header_or_url_problem(text: str) -> str | None:
    """`Authorization: Bearer X` and `https://user:password@host/`, written out."""
    found = _BEARER.search(text)
    if found and "$" not in found.group(1):
        return "an Authorization header's credentials"
    found = _URL_PASSWORD.search(text)
    if found and not found.group(1).startswith("$"):
        return "a password in a URL"
    return None


def _random_word(text: str) -> str | None:
    """A random-looking word of its own (letters and digits in every case): a token, not a
    name. Words with a / or : are paths, URLs and image names; hex alone is ambiguous."""
    for word in _WORD_SPLIT.split(text):
        if word.startswith(("$", "-")) or "/" in word or ":" in word or "@" in word:
            continue
        if looks_random(word) and not looks_hex(word):
            return "a long random-looking word"
    return None
