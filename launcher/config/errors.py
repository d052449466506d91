"""The one exception every configuration check raises."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration problem, worded as the single line the user will see."""
