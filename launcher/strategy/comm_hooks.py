"""DDP gradient-communication hooks: `strategy.comm_hook` = none, fp16 or bf16.

fp16/bf16 halve the bytes each all-reduce sends: the bucket is cast, all-reduced and cast
back (and divided by the world size). Every rank applies the same reduced gradient, so the
replicas stay identical; the trainer checks that at the end of a run.
"""

from __future__ import annotations

import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks


def bf16_compress(process_group, bucket):
    """PyTorch's bf16 compression hook under another name.

    DDP refuses the stock hook *by its function name* unless CUDA and NCCL >= 2.10 are
    present, although the hook itself runs on gloo too; delegating from a function with
    another name lets CPU jobs (and the tests) use bf16 compression.
    """
    return default_hooks.bf16_compress_hook(process_group, bucket)


HOOKS = {"fp16": default_hooks.fp16_compress_hook, "bf16": bf16_compress}


def register(ddp, hook: str) -> None:
    """Register the hook named by `strategy.comm_hook` on `ddp` (none: DDP's own all-reduce)."""
    if hook != "none":
        ddp.register_comm_hook(dist.group.WORLD, HOOKS[hook])
