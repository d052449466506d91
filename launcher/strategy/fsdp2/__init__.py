"""strategy=fsdp2: torch's `fully_shard` per GPT-2 block, then the root (`engine`). What the
rest of the launcher knows of it (launcher.config.registry): its config and rules, and its
checkpoint format, torch Distributed Checkpoint folders (`dcp`) that every rank writes its
shard into and that any world size, or DDP, loads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from launcher.config.errors import ConfigError
from launcher.config.ranges import one_of
from launcher.config.registry import (
    Capabilities,
    Engine,
    Format,
    MemoryCheckpoint,
    Plan,
    StrategyConfig,
)

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
    """One rank's shards: its 1/world_size of the fp32 weights and AdamW's two moments
    (4 + 8 bytes a parameter; the parameters stay fp32 whatever trainer.precision). The
    state dict names the tied embedding twice (the LM head's name too), and DCP and the
    memory tier write it under both."""
    return -(-(params + tied_embedding(cfg.model, params)) * (4 + 8) // world_size)


def checkpoint_total(cfg, params: int, world_size: int) -> int:
    """Every rank's shards: the whole state, the tied embedding under both its names."""
    return memory_checkpoint_bytes(cfg, params, world_size) * world_size


def tied_embedding(model, params: int) -> int:
    """Parameters of GPT-2's token embedding (the LM head's too): what the blocks, the
    position embeddings and the final LayerNorm leave of the model's parameters."""
    d, layers = int(model.n_embd), int(model.n_layer)
    return params - layers * (12 * d * d + 13 * d) - 2 * d - int(model.n_positions) * d


def train_state(cfg, params: int, world_size: int) -> dict[str, int]:
    """Each rank's shards of the fp32 weights, gradients and AdamW's moments, and the
    gathered weights of two blocks at a time in trainer.precision (the one computing and
    the one prefetched)."""
    block = 12 * int(cfg.model.n_embd) ** 2
    gathered = 2 * block * (4 if cfg.trainer.precision == "fp32" else 2)
    shard = -(-params // world_size)
    return {"weights": 4 * shard, "grads": 4 * shard, "optimizer": 8 * shard,
            "gathered": gathered}  # fmt: skip


def host_state(cfg, params: int, world_size: int) -> int:
    """strategy.offload=cpu: the rank's shards of the fp32 weights, gradients and AdamW's
    moments live on the host (the optimizer steps there): 16 bytes a parameter of its share."""
    return 16 * -(-params // world_size) if cfg.strategy.offload == "cpu" else 0


def step_collectives(cfg, params: int, world_size: int) -> list[tuple[str, int, int]]:
    """Per block and the root: the weights all-gathered in trainer.precision for each
    micro-step's forward, again for its backward when resharded after forward, and the
    gradients reduce-scattered in strategy.reduce_dtype once a step (gradient sync only on
    the last micro-step)."""
    t, s = cfg.trainer, cfg.strategy
    units = int(cfg.model.n_layer) + 1
    weights = params * (4 if t.precision == "fp32" else 2)
    micro = max(1, int(t.global_batch_size) // (int(t.micro_batch_size) * world_size))
    gathers = micro * (2 if s.reshard_after_forward is not False else 1)
    grads = params * (4 if s.reduce_dtype == "fp32" else 2)
    return [
        ("all_gather", weights // units, gathers * units),
        ("reduce_scatter", grads // units, units),
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
        checkpoint_total=checkpoint_total,
        step_collectives=step_collectives,
        host_state=host_state,
    ),
    memory_checkpoint=MemoryCheckpoint(size=memory_checkpoint_bytes),
)
