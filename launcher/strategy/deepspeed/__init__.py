"""strategy=deepspeed (and its presets zero1-3): DeepSpeed's engine (`engine`), its config
keys and the DeepSpeed config built from them (`ds_config`), its quiet import (`ds_import`)
and its universal checkpoint conversion (`universal`). What the rest of the launcher knows of it
(launcher.config.registry): its config and rules, and its checkpoint format, DeepSpeed's
own ZeRO shards, which it resumes at its precision and (but for ZeRO-1 <-> ZeRO-2) stage, and
which DDP and FSDP2 load through the universal conversion; it loads no other engine's.
See docs/deepspeed.md."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from launcher.config.batch import BatchPlan
from launcher.config.errors import ConfigError
from launcher.config.model_shape import param_sizes
from launcher.config.registry import Capabilities, Engine, Format, MemoryCheckpoint, Plan, Resume
from launcher.config.saved_bytes import ENTRY_BYTES
from launcher.strategy.deepspeed.ds_config import (
    RECOVERY_SCRIPTS,
    STRATEGY_FILE,
    DeepSpeedConfig,
    DeepSpeedConfigError,
    build_ds_config,
)
from launcher.strategy.sharded_plan import unit_collectives

FORMAT = Format("deepspeed", marker=STRATEGY_FILE, reader="launcher.strategy.deepspeed.universal")


def rules(cfg, world_size: int) -> None:
    """The stage and offload (`strategy.extra` against trainer.* is judged where DeepSpeed's
    config is built: `config_check`); no torch.compile."""
    s, t = cfg.strategy, cfg.trainer
    if s.offload_optimizer != "none" and s.zero_stage == 0:
        raise ConfigError(
            "strategy.offload_optimizer=cpu needs ZeRO: set strategy.zero_stage to 1, 2 or 3"
        )
    if s.offload_param != "none" and s.zero_stage != 3:
        raise ConfigError(
            f"strategy.offload_param={s.offload_param} needs strategy.zero_stage=3 (only ZeRO-3 "
            f"partitions parameters; zero_stage is {s.zero_stage})"
        )
    if t.compile != "off":
        raise ConfigError(
            f"trainer.compile={t.compile} is not supported with strategy=deepspeed; "
            "use trainer.compile=off (or strategy=ddp to compile)"
        )


def config_check(typed_cfg, world_size: int) -> None:
    """DeepSpeed's config as these keys and `strategy.extra` build it."""
    try:
        build_ds_config(typed_cfg.strategy, typed_cfg.trainer, world_size)
    except DeepSpeedConfigError as exc:
        raise ConfigError(str(exc)) from exc


def identity(cfg) -> dict:
    """Its shards are laid out for the stage, and its loss scaling for the precision."""
    return {"zero_stage": int(cfg.strategy.zero_stage), "precision": cfg.trainer.precision}


def own_differences(saved: dict, now: dict) -> list[tuple[str, str]]:
    """Another world size, or ZeRO-1 <-> ZeRO-2: the universal conversion loads it. ZeRO-0
    has no shards to convert; DeepSpeed 0.19.8 loads no ZeRO-1/2 conversion into ZeRO-3 nor
    a ZeRO-3 one into ZeRO-1/2 (its loaders expect their own stage's files: tried,
    docs/strategies.md)."""
    found = []
    old_stage = saved.get("zero_stage", now["zero_stage"])
    if old_stage != now["zero_stage"] and not {old_stage, now["zero_stage"]} <= {1, 2}:
        found.append((
            f"strategy.zero_stage is {old_stage} there, {now['zero_stage']} now "
            "(DeepSpeed's universal checkpoint converts ZeRO-1 <-> ZeRO-2, and any "
            "stage 1-3 to another world size, not into or out of ZeRO-0 or ZeRO-3)",
            f"strategy.zero_stage={old_stage} (at any world size)",
        ))  # fmt: skip
    if "precision" in saved and saved["precision"] != now["precision"]:
        found.append((
            f"trainer.precision is {saved['precision']} there, {now['precision']} now",
            f"trainer.precision={saved['precision']}",
        ))  # fmt: skip
    return found


