"""Secrets known by name and by shape, refused by every renderer (Slurm and each Kubernetes
kind) in one line that names the key and the way this cluster gets a secret to the job
(`cluster.secrets`), without repeating the secret and without writing anything; an
ambiguous shape (a commit's 40 hex digits) warned about and rendered. The shapes
themselves, text by text: tests/unit/config/test_secret_keys.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from launcher.config import ConfigError
from launcher.config.backends import backend
from launcher.submit import slurm
from launcher.submit.__main__ import main as submit_main
from launcher.submit.job import prepare

from launch import FAST
from submit_render import SHAPE

KEY = "0123456789abcdef0123456789abcdef01234567"  # 40 hex digits: a W&B key's shape
HF = "hf_" + "aZ3kq9Xw7Lm2Pv8Rt5Yb1Nc4"  # a made-up token of Hugging Face's shape
RANDOM = "aZ3kq9Xw7Lm2Pv8Rt5Yb1Nc4"
# Every renderer: Slurm, and each Kubernetes kind.
TARGETS = {
    "slurm": ("slurm", []),
    "job": ("k8s", ["cluster.k8s.kind=job"]),
    "jobset": ("k8s", ["cluster.k8s.kind=jobset"]),
    "pytorchjob": ("k8s", ["cluster.k8s.kind=pytorchjob"]),
    "trainjob": ("k8s", ["cluster.k8s.kind=trainjob"]),
}


def dry_run(capsys, name: str, root: Path, *overrides: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of a --dry-run with target `name` into run.root=`root`."""
    target, kind = TARGETS[name]
    args = [*FAST, *SHAPE[target], *kind, f"run.root={root}", "run.id=r", *overrides]
    code = submit_main([target, "--dry-run", *args])
    return code, *capsys.readouterr()


def refused_line(capsys, name: str, root: Path, *overrides: str) -> str:
    """The one error line; asserts exit 2, nothing on stdout and nothing written."""
    code, out, err = dry_run(capsys, name, root, *overrides)
    assert code == 2 and out == "", err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert not (root / "r").exists()
    return err


