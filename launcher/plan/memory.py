"""Memory, predicted from the config's shape: per rank on the device (the training state by
its engine, activations, the allocator's headroom), and per node in /dev/shm (host memory
besides: launcher.plan.host).

The /dev/shm figure (`shm_need`) is the one every part of the launcher sizes with: the
preflight and the doctor check it against the machine, the job records it in env.json, and
the Slurm and Kubernetes renderers request it (docs/plan.md, "One arithmetic").
"""

from __future__ import annotations

from launcher.checkpoint import memory as tier
from launcher.config.batch import BatchPlan
from launcher.config.model_shape import GPT2_VOCAB, padded_vocab_size, param_count
from launcher.config.registry import engine
from launcher.data.shm import loader_shm_need

HEADROOM = 0.10  # of the device's total: the caching allocator's fragmentation (assumed)
CONTEXT_BYTES = 1 * 10**9  # CUDA context, cuBLAS/NCCL workspaces, per rank (assumed)
ACTIVATION_BYTES_PER_LAYER = 34  # x seq x batch x width, 16-bit (Korthikanti et al. 2022)
COMPILED_BYTES_PER_LAYER = 24  # the same under trainer.compile (activation_bytes)


def micro_batch(cfg, world_size: int) -> int:
    """The micro-batch the config runs (BatchPlan's: auto starts at the per-rank batch)."""
    return BatchPlan.of(cfg.trainer, world_size).micro_batch


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
    """Activations one micro-batch keeps for its backward (s the sequence, b the micro-batch,
    d the width, V the padded vocabulary, p the bytes of trainer.precision's dtype):

    - each layer 34·s·b·d bytes in 16-bit, twice in fp32 (Korthikanti et al. 2022, with a
      fused attention: no s² term); compiled (trainer.compile), 24·s·b·d: the fused
      backward recomputes the elementwise intermediates (GELU's output, the LayerNorms',
      the attention's softmax statistics) instead of keeping them;
    - with gradient checkpointing, each block's input (4·s·b·d) and one block recomputed;
    - the logits and their gradient: eager, the logits in p, their fp32 copy for the loss
      and the gradients of both (12·s·b·V under bf16/fp16, 8·s·b·V in fp32); compiled with
      the native model's loss inside the compiled region, the logits and their gradient in
      p alone (2p·s·b·V).

    The compiled coefficients reproduce the project's H200 run (gpt2 124M, bf16, compiled:
    0.445 GB a 1024-token sequence at micro-batch 16 and 64, against 0.43 here) and the eager
    ones its eager rung (0.95 GB a sequence, 0.93 here)."""
    m, t = cfg.model, cfg.trainer
    d, layers, seq = int(m.n_embd), int(m.n_layer), int(t.seq_len)
    vocab = padded_vocab_size(int(m.vocab_size or GPT2_VOCAB), int(m.vocab_multiple))
    p = 4 if t.precision == "fp32" else 2
    compiled = str(t.compile) != "off"  # checked: a mode
    per_layer = COMPILED_BYTES_PER_LAYER if compiled else ACTIVATION_BYTES_PER_LAYER
    one_layer = per_layer * seq * micro * d * (p // 2)  # twice in fp32
    on = t.grad_checkpointing if checkpointing is None else checkpointing
    blocks = layers * 4 * seq * micro * d + one_layer if on else layers * one_layer
    fused_loss = compiled and m.impl == "native"
    per_logit = 2 * p if fused_loss else (8 if p == 4 else 2 * p + 8)
    return blocks + per_logit * seq * micro * vocab


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
