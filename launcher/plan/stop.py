"""A stop's budget, one arithmetic for the plan's table, the submit renderers' refusals and
rehearse's cluster case.

A stop (Kubernetes' SIGTERM before the grace period's SIGKILL, Slurm's warning signal before
the time limit) lands mid-step: the ranks finish the step, write the stop checkpoint and
exit, and the scheduler's launcher may need some of the window after them (torchrun's own
end in a pod). A backend declares which of its keys is that window (`stop_window`) and
what it keeps of it (`stop_margin_s`); a backend without a window has no budget.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.config.backends import Backend, backends


@dataclass(frozen=True)
class StopBudget:
    key: str  # the window's key, cluster.<name>.<stop_window>
    window_s: int
    step_s: float  # the step in flight
    write_s: float  # the stop checkpoint's write
    margin_s: int  # the scheduler's launcher's own end, after the ranks

    @property
    def need_s(self) -> float:
        return self.step_s + self.write_s + self.margin_s

    @property
    def fits(self) -> bool:
        return self.need_s <= self.window_s


def budget(cfg, backend: Backend, write_s: float, step_s: float | None) -> StopBudget | None:
    """`backend`'s stop window against what a stop of `cfg` needs; None without one."""
    section = getattr(cfg.cluster, backend.name, None)
    if not backend.stop_window or section is None:
        return None
    window = int(getattr(section, backend.stop_window))
    key = f"cluster.{backend.name}.{backend.stop_window}"
    return StopBudget(key, window, float(step_s or 0.0), write_s, backend.stop_margin_s)


def budgets(cfg, write_s: float, step_s: float | None) -> dict[str, dict]:
    """Every backend's budget, by name, as plan.json keeps it."""
    out = {}
    for name, declared in backends().items():
        found = budget(cfg, declared, write_s, step_s)
        if found:
            out[name] = {"key": found.key, "window_s": found.window_s,
                         "need_s": found.need_s, "fits": found.fits}  # fmt: skip
    return out
