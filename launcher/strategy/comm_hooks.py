"""DDP gradient-communication hooks: `strategy.comm_hook` = none, fp16 or bf16.

fp16/bf16 halve the bytes each all-reduce sends: the bucket is cast, all-reduced and cast
back (and divided by the world size). Every rank applies the same reduced gradient, so the
replicas stay identical; the trainer checks that at the end of a run.

With `strategy.time_comm` (the default) the hook is wrapped by a `CommTimer`; for `none`
that means PyTorch's Python all-reduce hook replaces DDP's built-in C++ one, which does the
same all-reduce (benchmarks/comm_timing_cost.py measures what the wrapping costs).
"""

from __future__ import annotations

import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from launcher.strategy.comm_timing import CommTimer


def bf16_compress(process_group, bucket):
    """PyTorch's bf16 compression hook under another name.

    DDP refuses the stock hook *by its function name* unless CUDA and NCCL >= 2.10 are
    present, although the hook itself runs on gloo too; delegating from a function with
    another name lets CPU jobs (and the tests) use bf16 compression.
    """
    return default_hooks.bf16_compress_hook(process_group, bucket)


HOOKS = {
    "none": default_hooks.allreduce_hook,
    "fp16": default_hooks.fp16_compress_hook,
    "bf16": bf16_compress,
}
WIRE_ITEMSIZE = {"fp16": 2, "bf16": 2}  # compressed hooks send 16-bit values


def wire_bytes(hook: str):
    """Bytes the named hook sends for one bucket."""

    def count(bucket) -> int:
        buffer = bucket.buffer()
        return buffer.numel() * WIRE_ITEMSIZE.get(hook, buffer.element_size())

    return count


def register(ddp, hook: str, timer: CommTimer | None) -> None:
    """Register the hook named by `strategy.comm_hook` on `ddp`, timed when `timer` is given.

    Untimed `none` leaves DDP's own built-in all-reduce in place.
    """
    if timer is not None:
        ddp.register_comm_hook(dist.group.WORLD, timer.wrap(HOOKS[hook]))
    elif hook != "none":
        ddp.register_comm_hook(dist.group.WORLD, HOOKS[hook])
