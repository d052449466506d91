"""strategy=fsdp2: torch's `fully_shard` per GPT-2 block, then the root (`engine`). What the
rest of the launcher knows of it (launcher.config.registry): its config and rules, and its
checkpoint format, torch Distributed Checkpoint folders (`dcp`) that every rank writes its
shard into and that any world size, or DDP, loads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from launcher.config.batch import BatchPlan
from launcher.config.errors import ConfigError
from launcher.config.model_shape import param_sizes, unit_sizes
from launcher.config.ranges import one_of
from launcher.config.registry import (
    Capabilities,
    Engine,
    Format,
    MemoryCheckpoint,
    Plan,
    StrategyConfig,
)
from launcher.config.saved_bytes import (
    DCP_CHUNK_BYTES,
    DCP_KEY_BYTES,
    ENTRY_BYTES,
    RECORD_BYTES,
)
from launcher.strategy.sharded_plan import unit_collectives

OFFLOAD_DEVICES = ("none", "cpu")


@dataclass
class FSDP2Config(StrategyConfig):
    """strategy=fsdp2; see docs/strategies.md."""

    name: str = "fsdp2"
    # true: free each block's gathered parameters after its forward (gather again in backward:
    # least memory); false: keep them until backward (no second all-gather); an int N: keep a
    # copy sharded over N ranks (a divisor of the world size, neither 1 nor the world size).
    reshard_after_forward: Any = True
    # fp32 (exact) | bf16 (half the bytes): the dtype gradients are reduce-scattered in; the
    # parameters' is trainer.precision (bf16: gathered and computed in bf16, kept in fp32).
    reduce_dtype: str = one_of("fp32", ("fp32", "bf16"))
    # cpu: sharded parameters, gradients and the optimizer step on the CPU
    offload: str = one_of("none", OFFLOAD_DEVICES)


FORMAT = Format("dcp", marker=".metadata", reader="launcher.strategy.fsdp2.dcp")


def memory_checkpoint_bytes(cfg, params: int, world_size: int) -> int:
    """One rank's shards as the memory tier writes them (one torch.save of the state, the
    tied embedding once, as `host_copy` keeps it): its 1/world_size of the fp32 weights and
    AdamW's two moments, 4 + 8 bytes a parameter (fp32 whatever trainer.precision), and
    each tensor's entry (weights, two moments, step)."""
    tensors = len(param_sizes(cfg.model))
    return -(-params * (4 + 8) // world_size) + 4 * tensors * ENTRY_BYTES


def checkpoint_writes(cfg, params: int, world_size: int) -> list[int]:
    """Bytes each rank writes into a DCP checkpoint, rank 0 first: its shard of the fp32
    weights, under both names of the tied embedding (the model's state dict names the LM
    head too), and of AdamW's two moments (the optimizer keys the parameter once), each
    shard a record of its own; one rank the step counts and the two parameter groups'
    settings, rank 0 `.metadata` as well (an entry per stored chunk)."""
    tensors = len(param_sizes(cfg.model))
    tied = unit_sizes(cfg.model)[0][0]
    items = 3 * tensors + 1
    shard = -(-(4 * (params + tied) + 8 * params) // world_size) + items * RECORD_BYTES
    ranks = [shard] * world_size
    ranks[-1] += tensors * (4 + RECORD_BYTES) + PARAM_GROUP_ITEMS * RECORD_BYTES
    keys = items + tensors + PARAM_GROUP_ITEMS
    chunks = world_size * items + tensors + PARAM_GROUP_ITEMS
    ranks[0] += keys * DCP_KEY_BYTES + chunks * DCP_CHUNK_BYTES
    return ranks


# AdamW's two parameter groups (decayed and not) of 12 settings each: one DCP item apiece.
PARAM_GROUP_ITEMS = 24


def train_state(cfg, params: int, world_size: int) -> dict[str, int]:
    """Each rank's shards of the fp32 weights, gradients and AdamW's moments, and the
    gathered weights of two blocks at a time in trainer.precision (the one computing and
    the one prefetched)."""
    block = sum(unit_sizes(cfg.model)[1])
    gathered = 2 * block * (4 if cfg.trainer.precision == "fp32" else 2)
    shard = -(-params // world_size)
    return {"weights": 4 * shard, "grads": 4 * shard, "optimizer": 8 * shard,
            "gathered": gathered}  # fmt: skip


def host_state(cfg, params: int, world_size: int) -> int:
    """strategy.offload=cpu: the rank's shards of the fp32 weights, gradients and AdamW's
    moments live on the host (the optimizer steps there): 16 bytes a parameter of its share."""
    return 16 * -(-params // world_size) if cfg.strategy.offload == "cpu" else 0


def step_collectives(cfg, params: int, world_size: int) -> list[tuple[str, int, int]]:
    """Per unit (launcher.strategy.sharded_plan): the weights all-gathered in
    trainer.precision for each micro-step's forward, the blocks' again for its backward
    when resharded after forward (the root stays gathered: backward starts with it), and the
    gradients reduce-scattered in strategy.reduce_dtype once a step (on the last micro-step
    only). The counts the collective timer reports (comm_collectives.json)."""
    t, s = cfg.trainer, cfg.strategy
    accum = BatchPlan.of(t, world_size).accum
    again = 1 if s.reshard_after_forward is not False else 0
    weights = 4 if t.precision == "fp32" else 2
    grads = 4 if s.reduce_dtype == "fp32" else 2
    return [
        *unit_collectives(cfg.model, "all_gather", weights, accum, accum * (1 + again)),
        *unit_collectives(cfg.model, "reduce_scatter", grads, 1, 1),
    ]


def rules(cfg, world_size: int) -> None:
    """reshard_after_forward's three forms, dtypes, offload; no fp16 (no sharded scaler)."""
    s = cfg.strategy
    raf = s.reshard_after_forward
    if not isinstance(raf, bool):
        divides = isinstance(raf, int) and 1 < raf < world_size and world_size % raf == 0
        if not divides:
            raise ConfigError(
                f"strategy.reshard_after_forward={raf}: give true, false, or a number of ranks "
                f"to reshard to that divides the world size {world_size} (neither 1 nor "
                f"{world_size} itself)"
            )
    if cfg.trainer.precision == "fp16":
        raise ConfigError(
            "trainer.precision=fp16 is not supported with strategy=fsdp2 (it would need a "
            "sharded loss scaler); use trainer.precision=bf16 or fp32"
        )


ENGINE = Engine(
    name="fsdp2",
    schema=FSDP2Config,
    strategy="launcher.strategy.fsdp2.engine:FSDP2Strategy",
    format=FORMAT,
    capabilities=Capabilities(
        needs_process_group=True, rules=rules, async_checkpoint=True, drops_steps=True
    ),
    plan=Plan(
        train_state=train_state,
        checkpoint_writes=checkpoint_writes,
        step_collectives=step_collectives,
        host_state=host_state,
    ),
    memory_checkpoint=MemoryCheckpoint(size=memory_checkpoint_bytes),
)
