"""The one interface the training loop talks to, whatever engine does the work.

The loop never touches DDP, DeepSpeed or FSDP2 directly: it asks the strategy for the
module to call, a context for each micro-step, and to run backward and the optimizer step.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from launcher.checkpoint.memory.node_share import memory_key
from launcher.config.registry import format_of
from launcher.observe.comm_stats import StepComm

if TYPE_CHECKING:
    from launcher.checkpoint.memory.node_share import NodeShare

# A mode less its CUDA graphs, which only a CUDA device has: torch skips them for a graph on
# any other device, so there the mode without them compiles the very same kernels.
WITHOUT_CUDA_GRAPHS = {"reduce-overhead": None, "max-autotune": "max-autotune-no-cudagraphs"}


def compile_mode(compile: str, device: torch.device) -> str | None:
    """`torch.compile`'s mode for a `trainer.compile` setting other than off (`default`
    is torch's own default, passed as None). Off a CUDA device a mode is passed without
    the CUDA graphs torch would skip there: inductor keys its compile cache on the mode's
    options, so `reduce-overhead` then reuses the graphs `default` compiled (on a CPU, a
    cold compile of gpt2-tiny is tens of CPU-seconds a rank) instead of compiling them
    again for a setting that changes nothing."""
    if compile != "default" and device.type != "cuda":
        return WITHOUT_CUDA_GRAPHS.get(compile, compile)
    return None if compile == "default" else compile


def load_other_format(folder: Path, model: torch.nn.Module, optimizer, load_whole) -> None:
    """Another engine's checkpoint into this one, through the reader its format declares
    (launcher.config.registry.Format): a reader of a whole state hands it to
    `load_whole(model_sd, optim_sd)` (the optimizer state keyed by position, as
    launcher.strategy.optim.build_optimizer orders the parameters); DCP's loads into the
    model and optimizer as they are, sharded or whole."""
    format_of(folder).module().load_into(folder, model, optimizer, load_whole)


def host_copy(tree, _copied: dict | None = None):
    """`tree` (a state dict: nested dicts, lists and tuples of tensors and plain values) with
    every container new and every tensor copied to host memory: a snapshot that the next
    optimizer step, which updates the live tensors and dicts in place, leaves as it is. Any
    other object is copied too (DeepSpeed's state holds its loss scaler, which steps change).
    Tensors that view the same memory (tied weights: GPT-2's embedding and LM head) are
    copied once and stay one tensor, so the copy and its file hold them once, as torch.save
    of the live state would."""
    copied = {} if _copied is None else _copied
    if isinstance(tree, torch.Tensor):
        key = memory_key(tree)
        if key not in copied:
            copied[key] = tree.detach().to("cpu", copy=True)
        return copied[key]
    if isinstance(tree, dict):
        return {k: host_copy(v, copied) for k, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # a namedtuple
        return type(tree)(*(host_copy(v, copied) for v in tree))
    if isinstance(tree, (list, tuple)):
        return type(tree)(host_copy(v, copied) for v in tree)
    return copy.deepcopy(tree)


def fingerprint(params) -> list[float]:
    """Float64 sum and sum of squares of `params`, one parameter in float64 at a time: a
    float64 copy of the whole model at once would be twice its fp32 bytes, on the host on
    a CPU (the end of a gpt2 run's host peak, before)."""
    total = squares = 0.0
    for p in params:
        wide = p.detach().double()
        total += wide.sum().item()
        squares += wide.square().sum().item()
    return [total, squares]


class Strategy(ABC):
    """Wraps a model and its optimizer for one way of data-parallel training."""

    module: torch.nn.Module  # what the loop calls forward on

    @abstractmethod
    def micro_step(self, is_last: bool) -> AbstractContextManager:
        """Context for one micro-step; gradients are only synchronised on the last one."""

    @abstractmethod
    def autocast(self) -> AbstractContextManager:
        """Context for the forward pass in the configured precision."""

    @abstractmethod
    def backward(self, loss: torch.Tensor) -> None:
        """Backward of an already accumulation-scaled loss."""

    @abstractmethod
    def step(self, lr: float) -> torch.Tensor:
        """Clip, step the optimizer at `lr`, zero grads; return the pre-clip grad norm."""

    def drop_step(self) -> None:
        """Throw this step's gradients away without an optimizer step (trainer.on_nonfinite=
        skip): every rank calls it at the same step, so the replicas stay identical."""
        raise NotImplementedError(f"{type(self).__name__} cannot drop a step")

    def zero_grad(self) -> None:
        """Throw away the gradients accumulated so far in this step, none of them synchronised
        yet, and any forward's wait for its backward (a micro-step that ran out of memory,
        trainer.on_oom=retry, or the search of trainer.micro_batch_size=auto). Engines
        declaring `resizes_micro_batch` have it."""
        raise NotImplementedError(f"{type(self).__name__} cannot change its micro-batch")

    @abstractmethod
    def save(self, folder: Path, rank: int) -> Future | None:
        """Write this rank's share of the model/optimizer state into `folder`; an engine
        that writes asynchronously (trainer.async_checkpoint) returns the future of it."""

    def snapshot(self, rank: int, share: NodeShare) -> Callable[[Path], None]:
        """This rank's state (its shard where the engine shards; its `share` of what every
        rank holds alike, launcher.checkpoint.memory.node_share) copied to host memory now, and the
        function that writes it into this rank's folder of the memory tier, in node-local
        memory, where `load` at the same world size reads it (with the node's other parts).
        Engines declaring a `MemoryCheckpoint` have it."""
        raise NotImplementedError(f"{type(self).__name__} cannot write the memory tier")

    @abstractmethod
    def load(self, folder: Path) -> None:
        """Restore model/optimizer state written by `save`."""

    def files_to_load(self, folder: Path) -> list[Path]:
        """The files of `folder` that this rank's `load` reads: checked on every rank before
        any rank loads, so that one rank's unreadable file makes all ranks skip the
        checkpoint together, before an engine's load enters a collective."""
        return []

    def replica_fingerprint(self) -> list[float] | None:
        """Numbers equal on every rank exactly when the model replicas are identical
        (None where the engine shards parameters and ranks hold different parts)."""
        return None

    def drain_comm(self) -> list[StepComm] | None:
        """Each step's gradient-communication figures since the last call, oldest first
        (None where nothing is timed: one process, or `strategy.time_comm=false`)."""
        return None

    def comm_buckets(self) -> int | None:
        """Gradient buckets communicated per step, where the engine has such a notion."""
        return None

    @abstractmethod
    def close(self) -> None:
        """Drop engine objects before the process group goes away."""
