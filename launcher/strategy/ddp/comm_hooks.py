"""DDP gradient-communication hooks: `strategy.comm_hook` = none, fp16, bf16 or powersgd.

none/fp16/bf16 are one all-reduce of the bucket's gradients divided by the world size; fp16
and bf16 send the bucket cast to 16 bits (half the bytes on the wire) and cast the sum back
into the bucket. powersgd sends low-rank approximations of the large gradient matrices
(launcher.strategy.ddp.powersgd). Every rank applies the same reduced gradient, so the replicas
stay identical; the trainer checks that at the end of a run.

The all-reduce hooks are PyTorch's `allreduce_hook`, `fp16_compress_hook` and
`bf16_compress_hook`, written out for two reasons:

- the communication timer (CommTimer) records a bucket's *done* moment inside the hook's
  one completion callback, rather than chaining a second future onto PyTorch's hooks;
- DDP refuses PyTorch's bf16 hook *by its function name* without CUDA and NCCL >= 2.10,
  although the computation runs on gloo too: this one lets CPU jobs (and the tests) use it.

With `strategy.time_comm=false` and `none`, no hook is registered: DDP's built-in C++
all-reduce runs, and no communication figures are recorded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from launcher.strategy.ddp.comm_timing import CommTimer
from launcher.strategy.ddp.powersgd import PowerSGDState, powersgd_hook

if TYPE_CHECKING:  # the declaration names the engine, which imports this module
    from launcher.strategy.ddp import DDPConfig

WIRE_DTYPES = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}


def make_hook(wire_dtype: torch.dtype | None, timer: CommTimer | None):
    """An all-reduce hook sending `wire_dtype` (None: the bucket's own), timed by `timer`.

    It runs once per bucket on the autograd thread, where Python time delays the next
    kernel launches of backward: the group and its size are looked up once, and the
    collective goes straight to the process group (dist.all_reduce adds argument checks).
    (No annotations: DDP rejects a hook whose annotations are not the real GradBucket and
    Future objects, and `from __future__ import annotations` turns them into strings.)
    """
    group = dist.group.WORLD
    world = dist.get_world_size(group)

    def allreduce_hook(state, bucket):
        buffer = bucket.buffer()
        wire = buffer if wire_dtype is None else buffer.to(wire_dtype)
        mark_done = timer.bucket_ready() if timer is not None else None
        wire.div_(world)
        fut = group.allreduce([wire]).get_future()

        def finish(fut):
            reduced = fut.value()[0]
            if wire_dtype is not None:
                buffer.copy_(reduced)
            if mark_done is not None:  # on GPU: ordered after the reduced bucket is in place
                mark_done(wire.numel() * wire.element_size())
            return buffer

        return fut.then(finish)

    allreduce_hook.__name__ = f"allreduce_{wire_dtype or 'native'}_hook".replace("torch.", "")
    return allreduce_hook


def register(ddp, scfg: DDPConfig, timer: CommTimer | None) -> PowerSGDState | None:
    """Register the hook named by `strategy.comm_hook` on `ddp`, timed when `timer` is
    given; return PowerSGD's state (for checkpoints), else None.

    Untimed `none` leaves DDP's own built-in all-reduce in place.
    """
    if scfg.comm_hook == "powersgd":
        state = PowerSGDState(
            ddp.module.named_parameters(),
            matrix_rank=scfg.powersgd_rank,
            start_step=scfg.powersgd_warmup_steps,
            min_compression_rate=scfg.powersgd_min_compression_rate,
            plain_hook=make_hook(None, timer),
            timer=timer,
        )
        ddp.register_comm_hook(state, powersgd_hook)
        return state
    if timer is not None or scfg.comm_hook != "none":
        ddp.register_comm_hook(None, make_hook(WIRE_DTYPES[scfg.comm_hook], timer))
    return None
