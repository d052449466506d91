"""The configuration: its typed schema (`schema`), composition and one-line error wording
(`compose`), the semantic check of a composed config (`validate`), every numeric key's range
(`ranges`), the engines a run can name and what each declares (`registry`), the batch
arithmetic (`batch`), the `nccl` group's variables (`nccl_vars`), which keys hold secrets
(`secret_keys`) and the points of a sweep and their summary (`sweep`). Checks that need the
machine, files or other layers are launcher.preflight's."""

from __future__ import annotations

from launcher.config.compose import (
    compose,
    describe_compose_error,
    friendly_overrides,
    unknown_key_line,
)
from launcher.config.errors import ConfigError
from launcher.config.schema import *  # noqa: F403 - the schema's classes and choices
from launcher.config.schema import TrainConfig, typed
from launcher.config.validate import normalize, validate

__all__ = [
    "ConfigError",
    "TrainConfig",
    "compose",
    "describe_compose_error",
    "friendly_overrides",
    "normalize",
    "typed",
    "unknown_key_line",
    "validate",
]