# (override, the words of the line): each form the issue met, and the class around it:
# the NAME=value form in any quoting, login commands given their token, known prefixes,
# options that take a secret, credentials in a URL or a header, random words.
REFUSED = [
    (
        f"cluster.setup=[\"export WANDB_API_KEY='{KEY}'\"]",
        "cluster.setup[0] holds a secret, WANDB_API_KEY=... (a secret's name)",
    ),
    (
        f'cluster.setup=["export WANDB_API_KEY=\\"{KEY}\\""]',
        "cluster.setup[0] holds a secret, WANDB_API_KEY=... (a secret's name)",
    ),
    (
        f"cluster.setup=[\"export WANDB_API_KEY=$'{KEY}'\"]",
        "cluster.setup[0] holds a secret, WANDB_API_KEY=... (a secret's name)",
    ),
    (
        f'cluster.setup=["wandb login {KEY}"]',
        "cluster.setup[0] holds a secret, `wandb login KEY` (a key on a command line)",
    ),
    (
        'cluster.setup=["wandb login --relogin $WANDB_API_KEY"]',
        "cluster.setup[0] holds a secret, `wandb login KEY` (a key on a command line)",
    ),
    (
        'cluster.setup=["huggingface-cli login --token abc123"]',
        "cluster.setup[0] holds a secret, `huggingface-cli login --token ...`",
    ),
    (
        'cluster.setup=["hf auth login --token $HF_TOKEN"]',
        "cluster.setup[0] holds a secret, `hf auth login --token ...`",
    ),
    (
        'cluster.setup=["docker login -u me -p abc123 registry.example.com"]',
        "cluster.setup[0] holds a secret, `docker login -p ...`",
    ),
    (
        'cluster.setup=["my-tool --api-key abc123 sync"]',
        "cluster.setup[0] holds a secret, --api-key ... (a secret on a command line)",
    ),
    (
        'cluster.setup=["git clone https://me:abc123@git.example.com/x"]',
        "cluster.setup[0] holds a secret, a password in a URL",
    ),
    (
        f"cluster.setup=[\"curl -H 'Authorization: Bearer {RANDOM}' x\"]",
        "cluster.setup[0] holds a secret, an Authorization header's credentials",
    ),
    (
        f'cluster.setup=["echo {RANDOM} > ~/.token"]',
        "cluster.setup[0] holds a secret, a long random-looking word",
    ),
    (
        f'cluster.setup=["export HF_TOKEN={HF}"]',
        "cluster.setup[0] holds a secret, a token of a known kind (hf_...)",
    ),
    ("cluster.setup=['export GH_PAT=abc123']", "cluster.setup[0] holds a secret, GH_PAT=..."),
    ("+cluster.env.AWS_CREDENTIALS=abc123", "cluster.env.AWS_CREDENTIALS is a secret"),
    ("+nccl.env.MY_PASSWORD=abc123", "nccl.env.MY_PASSWORD is a secret"),
    (
        f"+cluster.env.BUILD={RANDOM}abc123",
        "cluster.env.BUILD holds a secret, BUILD=... (a long random-looking value)",
    ),
    (f"data.tokenizer={HF}", "data.tokenizer holds a secret, a token of a known kind"),
    ("logger.tags=[sk-" + "a1" * 12 + "]", "logger.tags holds a secret, a token of a known"),
    (f"logger.name={RANDOM}", "logger.name holds a secret, a long random-looking word"),
    (
        f"cluster.job_name=j{KEY}",
        "cluster.job_name holds a secret, a run of 40 hex digits (a W&B API key has 40), where "
        "every user of the cluster reads it",
    ),
    (f"run.id={KEY}", "run.id holds a secret, a run of 40 hex digits"),
    ("cluster.secrets=['HF_TOKEN=abc123']", "cluster.secrets[0] is not a variable name"),
]
SLURM_ONLY = [
    (
        f"cluster.slurm.extra_sbatch=[\"--comment='{KEY}'\"]",
        "cluster.slurm.extra_sbatch[0] holds a secret, comment=... (a long random-looking value)",
    ),
    (
        f"cluster.slurm.extra_sbatch=['--comment=run-{KEY}']",
        "cluster.slurm.extra_sbatch[0] holds a secret, a run of 40 hex digits",
    ),
    (
        "cluster.slurm.extra_sbatch=['--comment=password=abc123']",
        "cluster.slurm.extra_sbatch[0] holds a secret, password=... (a secret's name)",
    ),
]
K8S_ONLY = [
    (
        f"+cluster.k8s.labels.commit={KEY}",
        "cluster.k8s.labels.commit holds a secret, a run of 40 hex digits",
    ),
    (
        f"+cluster.k8s.annotations.note=x{KEY}",
        "cluster.k8s.annotations.note holds a secret, a run of 40 hex digits",
    ),
    (f"cluster.k8s.name=j{KEY}", "cluster.k8s.name holds a secret, a run of 40 hex digits"),
]
# The check is the same code for every renderer (launcher.submit.secret_checks, before any
# renders; only the fix it names is the backend's): every form on Slurm, the issue's forms
# and the keys every user of the cluster reads on each Kubernetes kind.
ISSUE_FORMS = [
    form
    for form in REFUSED
    if form[0].startswith(
        ('cluster.setup=["export', 'cluster.setup=["wandb login 0', "cluster.job", "run.id")
    )
]
CASES = [
    (name, override, words)
    for name in TARGETS
    for override, words in (REFUSED if name == "slurm" else ISSUE_FORMS)
    + (SLURM_ONLY if name == "slurm" else K8S_ONLY)
]


@pytest.mark.parametrize(("name", "override", "words"), CASES,
                         ids=[f"{n}-{o[:48]}" for n, o, _ in CASES])  # fmt: skip
