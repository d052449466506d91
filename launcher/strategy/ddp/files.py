"""DDP's checkpoint format read by any engine: `model.pt` (the whole model's state dict) and
`optimizer.pt` (the AdamW state keyed by position, and the loss scaler), written by rank 0.

The file names are declared here, where they are read; DDP's declaration (its format's
marker) and its engine (which writes them) import them. torch is imported when a checkpoint
is read, so the declaration stays free of it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# Whole model and optimizer: DDP keeps every rank's identical, so rank 0 writes them.
FILES = ("model.pt", "optimizer.pt")


def load_into(folder: Path, model, optimizer, load_whole) -> None:
    """The whole state, handed to the loading engine's `load_whole(model_sd, optim_sd)`."""
    import torch

    model_sd = torch.load(folder / FILES[0], map_location="cpu", weights_only=True)
    saved = torch.load(folder / FILES[1], map_location="cpu", weights_only=True)
    load_whole(model_sd, saved["optimizer"])


def weights(folder: Path) -> dict[str, torch.Tensor]:
    import torch

    return torch.load(folder / FILES[0], map_location="cpu", weights_only=True)
