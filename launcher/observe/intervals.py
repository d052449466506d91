"""Arithmetic on time intervals `(start, end)`: what both the live communication timer and
the trace analyser need to say how much of one activity was hidden behind another."""

from __future__ import annotations

Interval = tuple[float, float]


def merged(intervals: list[Interval]) -> list[Interval]:
    """The same time covered by sorted, disjoint intervals."""
    out: list[list[float]] = []
    for lo, hi in sorted(intervals):
        if hi <= lo:
            continue
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


def union_length(intervals: list[Interval]) -> float:
    """Total length covered by possibly overlapping intervals."""
    return sum(hi - lo for lo, hi in merged(intervals))


def overlap_length(a: list[Interval], b: list[Interval]) -> float:
    """Length of the time covered by both `a` and `b`."""
    x, y = merged(a), merged(b)
    total, i, j = 0.0, 0, 0
    while i < len(x) and j < len(y):
        lo, hi = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        total += max(hi - lo, 0.0)
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total