def test_every_secret_form_is_refused_by_every_renderer(tmp_path, capsys, name, override, words):
    err = refused_line(capsys, name, tmp_path, override)
    assert words in err, err
    assert _way(name) in err or "cluster.secrets[0]" in err, err
    for secret in ("abc123", KEY, RANDOM, HF[3:]):
        assert secret not in err, err


@pytest.mark.parametrize("name", TARGETS)
def test_a_commit_in_an_ordinary_key_is_warned_about_and_rendered(tmp_path, capsys, name):
    """40 hex digits in logger.group (or a setup line's `git checkout`) may be a commit: one
    warning line naming the key, exit 0, the files written."""
    setup = f'cluster.setup=["git -C /src checkout {KEY}"]'
    code, out, err = dry_run(capsys, name, tmp_path, f"logger.group={KEY}", setup)
    assert code == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert warnings == [
        "warning: cluster.setup[0] holds 40 hex digits (a git commit, or a W&B API key?): a "
        f"commit or a hash is fine; if it is a secret, remove it and {_way(name)}",
        "warning: logger.group holds 40 hex digits (a git commit, or a W&B API key?): a "
        f"commit or a hash is fine; if it is a secret, remove it and {_way(name)}",
    ], err
    assert out.strip() and all(Path(p).is_file() for p in out.split())


def _way(name: str) -> str:
    return backend(TARGETS[name][0]).secret_way


@pytest.mark.parametrize("name", TARGETS)
def test_cluster_secrets_reach_the_job_by_name_only(tmp_path, capsys, name, monkeypatch):
    """cluster.secrets: Slurm exports the names from the submitting shell (sbatch
    --export); every Kubernetes kind takes each from the Secret cluster.k8s.env_secret by
    secretKeyRef. The value, set in this shell, is in no file."""
    monkeypatch.setenv("MY_LOGIN", RANDOM)
    code, out, err = dry_run(capsys, name, tmp_path, "cluster.secrets=[MY_LOGIN,HF_TOKEN]")
    assert code == 0, err
    text = "".join(Path(p).read_text() for p in out.split())
    assert RANDOM not in text
    if name == "slurm":
        export = text.split("#SBATCH --export=")[1].split("\n")[0].split(",")
        assert export[-2:] == ["MY_LOGIN", "HF_TOKEN"]
        return
    (doc,) = [yaml.safe_load(Path(p).read_text()) for p in out.split() if "service" not in p]
    env = _containers_env(doc)
    for var in ("MY_LOGIN", "HF_TOKEN"):
        ref = {"secretKeyRef": {"name": "launcher-secrets", "key": var}}
        assert {"name": var, "valueFrom": ref} in env, env
    assert "kubectl create secret generic launcher-secrets" in err


def _containers_env(doc) -> list:
    """The training container's env, wherever the kind keeps it."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            if "env" in node and "image" in node:
                found.extend(node["env"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)
    return found


def test_a_secret_named_in_cluster_secrets_must_be_set_at_submit(tmp_path, monkeypatch):
    monkeypatch.delenv("MY_LOGIN", raising=False)
    job = prepare("slurm", [*FAST, f"run.root={tmp_path}", "cluster.secrets=[MY_LOGIN]"])
    with pytest.raises(ConfigError) as refused:
        slurm.check_secrets_set(job, {"HF_TOKEN": "x"})
    assert str(refused.value) == (
        "cluster.secrets names MY_LOGIN, which this shell does not set; export it before "
        "submitting (the job takes cluster.secrets from the submitting shell by name)"
    )
    slurm.check_secrets_set(job, {"MY_LOGIN": "x"})


@pytest.mark.parametrize("name", ["slurm", "job"])
def test_a_variable_that_only_contains_a_secret_word_is_not_refused(tmp_path, capsys, name):
    code, out, err = dry_run(capsys, name, tmp_path, "+cluster.env.TOKENIZERS_PARALLELISM=false_")
    assert code == 0, err
    assert "TOKENIZERS_PARALLELISM" in "".join(Path(p).read_text() for p in out.split())
