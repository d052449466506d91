"""Memory, predicted from the config's shape: per rank on the device (the training state by
its engine, activations, the allocator's headroom), and per node in /dev/shm (host memory
besides: launcher.plan.host).

The /dev/shm figure (`shm_need`) is the one every part of the launcher sizes with: the
preflight and the doctor check it against the machine, the job records it in env.json, and
the Slurm and Kubernetes renderers request it (docs/plan.md, "One arithmetic").
"""

from __future__ import annotations

from launcher.checkpoint import memory as tier
from launcher.config.batch import AUTO
from launcher.config.model_shape import GPT2_VOCAB, padded_vocab_size, param_count
from launcher.config.registry import engine
from launcher.data.shm import loader_shm_need

HEADROOM = 0.10  # of the device's total: the caching allocator's fragmentation (assumed)
CONTEXT_BYTES = 1 * 10**9  # CUDA context, cuBLAS/NCCL workspaces, per rank (assumed)
ACTIVATION_BYTES_PER_LAYER = 34  # x seq x batch x width, 16-bit (Korthikanti et al. 2022)


def micro_batch(cfg, world_size: int) -> int:
    """The micro-batch the config runs (auto: at most the per-rank batch)."""
    micro = cfg.trainer.micro_batch_size
    if micro == AUTO:
        return max(1, int(cfg.trainer.global_batch_size) // world_size)
    return int(micro)


def shm_need(
    cfg, ranks_per_node: int, world_size: int | None = None, restarts: int | None = None
) -> int:
    """Bytes of /dev/shm one node of `ranks_per_node` ranks needs: their DataLoader workers'
    batches, and the memory tier's two checkpoints (launcher.checkpoint.memory: the state
    every rank holds alike once per node, a sharded engine's shards once per rank of
    `world_size`; `restarts`: torchrun's --max-restarts the job will run with, else this
    process's)."""
    loaders = loader_shm_need(cfg) * ranks_per_node
    return loaders + tier.shm_bytes(cfg, ranks_per_node, world_size, restarts)


def train_state(cfg, world_size: int) -> dict[str, int]:
    """Bytes per rank of weights, gradients and optimizer state, as the engine holds them at
    `world_size` (its declaration in launcher.strategy.<engine>)."""
    plan = engine(cfg.strategy.name).plan
    if plan is None:
        raise ValueError(f"strategy={cfg.strategy.name} declares no plan")
    return plan.train_state(cfg, param_count(cfg.model), world_size)


def activation_bytes(cfg, micro: int, checkpointing: bool | None = None) -> int:
    """Activations one micro-batch keeps for its backward: per layer 34 x seq x micro x
    width bytes in 16-bit (twice in fp32) with a fused attention (no seq^2 term), or with
    gradient checkpointing only each block's input plus one block recomputed; and the
    logits in fp32 with their gradient."""
    m, t = cfg.model, cfg.trainer
    d, layers, seq = int(m.n_embd), int(m.n_layer), int(t.seq_len)
    vocab = padded_vocab_size(int(m.vocab_size or GPT2_VOCAB), int(m.vocab_multiple))
    scale = 2 if t.precision == "fp32" else 1
    one_layer = ACTIVATION_BYTES_PER_LAYER * seq * micro * d * scale
    on = t.grad_checkpointing if checkpointing is None else checkpointing
    blocks = layers * 4 * seq * micro * d + one_layer if on else layers * one_layer
    logits = 2 * 4 * seq * micro * vocab
    return blocks + logits


def device_per_rank(cfg, world_size: int, on_gpu: bool) -> dict[str, int]:
    """Device memory one rank needs: the training state, activations at the configured
    micro-batch (and the other gradient checkpointing setting beside it), and the
    allocator's headroom on top (GPU only)."""
    state = {"gathered": 0, **train_state(cfg, world_size)}
    micro = micro_batch(cfg, world_size)
    acts = activation_bytes(cfg, micro)
    other = activation_bytes(cfg, micro, not cfg.trainer.grad_checkpointing)
    used = sum(state.values()) + acts
    headroom = int(used * HEADROOM) + CONTEXT_BYTES if on_gpu else 0
    return {
        **state,
        "activations": acts,
        "activations_if_grad_checkpointing_flipped": other,
        "headroom": headroom,
        "total": used + headroom,
    }
