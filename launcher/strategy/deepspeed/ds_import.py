"""Importing deepspeed the one way the launcher does: for the device the runtime chose,
without compiling anything, with its per-call deprecation noise silenced. Only the
DeepSpeed strategy and its checkpoint conversion import it, and only when chosen."""

from __future__ import annotations

import logging
import warnings

import torch


def import_deepspeed():
    """Import deepspeed, without compiling anything.

    DeepSpeed picks its accelerator when first imported, from DS_ACCELERATOR, which the
    runtime set from the device it chose. Its torch backend would build a shared-memory
    all-reduce op with a C++ compiler at start-up; that op serves only inference
    all-reduces, so it is marked incompatible: training needs no compiler.
    """
    import deepspeed
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    # ZeRO calls torch's all_gather_into_tensor and reduce_scatter_tensor, which torch 2.13
    # deprecates (a warning per process and call site, not per step): noise in the logs.
    warnings.filterwarnings(
        "ignore", message=r"`torch\.distributed\.\w+` is deprecated", category=FutureWarning
    )
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    deepspeed.utils.logger.setLevel(logging.WARNING)
    return deepspeed


def restore_torch_linear() -> None:
    """Undo the one patch DeepSpeed leaves in torch after its engine is gone.

    ZeRO-3 (with `memory_efficient_linear`, on by default) replaces
    `torch.nn.functional.linear` with its own autograd function and never restores it: a
    later job of the same process, a sweep's next point, would run every `nn.Linear`
    through DeepSpeed's linear and round differently from the same job run alone (an FSDP2
    point after a ZeRO-3 one lost bit-exact resume). DeepSpeed keeps the original as
    `linear_bk` and patches again only when it finds the original in place.
    """
    from deepspeed.runtime.zero.partition_parameters import InsertPostInitMethodToModuleSubClasses

    original = getattr(InsertPostInitMethodToModuleSubClasses, "linear_bk", None)
    if original is not None:
        torch.nn.functional.linear = original
