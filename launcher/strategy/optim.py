"""The optimizer every strategy hands its engine: one definition, so that DDP, DeepSpeed and
FSDP2 train the same math."""

from __future__ import annotations

import torch

from launcher.config.schema import TrainerConfig


def build_optimizer(model: torch.nn.Module, tcfg: TrainerConfig):
    """AdamW with weight decay on matrices only (biases and LayerNorm gains are not decayed).

    `trainer.fused_adamw` runs the whole update as one fused kernel per parameter group
    instead of PyTorch's multi-tensor ("foreach") loop: fewer launches on a GPU.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": tcfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        groups,
        lr=tcfg.lr,
        betas=(tcfg.beta1, tcfg.beta2),
        fused=tcfg.fused_adamw,
    )
