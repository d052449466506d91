"""The experiment as the rehearsal runs it: everything that decides a fault path kept,
everything that only costs time shrunk.

Kept (the user's overrides pass through untouched): the strategy and its settings, the
DataLoader (workers, pinning, persistence), precision, gradient checkpointing, the
checkpoint settings (format, async writes, how many are kept), the watchdog and straggler
settings, the non-finite policy, the logger, the cluster kind, NCCL and process-group
settings. Shrunk (appended, so they win): the model's width and depth, the steps, the
batch, the sequence, the data read, compilation and the profiler (both minutes of start-up
that no fault path goes through).
"""

from __future__ import annotations

from omegaconf import DictConfig

STEPS = 30  # long enough to stop, kill and resume mid-run with room to spare
CHECKPOINT_INTERVAL = 10
MICRO_BATCH = 2
ACCUMULATION = 2  # per rank at the full world size; doubled on half the ranks

KEPT = (
    "strategy.*", "data.num_workers", "data.pin_memory", "data.persistent_workers",
    "trainer.precision", "trainer.grad_checkpointing", "trainer.async_checkpoint",
    "trainer.keep_checkpoints (at least 2)", "trainer.on_nonfinite", "watchdog.*", "logger",
    "cluster", "nccl", "dist",
)  # fmt: skip


def shrunk(cfg: DictConfig, nproc: int) -> list[str]:
    """The overrides that shrink `cfg` (the user's composed experiment) for `nproc` ranks."""
    out = [
        "model.n_layer=2",
        "model.n_head=2",
        "model.n_embd=64",
        "model.vocab_size=null",
        "model.init_from=null",
        f"trainer.max_steps={STEPS}",
        f"trainer.micro_batch_size={MICRO_BATCH}",
        f"trainer.global_batch_size={MICRO_BATCH * ACCUMULATION * nproc}",
        "trainer.seq_len=64",
        "trainer.warmup_steps=3",
        "trainer.lr_decay_steps=null",
        "trainer.log_interval=1",
        f"trainer.eval_interval={STEPS}",
        "trainer.eval_batches=2",
        f"trainer.checkpoint_interval={CHECKPOINT_INTERVAL}",
        "trainer.compile=off",
        "data.max_bytes=400000",
        "data.bpe_vocab_size=512",
        "profiler=off",
    ]
    if cfg.trainer.keep_checkpoints < 2:  # the world-size case resumes a mid-run checkpoint
        out.append("trainer.keep_checkpoints=2")
    if cfg.logger.mode == "online":  # a rehearsal sends nothing to the W&B server
        out.append("logger.mode=offline")
    return out
