"""`WANDB_MODE` in the environment, as W&B's own banner tells users to set it, is honoured
when `logger.mode` is not given; a given `logger.mode` wins; `logger=none` stays off."""

from __future__ import annotations

from launcher.config.compose import compose


def test_wandb_mode_from_the_environment_unless_given(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert compose(["logger=wandb"]).logger.mode == "offline"
    assert compose(["logger=[wandb,tensorboard]"]).logger.mode == "offline"
    assert compose(["logger=wandb", "logger.mode=online"]).logger.mode == "online"
    assert compose([]).logger.mode == "disabled"  # logger=none: no W&B whatever the variable
    monkeypatch.delenv("WANDB_MODE")
    assert compose(["logger=wandb"]).logger.mode == "online"
