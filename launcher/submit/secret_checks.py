"""What of an experiment would put a secret where others can read it, checked before a
cluster job is written: refused in one line that names the key and this cluster's way to
get a secret to the job (`cluster.secrets`), or, where the shape is ambiguous, warned about.

Where a text lands decides how strictly it is read (launcher.config.secret_keys):
- every override's value and every string of the composed config (an experiment file's
  too): the run's config.yaml, W&B and, on Kubernetes, the pod's arguments;
- the keys that become shell text (setup lines, exported variables, sbatch options,
  mounts): the job script, the pod's `/bin/sh -c` argument, `ps` on the nodes;
- the keys every user of the cluster can read (the job's name and run id in `squeue`,
  `scontrol show job` and every rank's command line; the sbatch options, `--comment`
  among them; a pod's name, labels and annotations): there a long run of hex digits is
  refused too, where elsewhere it is only warned about (a git commit has 40, as a W&B key).
"""

from __future__ import annotations

import re

from omegaconf import DictConfig, OmegaConf

from launcher.config import ConfigError
from launcher.config.backends import backend, public_text_keys, shell_text_keys
from launcher.config.secret_keys import (
    ambiguous_secret_in,
    exposed_secret_in,
    is_secret_key,
    secret_in,
)
from launcher.config.sweep import flatten

# Keys whose values become shell text in the job (exports, setup lines), and each backend's
# (sbatch options...: launcher.config.backends.shell_text_keys).
SHELL_TEXT_KEYS = ("cluster.setup", "cluster.env", "nccl.env")
# Keys every user of the cluster sees, and each backend's (public_text_keys).
PUBLIC_TEXT_KEYS = ("cluster.job_name", "run.id")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def shell_texts() -> tuple[str, ...]:
    """The keys whose values become shell text: SHELL_TEXT_KEYS and every backend's."""
    return (*SHELL_TEXT_KEYS, *shell_text_keys())


def public_texts() -> tuple[str, ...]:
    """The keys every user of the cluster can read: PUBLIC_TEXT_KEYS and every backend's."""
    return (*PUBLIC_TEXT_KEYS, *public_text_keys())


def check_secrets(target: str, overrides: list[str], configs: list[DictConfig]) -> list[str]:
    """Refuse (ConfigError) a secret that would be written into the job's files and,
    through them, the ranks' environment listing, command lines or the cluster's job list;
    return one warning line for each key holding an ambiguous shape (a commit's 40 hex
    digits). By name: a key of cluster.env or nccl.env, an added key, or `NAME=value`
    inside a setup line, an sbatch option or a mount. By value and shape: everywhere."""
    check_secret_names(configs)
    names = [
        f"{group}.{name}"
        for cfg in configs
        for group in ("cluster.env", "nccl.env")
        for name in OmegaConf.select(cfg, group)
    ]
    names += [o.split("=", 1)[0].lstrip("+~") for o in overrides if o.startswith("+")]
    for name in dict.fromkeys(names):
        if is_secret_key(name):
            raise ConfigError(f"{name} is a secret: {secret_fix(target)}")
    texts = [*_shell_texts(configs), *_override_values(overrides), *_config_values(configs)]
    for where, text in texts:
        why = secret_in(text)
        if why:
            raise ConfigError(f"{where} holds a secret, {why}: {secret_fix(target)}")
    for where, text in _public_texts(configs):
        why = exposed_secret_in(text)
        if why:
            raise ConfigError(
                f"{where} holds a secret, {why}, where every user of the cluster reads it "
                f"(the job list, kubectl get); {fix_way(target)}"
            )
    warned = {}
    for where, text in texts:
        why = ambiguous_secret_in(text)
        if why and where.split("[")[0] not in warned:
            warned[where.split("[")[0]] = (
                f"{where} holds {why}: a commit or a hash is fine; if it is a secret, remove "
                f"it and {backend(target).secret_way}"
            )
    return list(warned.values())


def check_secret_names(configs: list[DictConfig]) -> None:
    """cluster.secrets holds variable names, never their values (the line does not repeat
    what was given: it may be the value)."""
    for i, name in enumerate(configs[0].cluster.secrets):
        if not _NAME.match(str(name)):
            raise ConfigError(
                f"cluster.secrets[{i}] is not a variable name; name the variables the job "
                "needs (cluster.secrets=[HF_TOKEN]): their values stay in your environment"
            )


def secret_fix(target: str) -> str:
    return "it would be written into the job's files and every rank's command line; " + fix_way(
        target
    )


def fix_way(target: str) -> str:
    return f"remove it and {backend(target).secret_way}"


def _override_values(overrides: list[str]):
    for override in overrides:
        key, _, value = override.partition("=")
        yield key.lstrip("+~"), value


def _shell_texts(configs: list[DictConfig]):
    """(key, text) of every value that becomes shell text in the job (shell_texts())."""
    return _texts_of(configs, shell_texts())


def _public_texts(configs: list[DictConfig]):
    """(key, text) of every value of the keys every user of the cluster reads."""
    return _texts_of(configs, public_texts())


def _texts_of(configs: list[DictConfig], keys: tuple[str, ...]):
    """(key, text) of the values of `keys`: a list item by its index, a mapping's entry as
    `NAME=value` (so that its name counts too), a scalar as it is."""
    for cfg in configs:
        for key in keys:
            node = OmegaConf.select(cfg, key)
            if node is None:
                continue
            if OmegaConf.is_dict(node):
                for name, value in node.items():
                    yield f"{key}.{name}", f"{name}={value}"
            elif OmegaConf.is_list(node):
                for i, line in enumerate(node):
                    yield f"{key}[{i}]", str(line)
            else:
                yield key, str(node)


def _config_values(configs: list[DictConfig]):
    """(key, text) of every string of the composed configs (an experiment file's too)."""
    for cfg in configs:
        for key, value in flatten(OmegaConf.to_container(cfg, resolve=False)).items():
            if isinstance(value, str) and value:
                yield key, value
