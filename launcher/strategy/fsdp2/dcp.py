"""Distributed Checkpoint (DCP) folders, as FSDP2 writes them, read into a sharded model (at
any world size) or a whole one (a DDP replica on every rank), or gathered for export.

`torch.distributed.checkpoint` is imported only to read one: it takes 1-3 s to import.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch


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


def incomplete(folder: Path) -> str | None:
    """DCP's own completeness check of a folder (the format reader's optional entry, asked
    before a save whose seal never ran is sealed): `.metadata` reads, and every byte range
    it maps a tensor to lies within a shard file that is there. None when complete."""
    from torch.distributed.checkpoint import FileSystemReader

    try:
        metadata = FileSystemReader(str(folder)).read_metadata()
    except Exception as exc:  # noqa: BLE001 - any unreadable .metadata: not complete
        return f"its .metadata is unreadable ({type(exc).__name__})"
    sizes: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        end = info.offset + info.length
        sizes[info.relative_path] = max(sizes.get(info.relative_path, 0), end)
    for name, needed in sorted(sizes.items()):
        path = folder / name
        have = path.stat().st_size if path.is_file() else None
        if have is None or have < needed:
            return f"{name} {'is missing' if have is None else f'has {have} of {needed} bytes'}"
    return None


def load_into(folder: Path, model, optimizer, load_whole) -> None:
    """The format reader's entry (launcher.config.registry.Format): DCP reshards into the
    model as it is, so the engine's `load_whole` is not needed."""
    load_dcp(model, optimizer, folder)


def weights(folder: Path) -> dict[str, torch.Tensor]:
    """The whole model's state dict: the shards gathered into one file, on the CPU."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(folder, Path(tmp) / "whole.pt")
        return torch.load(Path(tmp) / "whole.pt", map_location="cpu", weights_only=False)["model"]
