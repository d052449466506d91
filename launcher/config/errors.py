"""The one exception every configuration check raises."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration problem, worded as the single line the user will see."""


def check_choice(key: str, value, allowed: tuple[str, ...]) -> None:
    """`key=value` must be one of `allowed` (a string choice the schema types only as str)."""
    if value not in allowed:
        raise ConfigError(f"{key}={value}: not one of {', '.join(allowed)}")
