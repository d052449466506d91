"""Keep or reject a candidate, on one figure of merit: tokens/s, the work a second buys.

A step time alone can mislead (a candidate that does more tokens per step is slower per
step and faster at training), so the tuner judges tokens/s; a candidate that changes the
math must first show the loss the incumbent had on the same data.

Each side is run `tune.repeats` times, and every statistic is one that a single wild repeat
(a neighbour's job, a late wake-up) cannot move:

- the centre of a side is the median of its repeats;
- a repeat far from its side's median (more than `OUTLIER_MADS` robust deviations, and more
  than `OUTLIER_FLOOR` of the median) is an outlier: shown in the report, left out of the
  test and of the noise;
- "real" is a one-sided rank test (Mann-Whitney) of the candidate's trusted repeats against
  the incumbent's, at `SIGNIFICANCE`, or at the most extreme ordering the repeats allow where
  they are too few to reach it (two against two: every candidate repeat above every
  incumbent repeat);
- the noise is the larger relative spread (max - min over the median) of the two sides'
  trusted repeats; the median gain must exceed `tune.noise_multiple` of it, and
  `tune.min_gain`.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from functools import cache

SIGNIFICANCE = 0.05
OUTLIER_MADS = 3.0  # in units of 1.4826 x MAD, the standard deviation of a normal sample
OUTLIER_FLOOR = 0.02  # of the median: identical repeats do not make a 1% step an outlier
MERIT = "tokens_per_s"


@dataclass
class Trial:
    """One timed trial's figures (from its summary.json and metrics.jsonl)."""

    label: str
    status: str
    p50_s: float | None = None
    p90_s: float | None = None
    tokens_per_s: float | None = None
    mean_loss: float | None = None  # over every logged step of the trial
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "completed" and self.tokens_per_s is not None


def outliers(values: list[float]) -> list[bool]:
    """Which of `values` lie far from their median (robust: a median absolute deviation, so
    the outlier itself does not widen the yardstick); two values never outvote each other."""
    if len(values) < 3:
        return [False] * len(values)
    middle = statistics.median(values)
    mad = statistics.median(abs(v - middle) for v in values)
    limit = OUTLIER_MADS * max(1.4826 * mad, OUTLIER_FLOOR * abs(middle))
    return [abs(v - middle) > limit for v in values]


@dataclass
class Measured:
    """The repeated trials of one configuration (the incumbent, or one candidate)."""

    trials: list[Trial] = field(default_factory=list)

    def _values(self, attr: str) -> list[float]:
        return [getattr(t, attr) for t in self.trials if t.ok and getattr(t, attr) is not None]

    @property
    def failure(self) -> str | None:
        bad = [t for t in self.trials if not t.ok]
        return f"trial {bad[0].label}: {bad[0].status}" if bad else None

    def median(self, attr: str = MERIT) -> float | None:
        values = self._values(attr)
        return statistics.median(values) if values else None

    def outlier_labels(self) -> list[str]:
        """The repeats whose figure of merit is an outlier of this side."""
        ok = [t for t in self.trials if t.ok]
        return [t.label for t, far in zip(ok, outliers(self._values(MERIT)), strict=True) if far]

    def trusted(self, attr: str = MERIT) -> list[float]:
        """The repeats' `attr` without the outliers (judged on the figure of merit)."""
        ok = [t for t in self.trials if t.ok]
        far = outliers([t.tokens_per_s for t in ok])
        return [getattr(t, attr) for t, out in zip(ok, far, strict=True) if not out]

    def spread(self, attr: str = MERIT) -> float | None:
        """max - min of the trusted repeats."""
        values = [v for v in self.trusted(attr) if v is not None]
        return max(values) - min(values) if values else None

    def relative_spread(self) -> float:
        middle, spread = self.median(), self.spread()
        return spread / middle if middle and spread is not None else 0.0

    def figures(self) -> dict:
        """What the report shows: medians over the repeats, the trusted spread, outliers."""
        return {
            "tokens_per_s": self.median(MERIT),
            "tokens_per_s_spread": self.spread(MERIT),
            "step_time_p50_s": self.median("p50_s"),
            "step_time_p50_spread_s": self.spread("p50_s"),
            "step_time_p90_s": self.median("p90_s"),
            "mean_loss": self.median("mean_loss"),
            "trials": [t.label for t in self.trials],
            "outliers": self.outlier_labels(),
        }


