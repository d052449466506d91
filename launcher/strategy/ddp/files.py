"""DDP's checkpoint format read by any engine: `model.pt` (the whole model's state dict) and
`optimizer.pt` (the AdamW state keyed by position, and the loss scaler), written by rank 0."""

from __future__ import annotations

from pathlib import Path

import torch

from launcher.strategy.ddp import FILES


def load_into(folder: Path, model, optimizer, load_whole) -> None:
    """The whole state, handed to the loading engine's `load_whole(model_sd, optim_sd)`."""
    model_sd = torch.load(folder / FILES[0], map_location="cpu", weights_only=True)
    saved = torch.load(folder / FILES[1], map_location="cpu", weights_only=True)
    load_whole(model_sd, saved["optimizer"])


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return torch.load(folder / FILES[0], map_location="cpu", weights_only=True)
