"""One node's memory, as every cluster renderer requests it: what its processes use
outside /dev/shm (the user's figure) plus what /dev/shm must hold for its ranks (the
DataLoader workers' batches and the memory tier's copies, launcher.plan.memory.shm_need)
plus a margin for NCCL's shared-memory transport and the like.

A Kubernetes pod's memory request and limit and a Slurm job's --mem are this one sum, so a
change to how the /dev/shm need is computed reaches both through `node_memory` alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.plan.memory import shm_need
from launcher.submit.job import SubmitJob


@dataclass(frozen=True)
class NodeMemory:
    """Bytes one node (one pod) needs."""

    processes: int  # the processes besides /dev/shm (cluster.k8s.memory, ...mem_per_process)
    shm_need: int  # /dev/shm its ranks fill: loaders and memory tier, the largest sweep point
    shm_margin: int  # on top of the need in /dev/shm (NCCL's shared-memory transport etc.)

    @property
    def shm(self) -> int:
        """/dev/shm's size: the need and the margin."""
        return self.shm_need + self.shm_margin

    @property
    def total(self) -> int:
        return self.processes + self.shm


def node_memory(job: SubmitJob, restarts: int, processes: int, shm_margin: int) -> NodeMemory:
    """The node's memory for `job` (`restarts`: torchrun's --max-restarts on the cluster,
    which the memory tier's default follows). Every sweep point is sized at the job's world
    size and ranks per node (shm_need is a node's figure); the largest is the
    node's."""
    world = job.nodes * job.procs_per_node
    points = job.points or [job.cfg]
    need = max(shm_need(p, job.procs_per_node, world, restarts) for p in points)
    return NodeMemory(processes=int(processes), shm_need=int(need), shm_margin=int(shm_margin))