def memory_checkpoint_bytes(cfg, params: int, world_size: int) -> int:
    """What DeepSpeed saves for one rank: its partition of the fp32 weights and AdamW's two
    moments (4 + 8 bytes a parameter over the ranks; whole for fp32 ZeRO-0, whose optimizer
    is not partitioned), and, but under ZeRO-3, the whole module in trainer.precision."""
    stage, precision = int(cfg.strategy.zero_stage), cfg.trainer.precision
    if stage == 0 and precision == "fp32":
        return params * (4 + 8)
    module = 0 if stage == 3 else params * (4 if precision == "fp32" else 2)
    return module + -(-params * (4 + 8) // world_size)


# DeepSpeed's stage3_max_live_parameters: parameters it keeps gathered from forward to
# backward (a smaller model is gathered once a micro-step)
MAX_LIVE_PARAMETERS = 10**9


def max_live_parameters(strategy) -> int:
    """stage3_max_live_parameters as `strategy.extra` sets it, else DeepSpeed's default."""
    zero = (strategy.extra or {}).get("zero_optimization") or {}
    return int(zero.get("stage3_max_live_parameters", MAX_LIVE_PARAMETERS))


def checkpoint_writes(cfg, params: int, world_size: int) -> list[int]:
    """Bytes each rank writes, rank 0 first: every rank its partition of the fp32 weights
    and moments, rank 0 the module (but under ZeRO-3) in trainer.precision as well, and
    DeepSpeed's converters; fp32 ZeRO-0 keeps its optimizer whole in rank 0's files. A
    model-states file (every rank's under ZeRO-3, rank 0's otherwise) names each parameter
    twice, in the module and in its shapes: an entry apiece."""
    stage = int(cfg.strategy.zero_stage)
    names = (2 * len(param_sizes(cfg.model)) + 1) * ENTRY_BYTES
    first = memory_checkpoint_bytes(cfg, params, world_size) + recovery_scripts_bytes() + names
    if stage == 0 and cfg.trainer.precision == "fp32":
        return [first]
    share = -(-params * (4 + 8) // world_size) + (names if stage == 3 else 0)
    return [first] + [share] * (world_size - 1)


def recovery_scripts_bytes() -> int:
    """The converters this installation's DeepSpeed copies beside every checkpoint (found
    without importing it; 0 where it is not installed)."""
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or spec.origin is None:
        return 0
    utils = Path(spec.origin).parent / "utils"
    return sum((utils / s).stat().st_size for s in RECOVERY_SCRIPTS if (utils / s).is_file())


def train_state(cfg, params: int, world_size: int) -> dict[str, int]:
    """ZeRO-0: DDP's (fp32), or in bf16/fp16 the module in its precision and the fp32
    master weights and moments partitioned; ZeRO-1: the module and its gradients whole in
    trainer.precision, fp32 master weights and moments partitioned; ZeRO-2: the gradients
    partitioned too; ZeRO-3: everything partitioned."""
    stage, precision = int(cfg.strategy.zero_stage), cfg.trainer.precision
    low = 4 if precision == "fp32" else 2  # bytes of the module's own dtype
    share = -(-params // world_size)
    if stage == 0 and precision == "fp32":
        return {"weights": 4 * params, "grads": 4 * params, "optimizer": 8 * params}
    weights = low * (share if stage == 3 else params)
    grads = low * (share if stage >= 2 else params)
    master = 0 if precision == "fp32" else 4 * share
    return {"weights": weights + master, "grads": grads, "optimizer": 8 * share}


def host_state(cfg, params: int, world_size: int) -> int:
    """ZeRO-Offload: with the optimizer on the CPU, the rank's partition of the fp32 master
    weights, their gradients and AdamW's two moments (16 bytes a parameter); with ZeRO-3's
    parameters on the CPU too, its partition of the module in trainer.precision."""
    s = cfg.strategy
    share = -(-params // world_size)
    optimizer = 16 * share if s.offload_optimizer == "cpu" else 0
    low = 4 if cfg.trainer.precision == "fp32" else 2
    return optimizer + (low * share if s.offload_param == "cpu" else 0)


def step_collectives(cfg, params: int, world_size: int) -> list[tuple[str, int, int]]:
    """In trainer.precision, as the collective timer counts them (comm_collectives.json):
    the gradients reduced in buckets of strategy.reduce_bucket_size elements, all-reduced
    once a step by ZeRO-0 and ZeRO-1, on every micro-step by ZeRO-2 (its gradients are
    partitioned, so it cannot hold them until the last), reduce-scattered on every
    micro-step by ZeRO-3; ZeRO-1/2 all-gather the updated weights once a step, ZeRO-3 each
    module's weights for every micro-step's forward (launcher.strategy.sharded_plan, as FSDP2
    gathers its units), and again for its backward when the model holds more parameters
    than DeepSpeed keeps gathered between the two (`max_live_parameters`)."""
    s, t = cfg.strategy, cfg.trainer
    stage, width = int(s.zero_stage), 4 if t.precision == "fp32" else 2
    accum = BatchPlan.of(t, world_size).accum
    bucket = int(s.reduce_bucket_size)
    op = "reduce_scatter" if stage == 3 else "all_reduce"
    reduces = accum if stage >= 2 else 1
    rows = [(op, min(bucket, params - start) * width, reduces)
            for start in range(0, params, bucket)]  # fmt: skip
    if stage == 3:
        passes = accum * (1 if params <= max_live_parameters(s) else 2)
        return unit_collectives(cfg.model, "all_gather", width, passes, passes, True) + rows
    return rows + ([("all_gather", params * width, 1)] if stage else [])


def resume_with(saved: dict) -> str:
    if "zero_stage" in saved:
        return f"strategy=deepspeed strategy.zero_stage={saved['zero_stage']}"
    return "strategy=deepspeed"


def unreadable_by_others(saved: dict) -> str | None:
    if saved.get("zero_stage") == 0:
        return (
            "a ZeRO-0 checkpoint has no shards for DeepSpeed's universal conversion; "
            "the fp32 weights alone: zero_to_fp32.py in the checkpoint folder"
        )
    return None


def device_problem(cfg, on_cpu: bool) -> str | None:
    """fp16 on a CPU whose oneDNN lacks it: DeepSpeed's own check, made before it starts."""
    if cfg.trainer.precision != "fp16" or not on_cpu or cpu_has_fp16():
        return None
    return (
        "trainer.precision=fp16 with strategy=deepspeed needs a GPU or a CPU with "
        "AVX-512 FP16 (DeepSpeed refuses fp16 on this CPU); use trainer.precision="
        "bf16 or fp32"
    )


def cpu_has_fp16() -> bool:
    """Whether this CPU's oneDNN has fp16: DeepSpeed's own check."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except (AttributeError, RuntimeError):
        return False


ENGINE = Engine(
    name="deepspeed",
    schema=DeepSpeedConfig,
    strategy="launcher.strategy.deepspeed.engine:DeepSpeedStrategy",
    format=FORMAT,
    capabilities=Capabilities(
        needs_process_group=True,
        rules=rules,
        config_check=config_check,
        packages=(("deepspeed", "pip install 'launcher[deepspeed]'"),),
        device_problem=device_problem,
        compiles=False,
    ),
    resume=Resume(
        refuses_other_formats="DeepSpeed loads no other engine's checkpoint",
        identity=identity,
        own_differences=own_differences,
        resume_with=resume_with,
        unreadable_by_others=unreadable_by_others,
    ),
    plan=Plan(
        train_state=train_state,
        checkpoint_writes=checkpoint_writes,
        step_collectives=step_collectives,
        host_state=host_state,
        # a gpt2-tiny rank's peak, ZeRO-2 less DDP (benchmarks/host_memory.py)
        host_process_bytes=70 * 10**6,
    ),
    memory_checkpoint=MemoryCheckpoint(size=memory_checkpoint_bytes),
)
