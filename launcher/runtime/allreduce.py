"""Timing an all-reduce, and nccl-tests' bus-bandwidth convention: shared by the burn-in
gate (launcher.resilience.burnin), the bandwidth benchmark (launcher.commbench) and the
metrics (launcher.observe.metrics)."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist


def bus_bandwidth(algbw: float, world: int) -> float:
    """nccl-tests' all-reduce bus bandwidth: what each link of a ring carries."""
    return algbw * 2 * (world - 1) / world


def time_allreduce(tensor: torch.Tensor, warmup: int, iters: int, group=None) -> float:
    """Mean seconds per all-reduce of `tensor` on this rank, over `group` (None: every
    rank), after `warmup` untimed ones and a barrier so that every rank starts together."""
    sync = torch.cuda.synchronize if tensor.is_cuda else (lambda: None)
    for _ in range(warmup):
        dist.all_reduce(tensor, group=group)
    sync()
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor, group=group)
    sync()
    return (time.perf_counter() - start) / iters
