"""DistributedDataParallel: every rank holds the whole model; gradients are all-reduced.

With one process and no process group (`python -m launcher.train`) the model is used
unwrapped, so the same loop runs everywhere.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.nn.parallel import DistributedDataParallel

from launcher.checkpoint.memory import node_share
from launcher.checkpoint.memory.node_share import ALONE, NodeShare
from launcher.config.registry import engine, format_of
from launcher.config.schema import TrainerConfig
from launcher.observe.comm_stats import StepComm
from launcher.runtime.process import Runtime
from launcher.strategy.base import (
    Strategy,
    compile_mode,
    fingerprint,
    host_copy,
    load_other_format,
)
from launcher.strategy.ddp import comm_hooks, powersgd
from launcher.strategy.ddp.comm_timing import CommTimer
from launcher.strategy.ddp.files import FILES
from launcher.strategy.optim import build_optimizer

if TYPE_CHECKING:  # the declaration names this module; this one only reads its config
    from launcher.strategy.ddp import DDPConfig

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class DDPStrategy(Strategy):
    def __init__(self, s: DDPConfig, t: TrainerConfig, rt: Runtime, model: torch.nn.Module):
        self.format = engine(s.name).format  # DDP's, or a variant's that declares it
        self.device = rt.device
        self.rank = rt.rank
        self.precision = t.precision
        self.grad_clip = t.grad_clip
        self.raw_model = model.to(rt.device)
        self.optimizer = build_optimizer(self.raw_model, t)
        self.scaler = torch.amp.GradScaler(rt.device.type, enabled=t.precision == "fp16")
        module: torch.nn.Module = self.raw_model
        if t.compile != "off":
            module = torch.compile(module, mode=compile_mode(t.compile, rt.device))
        self.ddp: DistributedDataParallel | None = None
        self.comm_timer: CommTimer | None = None
        self.comm_state = None  # the comm hook's state (PowerSGD's goes into checkpoints)
        # static_graph records the graph on the first backward, and torch's reducer asserts
        # (expect_autograd_hooks_) when that backward runs under no_sync: so the first step
        # of a static-graph DDP all-reduces every micro-batch (the same average: the reduced
        # part is equal on every rank), and accumulates under no_sync from the second on.
        self.sync_every_micro_step = s.static_graph
        if rt.distributed:
            # Only a non-default buffer setting is passed: newer torch deprecates the name.
            buffers = {} if s.broadcast_buffers else {"broadcast_buffers": False}
            self.ddp = DistributedDataParallel(
                module,
                device_ids=[rt.device.index] if rt.device.type == "cuda" else None,
                bucket_cap_mb=s.bucket_cap_mb,
                gradient_as_bucket_view=s.gradient_as_bucket_view,
                static_graph=s.static_graph,
                find_unused_parameters=s.find_unused_parameters,
                **buffers,
            )
            if s.time_comm:
                self.comm_timer = CommTimer(rt.device)
            self.comm_state = comm_hooks.register(self.ddp, s, self.comm_timer)
            module = self.ddp
        self.module = module

    def micro_step(self, is_last: bool):
        if self.ddp is None or is_last or self.sync_every_micro_step:
            return contextlib.nullcontext()
        return self.ddp.no_sync()

    def autocast(self):
        dtype = AUTOCAST_DTYPES.get(self.precision)
        return torch.autocast(self.device.type, dtype=dtype, enabled=dtype is not None)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def step(self, lr: float) -> torch.Tensor:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.scaler.unscale_(self.optimizer)
        params = self.raw_model.parameters()
        if self.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, self.grad_clip)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.sync_every_micro_step = False
        if self.comm_timer is not None:
            self.comm_timer.end_step()
        return norm

    def drop_step(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.sync_every_micro_step = False
        if self.comm_timer is not None:
            self.comm_timer.end_step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        if self.ddp is not None:
            # A synchronising forward whose backward never ran (the step ran out of memory)
            # left the reducer expecting that backward's hooks: the next micro-step's backward,
            # under no_sync, would all-reduce. `_reset_state` is what DDP itself calls so that
            # a forward can run after a backward that did not (it also re-plans the buckets).
            self.ddp.reducer._reset_state()

    def drain_comm(self) -> list[StepComm] | None:
        return self.comm_timer.drain() if self.comm_timer is not None else None

    @torch.no_grad()
    def replica_fingerprint(self) -> list[float]:
        return fingerprint(self.raw_model.parameters())

    def comm_buckets(self) -> int | None:
        """How many gradient buckets DDP all-reduces per step (set by bucket_cap_mb)."""
        if self.ddp is None:
            return None
        info = self.ddp._get_ddp_logging_data()  # buckets are rebuilt after the first step
        sizes = str(info.get("rebuilt_bucket_sizes") or info.get("bucket_sizes", ""))
        return len([s for s in sizes.split(",") if s.strip()]) or None

    def _state_files(self, rank: int, whole: bool) -> dict[str, object]:
        """File name -> what it holds: PowerSGD's memory on every rank, and with `whole` the
        model and optimizer (which DDP keeps identical on every rank)."""
        files: dict[str, object] = {}
        if self.comm_state is not None:
            files[powersgd.state_file(Path(), rank).name] = self.comm_state.state_dict()
        if whole:
            files[FILES[0]] = self.raw_model.state_dict()
            files[FILES[1]] = {
                "optimizer": self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict(),
            }
        return files

    def save(self, folder: Path, rank: int) -> None:
        for name, state in self._state_files(rank, whole=rank == 0).items():
            torch.save(state, folder / name)

    def snapshot(self, rank: int, share: NodeShare = ALONE):
        """PowerSGD's memory of this rank, and this rank's part of the model and optimizer,
        which every rank holds alike: the node keeps one copy
        (launcher.checkpoint.memory.node_share)."""
        files = host_copy(self._state_files(rank, whole=False))
        part = host_copy(node_share.part_of(self._state_files(rank, whole=True), share))

        def write(folder: Path) -> None:
            for name, state in files.items():
                torch.save(state, folder / name)
            node_share.write(folder, part)

        return write

    def files_to_load(self, folder: Path) -> list[Path]:
        own = powersgd.state_file(folder, self.rank) if self.comm_state is not None else None
        if node_share.holds_part(folder):  # a memory checkpoint: the node's parts
            whole = node_share.part_files(folder)
        # Another engine's format is read by its own reader (sealed with every file's size).
        elif format_of(folder) in (self.format, None):
            whole = [folder / f for f in FILES]
        else:
            whole = []
        return whole + ([own] if own is not None and own.exists() else [])

    def load(self, folder: Path) -> None:
        if node_share.holds_part(folder):
            self._load_whole_state(node_share.join(folder, self.device))
        elif format_of(folder) in (self.format, None):
            self._load_whole_state({
                name: torch.load(folder / name, map_location=self.device, weights_only=True)
                for name in FILES
            })  # fmt: skip
        else:  # FSDP2's shards gathered whole, or DeepSpeed's universal conversion
            load_other_format(folder, self.raw_model, self.optimizer, self._load_whole)
        powersgd.load_state(self.comm_state, folder, self.rank, self.device)

    def _load_whole(self, model_sd: dict, optim_sd: dict) -> None:
        self.raw_model.load_state_dict(model_sd)
        self.optimizer.load_state_dict(optim_sd)

    def _load_whole_state(self, files: dict) -> None:
        """The model and optimizer files' contents, as `_state_files(whole=True)` made them."""
        self.raw_model.load_state_dict(files[FILES[0]])
        opt = files[FILES[1]]
        self.optimizer.load_state_dict(opt["optimizer"])
        self.scaler.load_state_dict(opt["scaler"])

    def close(self) -> None:
        self.ddp = None
        self.module = self.raw_model