@cache
def _u_counts(n: int, m: int) -> tuple[int, ...]:
    """How many of the C(n+m, n) orderings of n values among m give each Mann-Whitney U
    (the number of (x, y) pairs with x above y), U = 0 .. n*m."""
    if n == 0 or m == 0:
        return (1,)
    counts = [0] * (n * m + 1)
    # the largest of all values is an x (it beats all m y's) or a y (it beats nothing)
    for u, c in enumerate(_u_counts(n - 1, m)):
        counts[u + m] += c
    for u, c in enumerate(_u_counts(n, m - 1)):
        counts[u] += c
    return tuple(counts)


def rank_test(higher: list[float], lower: list[float]) -> tuple[float, float]:
    """The one-sided exact Mann-Whitney test that `higher` lies above `lower`: its p-value
    (ties count half, rounded down to the next whole U), and the smallest p-value these
    counts could give at all."""
    u = sum((x > y) + 0.5 * (x == y) for x in higher for y in lower)
    counts = _u_counts(len(higher), len(lower))
    total = math.comb(len(higher) + len(lower), len(higher))
    p = sum(counts[math.floor(u) :]) / total
    return p, 1 / total


@dataclass
class Verdict:
    better: bool  # more tokens/s than the incumbent, really, within the loss tolerance
    reason: str
    gain: float | None = None  # candidate / incumbent tokens/s - 1
    p_value: float | None = None


def judge(
    incumbent: Measured,
    candidate: Measured,
    *,
    changes_math: bool,
    loss_tolerance: float,
    min_gain: float,
    noise_multiple: float,
) -> Verdict:
    """Whether `candidate` is a real improvement on `incumbent`, and why (one sentence)."""
    if candidate.failure:
        return Verdict(False, f"failed: {candidate.failure}")
    base, mine = incumbent.median(), candidate.median()
    if not base or not mine:
        return Verdict(False, "no tokens/s measured")
    if changes_math:
        b_loss, c_loss = incumbent.median("mean_loss"), candidate.median("mean_loss")
        diff = abs(c_loss - b_loss) / abs(b_loss) if b_loss else float("inf")
        if diff > loss_tolerance:
            return Verdict(
                False,
                f"loss {c_loss:.6f} differs from the incumbent's {b_loss:.6f} by {diff:.2g} "
                f"(relative), "
                f"more than tune.loss_tolerance={loss_tolerance:g} on the same data",
            )
    gain = mine / base - 1
    rates = f"{mine:,.0f} tokens/s against {base:,.0f}"
    if gain <= 0:
        return Verdict(False, f"fewer tokens/s: {rates} ({gain:+.1%})", gain)
    p, smallest = rank_test(candidate.trusted(), incumbent.trusted())
    level = max(SIGNIFICANCE, smallest)
    if p > level:
        return Verdict(
            False,
            f"{rates} ({gain:+.1%}), not told apart from the incumbent's repeats "
            f"(rank test p={p:.2f} > {level:.2f})",
            gain,
            p,
        )
    noise = noise_multiple * max(incumbent.relative_spread(), candidate.relative_spread())
    if gain <= noise:
        return Verdict(False, f"{rates} ({gain:+.1%}), within the noise ({noise:.1%})", gain, p)
    if gain < min_gain:
        return Verdict(False, f"{rates} ({gain:+.1%}), below tune.min_gain={min_gain:g}", gain, p)
    return Verdict(True, f"{rates} ({mine / base:.2f}x, rank test p={p:.2f})", gain, p)


def best(verdicts: dict[str, Verdict]) -> str | None:
    """The candidate with the largest gain in tokens/s among those that beat the incumbent."""
    kept = {name: v for name, v in verdicts.items() if v.better}
    return max(kept, key=lambda n: kept[n].gain) if kept else None
