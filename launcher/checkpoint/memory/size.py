"""How often the memory tier writes and how much room it takes: its interval as the config
and torchrun set it, its bytes per rank and per node as each engine declares them, what it
puts in /dev/shm, and whether a node's /dev/shm holds it beside the DataLoader workers'
batches. The plan, the preflight, the doctor and the renderers size it with these
functions; the job asks `room` once per node at the start."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from launcher.config.model_shape import param_count
from launcher.config.registry import engine
from launcher.data.shm import human_bytes, loader_shm_need

# Steps between two memory checkpoints when trainer.memory_checkpoint_interval is null and
# torchrun restarts the job: a restart then redoes at most 10 steps; the measured cost at
# the default job's shape is in docs/checkpoints.md.
DEFAULT_INTERVAL = 10
AUTO = "auto"  # trainer.memory_checkpoint_interval=auto, trainer.checkpoint_interval=auto
KEEP = 1  # complete memory checkpoints kept per rank (a second one exists while one is written)
SHM = Path("/dev/shm")


def restarts_from_env() -> int:
    """torchrun's --max-restarts, as its agent tells every worker (0 outside torchrun)."""
    try:
        return int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0)
    except ValueError:
        return 0


def interval(cfg, restarts: int | None = None) -> int:
    """trainer.memory_checkpoint_interval as it applies to `cfg` at the start: null means
    DEFAULT_INTERVAL where torchrun restarts the job (`restarts`, else this process's
    torchrun) and the engine can write the tier, 0 otherwise; `auto` turns it on at
    DEFAULT_INTERVAL for sizing (the run saves at Young's interval from its measured copy
    time, launcher.checkpoint.cadence)."""
    chosen = cfg.trainer.memory_checkpoint_interval
    if chosen == AUTO:
        return DEFAULT_INTERVAL
    if chosen is not None:
        return int(chosen)
    restarts = restarts_from_env() if restarts is None else restarts
    able = engine(cfg.strategy.name).memory_checkpoint is not None
    return DEFAULT_INTERVAL if restarts > 0 and able else 0


def asked(cfg) -> bool:
    """Whether the user asked for the tier (a number or auto), rather than leaving it to
    its default: a tier asked for that does not fit is refused, a default one turned off."""
    return cfg.trainer.memory_checkpoint_interval is not None


def state_bytes(cfg, world_size: int = 1) -> int:
    """One rank's memory checkpoint, estimated by its engine from the model's shape: the
    whole model and optimizer state (DDP), or this rank's shard of it at `world_size` (FSDP2,
    DeepSpeed's partitions; the default 1 is the largest a rank can need)."""
    tier = engine(cfg.strategy.name).memory_checkpoint
    return tier.size(cfg, param_count(cfg.model), world_size) if tier else 0


def node_state_bytes(cfg, procs_per_node: int, world_size: int) -> int:
    """One memory checkpoint on one node of `procs_per_node` ranks: the state every rank
    holds alike once (its ranks write a part each, launcher.checkpoint.memory.node_share),
    the state each rank holds alone once per rank."""
    one = state_bytes(cfg, world_size)
    tier = engine(cfg.strategy.name).memory_checkpoint
    return one if tier and tier.replicated else one * procs_per_node


def in_shm(cfg) -> bool:
    root = Path(cfg.trainer.memory_checkpoint_dir).expanduser()
    return root == SHM or SHM in root.parents


def shm_bytes(
    cfg, procs_per_node: int, world_size: int | None = None, restarts: int | None = None
) -> int:
    """What the tier puts in /dev/shm on one node of `procs_per_node` ranks of `world_size`
    (default: that node alone): the kept checkpoint and the one being written, and as much
    again for the node before's with trainer.memory_checkpoint_peer (0 when the tier is off
    or writes elsewhere)."""
    if not interval(cfg, restarts) or not in_shm(cfg):
        return 0
    own = (KEEP + 1) * node_state_bytes(cfg, procs_per_node, world_size or procs_per_node)
    # Peer copies: the ward node's kept copy, and the next one while it is received.
    return own * 2 if cfg.trainer.memory_checkpoint_peer else own


def held_bytes(node_folder: Path) -> int:
    """Bytes this run's tier already holds on this node (an earlier launch's checkpoints,
    which this launch's replace): room the tier has besides the free space."""
    total = 0
    for dirpath, _, files in os.walk(node_folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def room(
    cfg, ranks_per_node: int, world_size: int, free: int, restarts: int | None = None
) -> str | None:
    """None when the memory tier fits on a node whose /dev/shm has `free` bytes for this
    run, beside its DataLoader workers' batches (or is off, or writes elsewhere); else the
    line that says why not: for a tier left to its default (trainer.memory_checkpoint_
    interval=null), that it is turned off; for one asked for, the refusal."""
    tier = shm_bytes(cfg, ranks_per_node, world_size, restarts)
    loaders = loader_shm_need(cfg) * ranks_per_node
    if not tier or loaders + tier <= free:
        return None
    state = node_state_bytes(cfg, ranks_per_node, world_size)
    what = (
        f"the memory tier needs {human_bytes(tier)} of /dev/shm on a node of {ranks_per_node} "
        f"rank(s) ({tier // state} copies of {human_bytes(state)} of state) and the DataLoader "
        f"workers {human_bytes(loaders)}, but /dev/shm has {human_bytes(free)} for them"
    )
    key = f"trainer.memory_checkpoint_interval={cfg.trainer.memory_checkpoint_interval}"
    if not asked(cfg):
        return f"memory tier off: {what}; durable checkpoints only (docs/checkpoints.md)"
    return (
        f"{key}: {what}; give /dev/shm more room, set trainer.memory_checkpoint_dir to a "
        "larger node-local memory file system, or trainer.memory_checkpoint_interval=0"
    )
