"""A config group's option file holds only what differs from the schema.

Each knob's default lives once, beside its dataclass field (launcher/config/schema.py and each
engine's package), where its range and check are. A YAML that repeated it would be a second
copy to keep in step: change the dataclass and the YAML silently wins. The option's identity
key (`name`, or `source` for data) is the one exception: it is what the code and a sweep read
to know which option was chosen. Experiments (`conf/exp/`) are exempt on purpose: an
experiment states every value it depends on, so a changed default cannot change it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from launcher.config.compose import compose
from launcher.config.registry import engines
from launcher.config.schema import TrainConfig

from paths import REPO

CONF = REPO / "conf"
IDENTITY_KEYS = {"name", "source"}
OPTION_FILES = sorted(p for p in CONF.glob("*/*.yaml") if p.parent.name != "exp")


def schema_node(group: str, option: str) -> DictConfig:
    """The defaults an option file is merged onto: its group's dataclass (a strategy option:
    the engine's schema, found by composing the option)."""
    if group == "strategy":
        name = compose([f"strategy={option}"]).strategy.name
        return OmegaConf.structured(engines()[name].schema)
    return OmegaConf.structured(TrainConfig)[group]


def repeated_defaults(raw: DictConfig, base: DictConfig, prefix: str = "") -> list[str]:
    found = []
    for key, value in raw.items():
        if key == "defaults" or (not prefix and key in IDENTITY_KEYS):
            continue
        if key not in base:  # a MISSING field (model sizes) or an unknown key (compose says)
            continue
        if OmegaConf.is_dict(value) and len(value):
            found += repeated_defaults(value, base[key], f"{prefix}{key}.")
        elif OmegaConf.to_container(OmegaConf.create({"v": value})) == OmegaConf.to_container(
            OmegaConf.create({"v": base[key]})
        ):
            found.append(f"{prefix}{key}: {value}")
    return found


@pytest.mark.parametrize("path", OPTION_FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_option_file_repeats_no_schema_default(path: Path):
    repeated = repeated_defaults(OmegaConf.load(path), schema_node(path.parent.name, path.stem))
    assert not repeated, f"{path.relative_to(CONF.parent)} repeats schema defaults: {repeated}"


def test_train_yaml_repeats_no_schema_default():
    raw = OmegaConf.load(CONF / "train.yaml")  # its `hydra` node is not the schema's
    assert not repeated_defaults(raw, OmegaConf.structured(TrainConfig))


def test_the_check_sees_a_repeated_default():
    """The check itself can fail: a planted repeat is found, a changed value is not."""
    base = OmegaConf.structured(TrainConfig).trainer
    planted = OmegaConf.create({"max_steps": base.max_steps, "lr": base.lr * 2})
    assert repeated_defaults(planted, base) == [f"max_steps: {base.max_steps}"]
