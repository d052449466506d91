"""Where this process sits in the job, read from the environment: its rank, the node's
rank count, the node's name, the launch's id. No torch: the front doors that only plan,
render or list runs (plan, submit, runs) use these too and start without it.
"""

from __future__ import annotations

import os
import socket

from launcher.config import backends


def env_world() -> tuple[int, int, int]:
    """(rank, local_rank, world_size) as torchrun, srun wrappers or pods set them."""
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", 0)))
    return rank, local, world


def ranks_per_node() -> int:
    """Processes on this node: what /dev/shm is shared between."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", env_world()[2]))


def ranks_text(ranks) -> str:
    """Ranks as runs, as a line names them: [4, 5, 6, 7, 9] -> '4-7, 9'."""
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return ", ".join(f"{g[0]}-{g[-1]}" if len(g) > 1 else str(g[0]) for g in runs)


def node_name() -> str:
    """This node as the scheduler names it: Slurm's node name (what --exclude takes), the
    Kubernetes node (NODE_NAME, set from the pod's spec.nodeName), else the hostname."""
    return os.environ.get("SLURMD_NODENAME") or os.environ.get("NODE_NAME") or socket.gethostname()


def launch_key() -> str | None:
    """An id that every rank of this launch shares and a restart of it keeps, if any."""
    scheduled = backends.job_key(os.environ)  # a cluster backend's job id (Slurm's)
    if scheduled:
        return scheduled
    elastic = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if elastic and elastic != "none":
        return elastic
    return None
