"""The front doors' own flags (`--max-tokens`, `--iters`, ...): a bad value is one line and
exit code 2, as a bad override is, never argparse's usage block or a traceback.

`FlagParser` is argparse with its error said in one line; `whole` and `number` are the
`type=` of a flag with a range, whose refusal names the flag, the value and the rule (NaN
and infinity are refused by `number`: no flag takes them).
"""

from __future__ import annotations

import argparse
import math
import sys

BAD_INPUT = 2  # the contract's code (launcher.resilience.exit_codes.BAD_INPUT)


class FlagParser(argparse.ArgumentParser):
    """argparse whose refusal (a missing argument, an unknown flag, a value its `type`
    refuses) is the one line `error: ...; see <prog> --help` and exit code 2."""

    def error(self, message: str):
        print(f"error: {message}; see {self.prog} --help", file=sys.stderr)
        sys.exit(BAD_INPUT)


def whole(low: int, high: int | None = None, why: str = ""):
    """A `type=` for a whole number within [low, high]: `--iters 0` -> 'must be at least 1'."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low or (high is not None and value > high):
            rule = f"at least {low}" if high is None else f"within {low}..{high}"
            raise argparse.ArgumentTypeError(f"{value}: must be {rule}{why}")
        return value

    return parse


def number(low: float, why: str = ""):
    """A `type=` for a finite number of at least `low`: NaN, infinity and less refused."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or value < low:
            raise argparse.ArgumentTypeError(
                f"{text}: must be a finite number of {low:g} or more{why}"
            )
        return value

    return parse
