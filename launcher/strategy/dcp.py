"""Distributed Checkpoint (DCP) folders, as FSDP2 writes them: recognised, and loaded into
a sharded model (at any world size) or a whole one (a DDP replica on every rank).

`torch.distributed.checkpoint` is imported only to load one: it takes 1-3 s to import, and
DDP, which recognises DCP folders to resume from an FSDP2 run, imports this module on
every start.
"""

from __future__ import annotations

from pathlib import Path

import torch

DCP_METADATA = ".metadata"  # what DCP writes last (rank 0): marks a DCP checkpoint


def is_dcp_checkpoint(folder: Path) -> bool:
    return (folder / DCP_METADATA).is_file()


def load_dcp(model: torch.nn.Module, optimizer, folder: Path) -> None:
    """A DCP checkpoint into `model` and `optimizer`, sharded (FSDP2, at any world size) or
    whole (a DDP replica on every rank): DCP reads each rank's part of every tensor."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=folder)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
