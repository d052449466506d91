"""The DeepSpeed config of a run, built from the Hydra keys (no DeepSpeed import here).

DeepSpeed reads one JSON-like dict. The launcher derives it from the same keys a DDP run
uses (`trainer.*` for batch, accumulation, clipping and precision; `strategy.*` for the
ZeRO stage and offload), then merges `strategy.extra` over it so that any other DeepSpeed
setting can be passed through. A setting in `extra` that contradicts a launcher key is
refused here, with one line naming both, before any process starts: the config validation
(`launcher.config`) and the strategy call the same function.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from launcher.config.batch import BatchPlan
from launcher.config.ranges import Range, one_of, ranged
from launcher.config.registry import StrategyConfig
from launcher.config.schema import TrainerConfig

OFFLOAD_DEVICES = ("none", "cpu")
STRATEGY_FILE = "strategy.json"  # in each DeepSpeed checkpoint: what wrote it (its marker)
# DeepSpeed's offline converters, copied into each checkpoint (launcher.strategy.deepspeed.engine)
RECOVERY_SCRIPTS = ("zero_to_fp32.py", "zero_to_torch.py")

# Sections DeepSpeed would build its own optimizer or LR schedule from: the launcher passes
# its AdamW (trainer.lr, betas, weight_decay) and sets the LR of every step itself.
REFUSED_SECTIONS = {
    "optimizer": "the optimizer is AdamW from trainer.lr/beta1/beta2/weight_decay",
    "scheduler": "the LR schedule is trainer.warmup_steps/lr_decay_steps/min_lr_ratio",
    "amp": "NVIDIA apex AMP is not supported; use trainer.precision=bf16 or fp16",
}


@dataclass
class DeepSpeedConfig(StrategyConfig):
    """strategy=deepspeed (and its presets zero1-3); see docs/deepspeed.md."""

    name: str = "deepspeed"
    # 0: data parallel (replicated states), 1: optimizer states sharded, 2: + gradients,
    # 3: + parameters (gathered layer by layer in forward and backward).
    zero_stage: int = ranged(2, Range(low=0, high=3))
    # cpu: optimizer states and the optimizer step on the CPU (ZeRO 1-3)
    offload_optimizer: str = one_of("none", OFFLOAD_DEVICES)
    offload_param: str = one_of("none", OFFLOAD_DEVICES)  # cpu: ZeRO-3 parameters on the CPU
    overlap_comm: bool | None = None  # null: DeepSpeed's default for the stage
    # elements per gradient reduction bucket
    reduce_bucket_size: int = ranged(500_000_000, Range(low=1, why="elements"))
    # elements per parameter all-gather (ZeRO-1/2)
    allgather_bucket_size: int = ranged(500_000_000, Range(low=1, why="elements"))
    # Any other DeepSpeed config key, passed through, e.g.
    # +strategy.extra.zero_optimization.contiguous_gradients=false. Keys the launcher owns
    # (batch, accumulation, clipping, precision, stage, offload) must agree with it; optimizer
    # and scheduler sections are refused.
    extra: dict[str, Any] = field(default_factory=dict)


class DeepSpeedConfigError(ValueError):
    """A contradiction between `strategy.extra` and the launcher's keys (one line)."""


def derived_config(s: DeepSpeedConfig, t: TrainerConfig, world_size: int) -> dict[str, Any]:
    """What the launcher's own keys say, before `strategy.extra` is merged in."""
    zero: dict[str, Any] = {
        "stage": int(s.zero_stage),
        "reduce_bucket_size": int(s.reduce_bucket_size),
        "allgather_bucket_size": int(s.allgather_bucket_size),
    }
    if s.overlap_comm is not None:
        zero["overlap_comm"] = bool(s.overlap_comm)
    if s.offload_optimizer != "none":
        zero["offload_optimizer"] = {"device": s.offload_optimizer}
    if s.offload_param != "none":
        zero["offload_param"] = {"device": s.offload_param}
    batch = BatchPlan.of(t, world_size)
    return {
        "train_batch_size": batch.global_batch,
        "train_micro_batch_size_per_gpu": batch.micro_batch,
        "gradient_accumulation_steps": batch.accum,
        "gradient_clipping": float(t.grad_clip),
        "bf16": {"enabled": t.precision == "bf16"},
        "fp16": {"enabled": t.precision == "fp16"},
        "zero_optimization": zero,
        # The client optimizer is torch's AdamW: allowed under ZeRO, and kept with CPU
        # offload (DeepSpeed would otherwise insist on its compiled DeepSpeedCPUAdam).
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 2**31 - 1,  # the launcher prints progress
        "wall_clock_breakdown": False,
    }


# (path in the DeepSpeed config, the launcher key that decides it)
OWNED = (
    (("train_batch_size",), "trainer.global_batch_size"),
    (("train_micro_batch_size_per_gpu",), "trainer.micro_batch_size"),
    (("gradient_accumulation_steps",), "trainer.global_batch_size / (micro_batch_size x ranks)"),
    (("gradient_clipping",), "trainer.grad_clip"),
    (("zero_optimization", "stage"), "strategy.zero_stage"),
    (("zero_optimization", "offload_optimizer", "device"), "strategy.offload_optimizer"),
    (("zero_optimization", "offload_param", "device"), "strategy.offload_param"),
)


def _get(tree: dict, path: tuple[str, ...]):
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            return None
        tree = tree[key]
    return tree


def _merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _enabled(section) -> bool:
    return isinstance(section, dict) and bool(section.get("enabled", False))


def build_ds_config(s: DeepSpeedConfig, t: TrainerConfig, world_size: int) -> dict[str, Any]:
    """The DeepSpeed config this run uses; raises DeepSpeedConfigError on a contradiction."""
    extra = s.extra or {}
    for section, why in REFUSED_SECTIONS.items():
        if section in extra:
            raise DeepSpeedConfigError(
                f"strategy.extra.{section} is not accepted: {why}; remove it"
            )
    base = derived_config(s, t, world_size)
    for path, owner in OWNED:
        given, derived = _get(extra, path), _get(base, path)
        if given is None:
            continue
        stage_off = path[-1] == "device" and derived is None and given in ("none", None)
        if given != derived and not stage_off:
            raise DeepSpeedConfigError(
                f"strategy.extra.{'.'.join(path)}={given} contradicts {owner} "
                f"(which gives {derived if derived is not None else 'none'}); set it through "
                f"the launcher key, not strategy.extra"
            )
    merged = _merge(base, extra)
    if "bfloat16" in merged:  # DeepSpeed's other name for the bf16 section
        merged["bf16"] = _merge(merged["bf16"], merged.pop("bfloat16"))
    fp16, bf16 = _enabled(merged.get("fp16")), _enabled(merged.get("bf16"))
    if fp16 and bf16:
        raise DeepSpeedConfigError(
            "fp16 and bf16 are both enabled (strategy.extra turns one on while "
            f"trainer.precision={t.precision}); choose one with trainer.precision"
        )
    wanted = t.precision
    got = "fp16" if fp16 else "bf16" if bf16 else "fp32"
    if got != wanted:
        raise DeepSpeedConfigError(
            f"strategy.extra turns {got} {'on' if got != 'fp32' else 'off'} but "
            f"trainer.precision={wanted}; choose the precision with trainer.precision"
        )
    return merged
