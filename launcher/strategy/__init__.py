"""The strategies (one module per engine) behind one interface (`base.Strategy`), and the
one place that picks the engine a run names; an engine's module, and so its package
(deepspeed), is imported only when chosen."""

from __future__ import annotations

import torch

from launcher.config.schema import StrategyConfig, TrainerConfig
from launcher.runtime.process import Runtime
from launcher.strategy.base import Strategy

__all__ = ["Strategy", "build_strategy", "needs_process_group"]

# Engines that run only inside a process group, even a group of one process.
_GROUP_ENGINES = ("deepspeed", "fsdp2")


def needs_process_group(name: str) -> bool:
    """Whether strategy `name` needs a process group when the run has one process."""
    return name in _GROUP_ENGINES


def build_strategy(
    s: StrategyConfig, t: TrainerConfig, rt: Runtime, model: torch.nn.Module
) -> Strategy:
    """The strategy named by `strategy.name`, set up around `model`."""
    if s.name == "ddp":
        from launcher.strategy.ddp import DDPStrategy

        return DDPStrategy(s, t, rt, model)
    if s.name == "deepspeed":  # imports deepspeed: only when chosen
        from launcher.strategy.deepspeed import DeepSpeedStrategy

        return DeepSpeedStrategy(s, t, rt, model)
    if s.name == "fsdp2":
        from launcher.strategy.fsdp2 import FSDP2Strategy

        return FSDP2Strategy(s, t, rt, model)
    raise ValueError(f"strategy.name={s.name}: unknown strategy; use ddp, deepspeed or fsdp2")
