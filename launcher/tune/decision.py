"""Keep or reject a candidate: faster than the incumbent by more than the measured noise,
and, when it changes the math, with the loss the incumbent had on the same data.

Each side is run `tune.repeats` times; the noise is the larger spread (max - min of the
per-trial median step times) of the two sides, so a gain that repeats cannot tell apart
from run-to-run variation on this machine is not a gain.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field


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
        return self.status == "completed" and self.p50_s is not None


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

    def median(self, attr: str = "p50_s") -> float | None:
        values = self._values(attr)
        return statistics.median(values) if values else None

    def spread(self, attr: str = "p50_s") -> float | None:
        values = self._values(attr)
        return max(values) - min(values) if values else None

    def figures(self) -> dict:
        """What the report shows: medians over the repeats, with their spread."""
        return {
            "step_time_p50_s": self.median("p50_s"),
            "step_time_p50_spread_s": self.spread("p50_s"),
            "step_time_p90_s": self.median("p90_s"),
            "tokens_per_s": self.median("tokens_per_s"),
            "tokens_per_s_spread": self.spread("tokens_per_s"),
            "mean_loss": self.median("mean_loss"),
            "trials": [t.label for t in self.trials],
        }


@dataclass
class Verdict:
    better: bool  # beats the incumbent by more than the noise, within the loss tolerance
    reason: str
    gain_s: float | None = None


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
    if base is None or mine is None:
        return Verdict(False, "no step time measured")
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
    gain = base - mine
    noise = noise_multiple * max(incumbent.spread(), candidate.spread())
    if gain <= 0:
        return Verdict(False, f"slower by {-gain * 1e3:.1f} ms per step", gain)
    if gain <= noise:
        return Verdict(
            False,
            f"{gain * 1e3:.1f} ms per step faster, within the noise ({noise * 1e3:.1f} ms)",
            gain,
        )
    if gain < min_gain * base:
        return Verdict(
            False,
            f"{gain / base:.1%} faster, below tune.min_gain={min_gain:g}",
            gain,
        )
    return Verdict(True, f"{gain * 1e3:.1f} ms per step faster ({base / mine:.2f}x)", gain)


def best(verdicts: dict[str, Verdict]) -> str | None:
    """The candidate with the largest gain among those that beat the incumbent."""
    kept = {name: v for name, v in verdicts.items() if v.better}
    return max(kept, key=lambda n: kept[n].gain_s) if kept else None
