"""The memory tier: every rank's state (its shard, for a sharded engine) in node-local memory
every few steps, so that a rank or a node lost between two durable checkpoints costs about
`trainer.memory_checkpoint_interval` steps once the job restarts (docs/checkpoints.md, "The
memory tier").

The tier is this package and nothing else: how often and how much (`size`), one rank's
writes and a restart's search by node and step (`tier`, `recovery`), folders sent between
nodes (`peers`), state held once per node (`node_share`). A job makes one call, `open_tier`;
the plan, preflight, doctor and renderers size it with `size`'s functions, named here.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from launcher.checkpoint.memory.size import (
    AUTO,
    DEFAULT_INTERVAL,
    SHM,
    asked,
    held_bytes,
    in_shm,
    interval,
    node_state_bytes,
    room,
    shm_bytes,
    state_bytes,
)
from launcher.checkpoint.resume import identity
from launcher.config import ConfigError
from launcher.runtime.disk import shm_available_bytes
from launcher.runtime.placement import ranks_per_node

if TYPE_CHECKING:
    from launcher.checkpoint.memory.tier import MemoryTier
    from launcher.runtime.process import Runtime

__all__ = [
    "AUTO",
    "DEFAULT_INTERVAL",
    "SHM",
    "MemoryTier",
    "asked",
    "in_shm",
    "interval",
    "node_state_bytes",
    "open_tier",
    "rank_folder",
    "room",
    "shm_bytes",
    "state_bytes",
]

log = logging.getLogger("launcher")

_IN_TIER = ("MemoryTier", "node_folder", "rank_folder")


def __getattr__(name: str):
    """The tier's writer and its folders load on first use: they need torch, and the plan,
    preflight and the renderers import this package for its sizes alone."""
    if name in _IN_TIER:
        from launcher.checkpoint.memory import tier

        return getattr(tier, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_tier(cfg, rt: Runtime, model) -> MemoryTier | None:
    """This rank's memory tier when it is on and its node's /dev/shm holds it, every rank
    agreeing: a tier asked for that does not fit on some node is refused (ConfigError, the
    one line), one left to its default is turned off with one warning."""
    from launcher.checkpoint.memory.tier import MemoryTier, node_folder

    every = interval(cfg)
    if not every:
        return None
    t = cfg.trainer
    if in_shm(cfg):
        free = (shm_available_bytes() or (0, 0))[1] + held_bytes(node_folder(
            t.memory_checkpoint_dir, rt.run_dir))  # fmt: skip
        verdicts = rt.all_gather_objects(room(cfg, ranks_per_node(), rt.world_size, free))
        why = next((w for w in verdicts if w), None)
        if why and asked(cfg):
            raise ConfigError(why)
        if why:
            if rt.is_main:
                log.warning("%s", why)
            return None
    if rt.is_main and t.memory_checkpoint_interval != AUTO:  # else the cadence's line says
        log.info("memory tier: every %d steps, in %s", every, t.memory_checkpoint_dir)
    return MemoryTier(t.memory_checkpoint_dir, every, rt,
                      identity(cfg, model, rt.world_size), t.memory_checkpoint_peer)  # fmt: skip
