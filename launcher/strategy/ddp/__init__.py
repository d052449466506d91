"""strategy=ddp: PyTorch DistributedDataParallel (`engine`), its gradient compression hooks
(`comm_hooks`, `powersgd`) and their timing (`comm_timing`). This module is what the rest
of the launcher knows of the engine (launcher.config.registry): its config and rules, and
its checkpoint format, `model.pt` + `optimizer.pt` written by rank 0 (every rank holds the
whole model), which it and FSDP2 load at any world size."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.config.errors import ConfigError
from launcher.config.model_shape import param_sizes
from launcher.config.ranges import Range, one_of, ranged
from launcher.config.registry import (
    Capabilities,
    Engine,
    Format,
    MemoryCheckpoint,
    Plan,
    StrategyConfig,
    Tuning,
)
from launcher.config.saved_bytes import ENTRY_BYTES
from launcher.strategy.ddp.files import FILES

COMM_HOOKS = ("none", "fp16", "bf16", "powersgd")
DEFAULT_BUCKET_MB = 25.0


@dataclass
class DDPConfig(StrategyConfig):
    name: str = "ddp"
    bucket_cap_mb: float = ranged(
        DEFAULT_BUCKET_MB, Range(low=0.0, low_open=True, why="DDP's bucket size in MB")
    )
    gradient_as_bucket_view: bool = True
    static_graph: bool = False
    find_unused_parameters: bool = False
    broadcast_buffers: bool = True
    # none, bf16, fp16, powersgd (docs/communication.md)
    comm_hook: str = one_of("none", COMM_HOOKS)
    # PowerSGD (comm_hook=powersgd): all-reduce a rank-r approximation of every large
    # gradient matrix instead of the matrix.
    # r: bytes grow with it; 1-4 is typical, 4 leans to accuracy
    powersgd_rank: int = ranged(
        4, Range(low=1, why="the rank of each gradient matrix's approximation; 1-4 is usual")
    )
    # plain all-reduce first; null: trainer.warmup_steps
    powersgd_warmup_steps: int | None = ranged(
        None, Range(low=0, why="steps of plain all-reduce before PowerSGD starts")
    )
    # compress a matrix if P, Q are this much smaller
    powersgd_min_compression_rate: float = ranged(
        2.0,
        Range(
            low=1.0, why="a matrix is compressed only if its factors are this many times smaller"
        ),
    )


FORMAT = Format("torch", marker=FILES[0], reader="launcher.strategy.ddp.files")


def memory_checkpoint_bytes(cfg, params: int, world_size: int) -> int:
    """The whole model, which every rank holds alike (a node's ranks write it once between
    them): fp32 weights and AdamW's two moments, 4 + 8 bytes a parameter."""
    return params * (4 + 8)


def checkpoint_writes(cfg, params: int, world_size: int) -> list[int]:
    """Rank 0 alone writes a durable checkpoint, model.pt and optimizer.pt: the whole
    state, the step counts, and each tensor's entry in torch.save's files (the tied
    embedding's weight once, under both its names)."""
    tensors = len(param_sizes(cfg.model))
    return [params * (4 + 8) + 4 * tensors + (4 * tensors + 1) * ENTRY_BYTES]


def train_state(cfg, params: int, world_size: int) -> dict[str, int]:
    """Every rank holds it all: fp32 weights, fp32 gradients (in DDP's buckets, a second
    copy unless strategy.gradient_as_bucket_view), AdamW's two moments."""
    grads = 4 * params * (1 if cfg.strategy.gradient_as_bucket_view else 2)
    return {"weights": 4 * params, "grads": grads, "optimizer": 8 * params}


