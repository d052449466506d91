"""One node's memory, as every cluster renderer requests it: what its processes use
outside /dev/shm (the plan's host memory for the job, launcher.plan.host.node_processes,
with PROCESS_MARGIN on top; or the user's figure, which may not be less than the plan's)
plus what /dev/shm must hold for its ranks (the DataLoader workers' batches and the memory
tier's copies, launcher.plan.memory.shm_need) plus a margin for NCCL's shared-memory
transport and the like.

A Kubernetes pod's memory request and limit and a Slurm job's --mem are this one sum, so a
change to how the plan counts host memory or /dev/shm reaches both through `node_memory`
alone, and the request grows with the model where the host holds more of it (on the CPU,
offloaded, in a checkpoint's copy).
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.config import ConfigError
from launcher.plan.host import node_processes
from launcher.plan.memory import shm_need
from launcher.submit.job import SubmitJob

# On top of the plan's figure when the request is sized from it: the plan is within 15% of
# the peaks benchmarks/host_memory.py measures; a peak above its figure is an OOM kill.
PROCESS_MARGIN = 0.25
GIB = 2**30


@dataclass(frozen=True)
class NodeMemory:
    """Bytes one node (one pod) needs."""

    processes: int  # what its processes get besides /dev/shm (given, or the plan's + margin)
    processes_need: int  # the plan's figure for them (the largest sweep point)
    shm_need: int  # /dev/shm its ranks fill: loaders and memory tier, the largest sweep point
    shm_margin: int  # on top of the need in /dev/shm (NCCL's shared-memory transport etc.)

    @property
    def shm(self) -> int:
        """/dev/shm's size: the need and the margin."""
        return self.shm_need + self.shm_margin

    @property
    def total(self) -> int:
        return self.processes + self.shm


def processes_need(job: SubmitJob, restarts: int) -> int:
    """Host memory one node's processes need besides /dev/shm (launcher.plan.host), each
    sweep point at the job's world size and ranks per node; the largest."""
    world = job.nodes * job.procs_per_node
    on_gpu = int(job.cluster.gpus_per_node) > 0
    points = job.points or [job.cfg]
    return max(node_processes(p, job.procs_per_node, world, on_gpu, restarts) for p in points)


def node_memory(
    job: SubmitJob, restarts: int, shm_margin: int, given: tuple[str, int] | None = None
) -> NodeMemory:
    """The node's memory for `job` (`restarts`: torchrun's --max-restarts on the cluster,
    which the memory tier's default follows). `given`: the user's figure for the node's
    processes, (how they wrote it, bytes); None: the plan's with PROCESS_MARGIN on top. A
    figure below the plan's need is refused: the node would be killed for memory."""
    world = job.nodes * job.procs_per_node
    points = job.points or [job.cfg]
    need = processes_need(job, restarts)
    if given is not None and given[1] < need:
        raise ConfigError(
            f"{given[0]} is less than the {need / GIB:.1f} GiB the job's processes need on a "
            f"node (launcher.plan: {job.procs_per_node} rank(s) at their peak and their "
            "DataLoader workers; docs/plan.md, Host memory); raise it, or leave it null to "
            "have it sized from the plan"
        )
    processes = given[1] if given is not None else int(need * (1 + PROCESS_MARGIN))
    shm = max(shm_need(p, job.procs_per_node, world, restarts) for p in points)
    return NodeMemory(processes=processes, processes_need=need, shm_need=int(shm),
                      shm_margin=int(shm_margin))  # fmt: skip
