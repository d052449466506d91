"""DeepSpeed: ZeRO stages 0-3, with optimizer (and, for ZeRO-3, parameter) offload to CPU.

The engine stays behind the Strategy interface, so the one training loop drives it as it
drives DDP: `micro_step` tells the engine whether this micro-batch ends the accumulation
(ZeRO-2/3 reduce gradients every micro-step, ZeRO-0/1 at the boundary only), `backward`
is the engine's (the loop already divides the loss by the accumulation steps), and `step`
sets the step's LR and lets the engine clip, step and zero the gradients. The DeepSpeed
config is built from the Hydra keys (launcher.strategy.deepspeed.ds_config) and written to the run
directory as `ds_config.json`. `deepspeed` is imported here only, when chosen.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path

import torch
import torch.distributed as dist

from launcher.checkpoint import protocol as checkpoint
from launcher.config.schema import TrainerConfig
from launcher.observe.comm_stats import StepComm
from launcher.runtime.process import Runtime
from launcher.strategy.base import Strategy, fingerprint, host_copy
from launcher.strategy.collective_timer import CollectiveTimer
from launcher.strategy.deepspeed.ds_config import (
    RECOVERY_SCRIPTS,
    STRATEGY_FILE,
    DeepSpeedConfig,
    build_ds_config,
)
from launcher.strategy.deepspeed.ds_import import import_deepspeed, restore_torch_linear
from launcher.strategy.deepspeed.universal import converted_folder, needs_conversion
from launcher.strategy.optim import build_optimizer

log = logging.getLogger("launcher")


class DeepSpeedStrategy(Strategy):
    def __init__(self, s: DeepSpeedConfig, t: TrainerConfig, rt: Runtime, model: torch.nn.Module):
        self.rt = rt
        self.stage = int(s.zero_stage)
        self.precision = t.precision
        deepspeed = import_deepspeed()
        self._deepspeed = deepspeed
        deepspeed.init_distributed(dist_backend=dist.get_backend(), dist_init_required=False)
        self.ds_config = build_ds_config(s, t, rt.world_size)
        optimizer = build_optimizer(model, t)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model.to(rt.device), optimizer=optimizer, config=self.ds_config
        )
        self.module = self.engine
        self.comm_timer: CollectiveTimer | None = None
        if s.time_comm and rt.world_size > 1:
            from deepspeed.comm import comm as ds_comm

            self.comm_timer = CollectiveTimer(rt.device, rt.world_size)
            self.comm_timer.install(ds_comm.cdb)
        if rt.is_main:
            used = dict(self.engine.config)  # the dict the engine parsed, batch keys resolved
            used["train_batch_size"] = self.engine.train_batch_size()
            used["train_micro_batch_size_per_gpu"] = self.engine.train_micro_batch_size_per_gpu()
            used["gradient_accumulation_steps"] = self.engine.gradient_accumulation_steps()
            (rt.run_dir / "ds_config.json").write_text(json.dumps(used, indent=1, default=str))
        log.info(
            "deepspeed %s: ZeRO-%d, %s, optimizer offload %s, parameter offload %s",
            deepspeed.__version__,
            self.stage,
            self.precision,
            s.offload_optimizer,
            s.offload_param,
        )

    # -- the step ------------------------------------------------------------------------
    @contextlib.contextmanager
    def micro_step(self, is_last: bool):
        if self.comm_timer is not None:
            self.comm_timer.begin_step()
        self.engine.set_gradient_accumulation_boundary(is_last)
        yield

    def autocast(self):
        # The engine holds the model in bf16/fp16 itself (with fp32 master weights in the
        # optimizer): DeepSpeed's mixed precision, not autocast.
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss, scale_wrt_gas=False)  # the loop has scaled it already

    def step(self, lr: float) -> torch.Tensor:
        for group in self.engine.optimizer.param_groups:
            group["lr"] = lr
        own_norm = None
        if self.stage == 0 and self.precision == "fp32":  # DeepSpeed does not report it here
            grads = [p.grad for p in self.engine.module.parameters() if p.grad is not None]
            own_norm = torch.nn.utils.get_total_norm(grads)
        self.engine.step()
        if self.comm_timer is not None:
            self.comm_timer.end_step()
        norm = self.engine.get_global_grad_norm()
        if norm is None:
            norm = own_norm if own_norm is not None else float("nan")
        return torch.as_tensor(norm, dtype=torch.float32).detach()

    def drain_comm(self) -> list[StepComm] | None:
        return self.comm_timer.drain() if self.comm_timer is not None else None

    @torch.no_grad()
    def replica_fingerprint(self) -> list[float]:
        """Float64 sum and sum of squares of the whole model, gathered under ZeRO-3 (every
        rank then holds the same full parameters only if their shards fit together)."""
        params = list(self.engine.module.parameters())
        gather = (
            self._deepspeed.zero.GatheredParameters(params)
            if self.stage == 3
            else contextlib.nullcontext()
        )
        with gather:
            return fingerprint(params)

    # -- checkpoints -----------------------------------------------------------------------
    def _identity(self) -> dict:
        return {
            "strategy": "deepspeed",
            "zero_stage": self.stage,
            "world_size": self.rt.world_size,
            "precision": self.precision,
        }

    def save(self, folder: Path, rank: int) -> None:
        """DeepSpeed's own save into `folder` (the checkpoint writer's temporary folder):
        every rank writes its shards, rank 0 the model states; no `latest` of DeepSpeed's
        (the launcher's pointer moves once the folder is complete)."""
        self.engine.save_checkpoint(str(folder.parent), tag=folder.name, save_latest=False)
        if rank == 0:
            (folder / STRATEGY_FILE).write_text(json.dumps(self._identity()))
            # DeepSpeed copies its offline converters (zero_to_fp32.py: the shards to one
            # fp32 state dict) beside the checkpoint folders: keep them with the checkpoint.
            for script in RECOVERY_SCRIPTS:
                if (folder.parent / script).is_file():
                    os.replace(folder.parent / script, folder / script)

    def snapshot(self, rank: int, share=None):
        """What DeepSpeed's save writes for this rank, copied to host memory now: the model
        states (every rank's own copy here, where the durable save has rank 0's alone under
        ZeRO-0/1/2) and its ZeRO partition of the optimizer (ZeRO-0: the optimizer is in the
        model states); written under DeepSpeed's file names, so that `load` reads them. Its
        load reads files by name from one folder, so the replicated model states are not
        split over the node (`share` is unused): a rank's copy stays in its own folder."""
        e = self.engine
        # ZeRO-3 partitions its persistent (small, never released) parameters for the save,
        # as DeepSpeed's own save does, and gathers them again after the copy.
        if e._optimizer_has_ckpt_event_prologue():
            e.optimizer.checkpoint_event_prologue()
        try:
            module = e.module_state_dict()
            frozen = e.zero_optimization_partition_gradients()
            states = {
                Path(e._get_ckpt_name("", "")).name: e._common_checkpoint_state(
                    module, e.zero_optimization(), frozen
                )
            }
            if e.save_zero_checkpoint:  # this rank's partition (bf16 ZeRO-0's too)
                states[Path(e._get_zero_ckpt_name("", "")).name] = {
                    "optimizer_state_dict": e.optimizer.state_dict(),
                    "ds_config": e.config,
                    "ds_version": self._deepspeed.__version__,
                }
            states = host_copy(states)
        finally:
            if e._optimizer_has_ckpt_event_epilogue():
                e.optimizer.checkpoint_event_epilogue()
        identity = json.dumps(self._identity())

        def write(folder: Path) -> None:
            for name, state in states.items():
                torch.save(state, folder / name)
            (folder / STRATEGY_FILE).write_text(identity)

        return write

    def _source(self, folder: Path) -> tuple[Path, bool]:
        """The folder DeepSpeed loads for checkpoint `folder`, and whether it is the
        universal conversion (written by `universal` when the world size or ZeRO stage
        changed since `folder` was saved)."""
        written = folder / STRATEGY_FILE
        if not written.is_file():
            raise RuntimeError(f"{folder} was not written by strategy=deepspeed")
        saved, now = json.loads(written.read_text()), self._identity()
        if saved.get("precision") != now["precision"]:
            raise RuntimeError(
                f"{folder} was written with trainer.precision={saved.get('precision')}, "
                f"not {now['precision']}; resume it with trainer.precision={saved.get('precision')}"
            )

        def as_meta(ident: dict) -> dict:  # the part of resume.identity compared there
            return {
                "strategy": {"name": ident["strategy"], "zero_stage": ident["zero_stage"]},
                "world_size": ident["world_size"],
            }

        if not needs_conversion(as_meta(saved), as_meta(now)):
            return folder, False
        converted = converted_folder(folder)
        if not checkpoint.is_complete(converted):
            raise RuntimeError(
                f"{folder} was written at world size {saved.get('world_size')} and ZeRO-"
                f"{saved.get('zero_stage')}; its universal conversion {converted} is not complete"
            )
        return converted, True

    def files_to_load(self, folder: Path) -> list[Path]:
        """This rank's model states (ZeRO-3: its partition) and optimizer shard; from a
        universal conversion, the model states it copied (every parameter's folder is
        listed, with its size, in the conversion's meta.json)."""
        source, universal = self._source(folder)
        if universal:
            return sorted(source.glob("*model_states.pt"))
        parent, tag = str(folder.parent), folder.name
        files = [Path(self.engine._get_ckpt_name(parent, tag))]
        if self.stage > 0:
            files.append(Path(self.engine._get_zero_ckpt_name(parent, tag)))
        return files

    def load(self, folder: Path) -> None:
        source, universal = self._source(folder)
        if self.stage > 0 and not universal:
            shard = Path(self.engine._get_zero_ckpt_name(str(folder.parent), folder.name))
            if not shard.is_file():
                raise FileNotFoundError(f"{shard} is missing")
        # DeepSpeed reads `checkpoint.load_universal` from its config at load time only:
        # set for this load, so that the checkpoints this run writes stay ordinary ones.
        config = self.engine._config
        config.load_universal_checkpoint = universal
        try:
            path, _ = self.engine.load_checkpoint(
                str(source.parent),
                tag=source.name,
                load_optimizer_states=True,
                load_lr_scheduler_states=False,
            )
        finally:
            config.load_universal_checkpoint = False
        if path is None:
            raise RuntimeError(f"DeepSpeed could not load {source}")

    # -- the end -------------------------------------------------------------------------
    def close(self) -> None:
        if self.comm_timer is not None:
            self.comm_timer.uninstall()
            if self.rt.is_main:
                self.comm_timer.write_summary(self.rt.run_dir, self.rt.rank)
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.destroy()
            restore_torch_linear()
        self.module = None
        self.optimizer = None
