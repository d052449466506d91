"""In-process helpers of the unit tests: a real one-rank gloo group, the trainer section as
the loop gets it, and float equality up to rounding."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from launcher.config import TrainerConfig

CPU = torch.device("cpu")


@pytest.fixture
def gloo_world():
    """A real one-rank gloo process group for the test, destroyed afterwards."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        # Every piece of work the test issued done first: a gloo group destroyed while one
        # of its threads still completes a future once aborted the worker (a thread joined
        # from itself: "Resource deadlock avoided").
        dist.barrier()
        dist.destroy_process_group()


def approx(x: float):
    """Equal up to float rounding: the figures are sums of a few binary fractions."""
    return pytest.approx(x, rel=1e-12, abs=1e-12)


def trainer(**overrides):
    """The trainer section as the loop gets it: the real schema, validated by OmegaConf."""
    return OmegaConf.structured(TrainerConfig(**overrides))


@pytest.fixture
def restored_logging():
    """The root logger's handlers and level as they were: an in-process front door that
    gets as far as joining the job sets up console logging on the stream pytest captured
    for that test, which a later test's log record would meet closed ("Logging error")."""
    import logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
