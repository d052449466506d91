"""FSDP2 (`torch.distributed.fsdp.fully_shard`): parameters, gradients and optimizer states
sharded over the ranks, gathered block by block for forward and backward.

Each transformer block is one FSDP unit (its parameters are all-gathered just before the
block runs and its gradients reduce-scattered as soon as backward has left it), then the
root (embeddings, final LayerNorm, the tied LM head). Gradient accumulation turns the
reduce-scatter off on all micro-steps but the last; clipping computes the norm of the
sharded gradients across ranks. Checkpoints are torch Distributed Checkpoint (DCP) folders:
every rank writes its own shard, and a load reshards to whatever world size reads them.
See docs/strategies.md.
"""

from __future__ import annotations

import contextlib
import logging
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_collectives import (
    DefaultAllGather,
    DefaultReduceScatter,
)
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_map_only

from launcher.config.registry import engine, format_of
from launcher.config.schema import TrainerConfig
from launcher.observe.comm_stats import StepComm
from launcher.runtime.process import Runtime
from launcher.strategy.base import Strategy, compile_mode, host_copy, load_other_format
from launcher.strategy.collective_timer import KINDS, CollectiveTimer
from launcher.strategy.fsdp2.dcp import load_dcp
from launcher.strategy.optim import build_optimizer

if TYPE_CHECKING:  # the declaration names this module; this one only reads its config
    from launcher.strategy.fsdp2 import FSDP2Config

log = logging.getLogger("launcher")

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class _TimedAllGather(DefaultAllGather):
    """FSDP2's own all-gather, each call timed by a CollectiveTimer (see docs/communication.md)."""

    def __init__(self, timer: CollectiveTimer):
        super().__init__()
        params = KINDS["all_gather_into_tensor"][1]
        self._call = timer.wrap("all_gather_into_tensor", "all_gather", params, super().__call__)

    def __call__(self, **kwargs):
        return self._call(**kwargs)


class _TimedReduceScatter(DefaultReduceScatter):
    def __init__(self, timer: CollectiveTimer):
        super().__init__()
        params = KINDS["reduce_scatter_tensor"][1]
        self._call = timer.wrap("reduce_scatter_tensor", "reduce_scatter", params, super().__call__)

    def __call__(self, **kwargs):
        return self._call(**kwargs)


def _blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of the GPT-2 (both implementations keep them at transformer.h)."""
    return list(model.transformer.h)


def shard_file(rank: int) -> str:
    """The memory tier's file of one rank's shards."""
    return f"shards_rank{rank}.pt"


def _as_dtensors(saved, live):
    """`saved` (a state dict of local shards) with each tensor where `live` holds a DTensor
    made that DTensor's shard again."""
    if isinstance(live, DTensor):
        return DTensor.from_local(
            saved,
            live.device_mesh,
            live.placements,
            run_check=False,
            shape=live.shape,
            stride=live.stride(),
        )
    if isinstance(saved, dict) and isinstance(live, dict):
        return {k: _as_dtensors(v, live.get(k)) for k, v in saved.items()}
    if isinstance(saved, (list, tuple)) and isinstance(live, (list, tuple)):
        return type(saved)(_as_dtensors(s, v) for s, v in zip(saved, live, strict=False))
    return saved