def step_collectives(cfg, params: int, world_size: int) -> list[tuple[str, int, int]]:
    """One all-reduce per bucket a step, whatever the accumulation (no_sync until the last
    micro-step), or PowerSGD's factors (launcher.strategy.ddp.powersgd). DDP cuts its
    buckets from the fp32 gradients, whole tensors, the last registered first, closing one
    once it holds strategy.bucket_cap_mb (MiB); the fp16/bf16 hooks then all-reduce each
    bucket in half the bytes (as many buckets as without them)."""
    s = cfg.strategy
    if s.comm_hook == "powersgd":
        return [("all_reduce", powersgd_bytes(cfg.model, params, int(s.powersgd_rank)) // 2, 2)]
    cut = 2 if s.comm_hook in ("fp16", "bf16") else 1
    return [("all_reduce", size // cut, 1) for size in bucket_bytes(cfg)]


def bucket_bytes(cfg) -> list[int]:
    """The fp32 bytes of each of DDP's buckets, in the order they are all-reduced."""
    cap = float(cfg.strategy.bucket_cap_mb) * 2**20
    buckets, filling = [], 0
    for size in reversed(param_sizes(cfg.model)):
        filling += size * 4
        if filling >= cap:
            buckets.append(filling)
            filling = 0
    return buckets + ([filling] if filling else [])


def powersgd_bytes(model, params: int, rank: int) -> int:
    """fp32 bytes PowerSGD all-reduces in each of its two rounds for GPT-2's shape: rank-r
    factors P (m x r) and Q (n x r) of every weight matrix (the embeddings counted as one
    matrix of their rows), the vectors whole."""
    d, layers = int(model.n_embd), int(model.n_layer)
    vectors = layers * 13 * d + 2 * d
    rows = (params - 12 * d * d * layers - vectors) // d  # vocabulary and positions
    matrices = [(d, 3 * d), (d, d), (d, 4 * d), (4 * d, d)] * layers + [(rows, d)]
    return 4 * (sum(rank * (m + n) for m, n in matrices) + vectors)


def rules(cfg, world_size: int) -> None:
    """The compression hook, what PowerSGD cannot do, and a static graph's fixed shape."""
    s = cfg.strategy
    t = cfg.trainer
    if s.static_graph and (t.micro_batch_size == "auto" or t.on_oom == "retry"):
        raise ConfigError(
            "strategy.static_graph=true cannot change its micro-batch in-process "
            f"(trainer.micro_batch_size={t.micro_batch_size}, trainer.on_oom={t.on_oom}): its "
            "first backward records the graph and must synchronise; set "
            "strategy.static_graph=false, or a number and trainer.on_oom=stop"
        )
    if s.comm_hook == "powersgd" and cfg.trainer.precision == "fp16":
        raise ConfigError(
            "strategy.comm_hook=powersgd does not work with trainer.precision=fp16: its error "
            "feedback would keep loss-scaled (and overflowed) gradients; use bf16 or fp32"
        )


def tune_candidates(cfg) -> list[tuple[dict, bool]]:
    """Against exposed communication (besides the bucket size, which the plan's model
    sizes: `bucket_key`): the two flags that save copies and re-planning, and bf16
    compression of the gradients (which changes the math)."""
    s = cfg.strategy
    out = []
    if not s.gradient_as_bucket_view:
        out.append(({"strategy.gradient_as_bucket_view": True}, False))
    if not s.static_graph:
        out.append(({"strategy.static_graph": True}, False))
    if s.comm_hook == "none" and cfg.trainer.precision != "fp16":
        out.append(({"strategy.comm_hook": "bf16"}, True))
    return out


ENGINE = Engine(
    name="ddp",
    schema=DDPConfig,
    strategy="launcher.strategy.ddp.engine:DDPStrategy",
    format=FORMAT,
    capabilities=Capabilities(rules=rules, drops_steps=True, resizes_micro_batch=True),
    plan=Plan(
        train_state=train_state,
        checkpoint_writes=checkpoint_writes,  # rank 0 writes the whole state
        step_collectives=step_collectives,
    ),
    tuning=Tuning(candidates=tune_candidates, bucket_key="strategy.bucket_cap_mb"),
    memory_checkpoint=MemoryCheckpoint(size=memory_checkpoint_bytes, replicated=True),
)
