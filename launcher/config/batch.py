"""The batch arithmetic of a run, computed once: who processes how many sequences per step.

The global batch (sequences per optimizer step, all ranks together) is what the
experiment fixes; the micro-batch (sequences per forward/backward on one rank) is what
fits in memory; the world size is what the job got. Accumulation makes up the
difference, so changing the world size or the micro-batch keeps the math of a step. The
loop, the data order, DeepSpeed's config and the checkpoint metadata all read this one
object instead of each dividing the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

AUTO = "auto"  # trainer.micro_batch_size=auto (launcher.config.schema.AUTO)


@dataclass(frozen=True)
class BatchPlan:
    global_batch: int  # sequences per optimizer step, all ranks
    micro_batch: int  # sequences per forward/backward on one rank
    world_size: int
    seq_len: int

    @classmethod
    def of(cls, trainer, world_size: int) -> BatchPlan:
        """The plan of a `trainer` config section; a null global batch means one
        micro-batch per rank (no accumulation). With micro_batch_size=auto the plan starts
        at the per-rank batch, the search's upper bound (and the most memory any choice
        needs, which is what preflight sizes); the search sets the size it found."""
        global_batch = trainer.global_batch_size
        if trainer.micro_batch_size == AUTO:
            micro = max(int(global_batch) // world_size, 1)
        else:
            micro = int(trainer.micro_batch_size)
        return cls(
            global_batch=int(global_batch) if global_batch is not None else micro * world_size,
            micro_batch=micro,
            world_size=world_size,
            seq_len=int(trainer.seq_len),
        )

    def with_micro_batch(self, micro: int) -> BatchPlan:
        """The same global batch at another micro-batch: accumulation makes up the rest."""
        return replace(self, micro_batch=micro)

    def smaller_micro_batches(self) -> list[int]:
        """The micro-batches below this one to try, largest first: halved (rounded down)
        down to 1, keeping only those that divide the per-rank batch (12: 6, 3, 1)."""
        out, micro = [], self.micro_batch
        while micro > 1:
            micro //= 2
            if self.per_rank % micro == 0:
                out.append(micro)
        return out

    def problem(self) -> str | None:
        """Why this plan cannot run (the one line a user sees), or None."""
        per_step = self.micro_batch * self.world_size
        if self.global_batch % per_step:
            return (
                f"trainer.global_batch_size={self.global_batch} is not divisible by "
                f"trainer.micro_batch_size={self.micro_batch} x world size {self.world_size} "
                f"= {per_step}; choose a global batch that is a multiple of {per_step}"
            )
        return None

    @property
    def per_rank(self) -> int:
        """Sequences one rank processes per optimizer step."""
        return self.global_batch // self.world_size

    @property
    def accum(self) -> int:
        """Micro-steps per optimizer step on each rank (gradient accumulation)."""
        return self.per_rank // self.micro_batch

    @property
    def tokens_per_step(self) -> int:
        """Tokens one optimizer step trains on, all ranks together."""
        return self.global_batch * self.seq_len


def micro_batch_problem(trainer, world_size: int) -> str | None:
    """Why trainer.micro_batch_size cannot run (a whole number of at least 1, or auto with a
    global batch that the ranks divide), or None; the rest is `BatchPlan.problem`'s."""
    micro = trainer.micro_batch_size
    if micro == AUTO:
        global_batch = trainer.global_batch_size
        if global_batch is None:
            return (
                "trainer.micro_batch_size=auto needs trainer.global_batch_size (the search "
                "keeps it and starts from its share per rank); give one, e.g. "
                f"trainer.global_batch_size={16 * world_size}"
            )
        if global_batch % world_size:
            return (
                f"trainer.micro_batch_size=auto: trainer.global_batch_size={global_batch} is "
                f"not divisible by the world size {world_size}; give a multiple of {world_size}"
            )
        return None
    if isinstance(micro, bool) or not isinstance(micro, int):
        return (
            f"trainer.micro_batch_size={micro}: give a whole number of at least 1, or auto "
            "(the largest that fits, found at start)"
        )
    return None