class FSDP2Strategy(Strategy):
    def __init__(self, s: FSDP2Config, t: TrainerConfig, rt: Runtime, model: torch.nn.Module):
        self.format = engine(s.name).format
        self.rt, self.device = rt, rt.device
        self.grad_clip = t.grad_clip
        self.async_checkpoint = t.async_checkpoint
        mesh = init_device_mesh(rt.device.type, (dist.get_world_size(),))
        policy = MixedPrecisionPolicy(
            param_dtype=DTYPES.get(t.precision),  # None: the parameters' own (fp32)
            reduce_dtype=DTYPES[s.reduce_dtype],
        )
        shard = {"mesh": mesh, "mp_policy": policy}
        if s.offload == "cpu":
            shard["offload_policy"] = CPUOffloadPolicy(pin_memory=rt.device.type == "cuda")
        model = model.to(rt.device)
        for block in _blocks(model):
            if t.compile != "off":  # compiled per block: FSDP's hooks stay outside the graphs
                block.compile(mode=compile_mode(t.compile, rt.device))
            fully_shard(block, reshard_after_forward=s.reshard_after_forward, **shard)
        # The root's parameters are needed again at once by backward: kept after forward.
        fully_shard(model, reshard_after_forward=False, **shard)
        self.raw_model = self.module = model
        self.optimizer = build_optimizer(model, t)
        self.comm_timer: CollectiveTimer | None = None
        if s.time_comm and rt.world_size > 1:
            self.comm_timer = CollectiveTimer(rt.device, rt.world_size)
            for unit in [*_blocks(model), model]:
                unit.set_custom_all_gather(_TimedAllGather(self.comm_timer))
                unit.set_custom_reduce_scatter(_TimedReduceScatter(self.comm_timer))
        log.info(
            "fsdp2: %d blocks + root sharded over %d ranks, reshard_after_forward=%s, "
            "parameters %s, gradient reduction %s, offload %s",
            len(_blocks(model)),
            rt.world_size,
            s.reshard_after_forward,
            t.precision,
            s.reduce_dtype,
            s.offload,
        )

    # -- the step ------------------------------------------------------------------------
    @contextlib.contextmanager
    def micro_step(self, is_last: bool):
        if self.comm_timer is not None:
            self.comm_timer.begin_step()
        # No reduce-scatter until the last micro-step: gradients accumulate unsharded.
        self.module.set_requires_gradient_sync(is_last)
        yield

    def autocast(self):
        # FSDP2's mixed-precision policy casts the gathered parameters: no autocast.
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self, lr: float) -> torch.Tensor:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        params = [p for p in self.raw_model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        if isinstance(norm, DTensor):  # each rank's shards: the norm needs them all
            norm = norm.full_tensor()
        if self.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(params, self.grad_clip, norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.comm_timer is not None:
            self.comm_timer.end_step()
        return norm

    def drop_step(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        if self.comm_timer is not None:
            self.comm_timer.end_step()

    def drain_comm(self) -> list[StepComm] | None:
        return self.comm_timer.drain() if self.comm_timer is not None else None

    # -- checkpoints (DCP) -------------------------------------------------------------
    def _state(self) -> dict:
        model_sd, optim_sd = get_state_dict(self.raw_model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def save(self, folder: Path, rank: int) -> Future | None:
        """Every rank writes its shards into `folder` (DCP: `__<rank>_0.distcp`, and
        rank 0 the `.metadata` that maps them onto the full tensors). Asynchronously: the
        state is copied to host memory now and written by a thread, whose collectives go
        over a process group of their own, never interleaved with training's."""
        if not self.async_checkpoint:
            dcp.save(self._state(), checkpoint_id=folder)
            return None
        return dcp.async_save(
            self._state(),
            checkpoint_id=folder,
            process_group=self.rt.side_group("async_checkpoint"),
        )

    def snapshot(self, rank: int, share=None):
        """This rank's shards (each DTensor's local part) of the model and optimizer state,
        as DCP would save them, copied to host memory now; written as one file that only
        this rank, at this world size, loads (`_load_shards`). Nothing is held alike on two
        ranks, so nothing is split over the node (`share` is unused)."""
        shards = host_copy(tree_map_only(DTensor, lambda t: t.to_local(), self._state()))

        def write(folder: Path) -> None:
            torch.save(shards, folder / shard_file(rank))

        return write

    def files_to_load(self, folder: Path) -> list[Path]:
        own = folder / shard_file(self.rt.rank)
        return [own] if own.is_file() else []

    def load(self, folder: Path) -> None:
        """A DCP checkpoint (resharded to this world size), a memory-tier one of this rank's
        shards, or another engine's converted."""
        if (folder / shard_file(self.rt.rank)).is_file():
            self._load_shards(folder / shard_file(self.rt.rank))
        elif format_of(folder) is self.format:
            load_dcp(self.raw_model, self.optimizer, folder)
        else:
            load_other_format(folder, self.raw_model, self.optimizer, self._load_full)

    def _load_shards(self, path: Path) -> None:
        """The shards `snapshot` wrote, each put back into its DTensor (the live state's
        mesh, placements and global shape: the same sharding, as the same world size has)."""
        saved = torch.load(path, map_location=self.device, weights_only=True)
        state = _as_dtensors(saved, self._state())
        set_state_dict(
            self.raw_model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
        )

    def _load_full(self, model_sd: dict, osd: dict) -> None:
        """A whole model and optimizer state in DDP's layout (a DDP checkpoint, or a
        DeepSpeed one through its universal conversion): each rank keeps its shard. DDP's
        optimizer state is keyed by position; the positions are build_optimizer's
        parameter order, which names them."""
        full = StateDictOptions(full_state_dict=True)
        set_model_state_dict(self.raw_model, model_sd, options=full)
        names = {id(p): n for n, p in self.raw_model.named_parameters()}
        ordered = [names[id(p)] for g in self.optimizer.param_groups for p in g["params"]]
        osd = {
            "state": {ordered[i]: v for i, v in osd["state"].items()},
            "param_groups": [
                {**g, "params": [ordered[i] for i in g["params"]]} for g in osd["param_groups"]
            ],
        }
        set_optimizer_state_dict(self.raw_model, self.optimizer, osd, options=full)

    # -- the end -------------------------------------------------------------------------
    def close(self) -> None:
        if self.comm_timer is not None and self.rt.is_main:
            self.comm_timer.write_summary(self.rt.run_dir, self.rt.rank)
        self.module = self.raw_model = self.optimizer = None
