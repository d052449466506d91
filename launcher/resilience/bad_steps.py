"""How many non-finite steps a run has dropped, and when that is too many
(`trainer.on_nonfinite=skip`, docs/faults.md).

One bad batch in a long run is noise and worth skipping (PaLM's practice); bad steps that
keep coming mean the run diverged, and skipping them only hides it. So the run may drop at
most `trainer.max_bad_steps` steps within any `trainer.bad_step_window` consecutive steps;
the next one stops it with exit code 3, as `on_nonfinite=stop` would have at the first.
"""

from __future__ import annotations

from collections import deque


class BadSteps:
    """The bad steps of this attempt; every rank records the same steps (the decision to
    skip is collective), so every rank reaches the limit at the same step."""

    def __init__(self, max_bad: int, window: int):
        self.max_bad = max_bad
        self.window = window
        self.skipped = 0  # over the attempt: metrics' `bad_steps/skipped`
        self._recent: deque[int] = deque()

    def record(self, step: int) -> bool:
        """Count bad step `step` (1-based); True when it is one too many for the window."""
        self._recent.append(step)
        while self._recent[0] <= step - self.window:
            self._recent.popleft()
        if len(self._recent) > self.max_bad:
            return True
        self.skipped += 1
        return False

    def in_window(self) -> int:
        """Bad steps within the window that ends at the latest one: `bad_steps/in_window`."""
        return len(self._recent)
