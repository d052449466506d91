"""Memory, predicted from the config's shape: per rank on the device (the training state by
its engine, activations, the allocator's headroom), per node in host memory and /dev/shm.

The /dev/shm figure (`shm_need`) is the one every part of the launcher sizes with: the
preflight and the doctor check it against the machine, the job records it in env.json, and
the Slurm and Kubernetes renderers request it (docs/plan.md, "One arithmetic").
"""

from __future__ import annotations

from launcher.checkpoint import memory as tier
from launcher.config.batch import BatchPlan
from launcher.config.model_shape import GPT2_VOCAB, padded_vocab_size, param_count
from launcher.config.registry import engine
from launcher.data.shm import INT64_BYTES, shm_need_bytes

HEADROOM = 0.10  # of the device's total: the caching allocator's fragmentation (assumed)
CONTEXT_BYTES = 1 * 10**9  # CUDA context, cuBLAS/NCCL workspaces, per rank (assumed)
RANK_HOST_BYTES = 2 * 10**9  # a rank's process on the host: torch, CUDA libraries (assumed)
CPU_RANK_HOST_BYTES = 3 * 10**8  # the same without CUDA (assumed)
WORKER_HOST_BYTES = 3 * 10**8  # a forked DataLoader worker's own pages (assumed)
ACTIVATION_BYTES_PER_LAYER = 34  # x seq x batch x width, 16-bit (Korthikanti et al. 2022)
COMPILED_BYTES_PER_LAYER = 24  # the same under trainer.compile (activation_bytes)


def micro_batch(cfg, world_size: int) -> int:
    """The micro-batch the config runs (BatchPlan's: auto starts at the per-rank batch)."""
    return BatchPlan.of(cfg.trainer, world_size).micro_batch


def loader_shm_need(cfg) -> int:
    """Bytes of /dev/shm one rank's DataLoader workers hold at once."""
    return shm_need_bytes(
        num_workers=cfg.data.num_workers,
        prefetch_factor=cfg.data.prefetch_factor,
        # auto: at most the per-rank batch, bounded here (no world size) by the global one
        micro_batch=micro_batch(cfg, 1),
        seq_len=cfg.trainer.seq_len,
    )


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
    declared = engine(cfg.strategy.name).train_state
    if declared is None:
        raise ValueError(f"strategy={cfg.strategy.name} declares no train_state for the plan")
    return declared(cfg, param_count(cfg.model), world_size)


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


def host_per_node(cfg, ranks_per_node: int, world_size: int, on_gpu: bool,
                  restarts: int | None = None) -> dict[str, int]:  # fmt: skip
    """Host memory one node needs: each rank's process, its DataLoader workers and pinned
    batches, /dev/shm (the loaders' and the memory tier's), and on the CPU the training
    itself."""
    workers = int(cfg.data.num_workers)
    micro = micro_batch(cfg, world_size)
    batch = 2 * micro * int(cfg.trainer.seq_len) * INT64_BYTES
    pinned = batch * max(1, int(cfg.data.prefetch_factor) * max(workers, 1))
    base = RANK_HOST_BYTES if on_gpu else CPU_RANK_HOST_BYTES
    training = (
        0 if on_gpu else sum(train_state(cfg, world_size).values()) + activation_bytes(cfg, micro)
    )
    shm = shm_need(cfg, ranks_per_node, world_size, restarts)
    rank = base + training + (pinned if cfg.data.pin_memory else 0)
    processes = ranks_per_node * (rank + workers * WORKER_HOST_BYTES)
    return {"rank_process": rank, "processes": processes, "shm": shm, "total": processes + shm}
