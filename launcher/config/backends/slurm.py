"""The `slurm` backend: `python -m launcher.submit slurm` renders an sbatch script
(launcher.submit.slurm); its keys are `cluster.slurm.*` (docs/slurm.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from launcher.config.backends import Backend
from launcher.config.ranges import AT_LEAST_1, NON_NEGATIVE, POSITIVE, Range, one_of, ranged

# srun --cpu-bind's policies a job may ask for (Slurm's task/affinity or task/cgroup applies
# them; a cluster without says so once and runs unbound)
CPU_BINDS = ("cores", "threads", "sockets", "ldoms", "none")


@dataclass
class SlurmConfig:
    """sbatch settings (cluster=slurm); see docs/slurm.md. A null leaves the choice to the
    cluster's defaults (no `#SBATCH` line is written for it)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    cpus_per_task: int | None = ranged(None, AT_LEAST_1)  # null: processes x (1 + data.num_workers)
    # srun --cpu-bind: the node's one task (torchrun and its ranks) held to the job's CPUs
    # (cores), or placement left to the kernel (none); docs/slurm.md
    cpu_bind: str = one_of("cores", CPU_BINDS)
    # per node, as sbatch takes it: 500G, 0 (all of the node's); null: exclusive=true asks
    # for all of it (--mem=0), else the job's need (its processes + /dev/shm)
    mem: str | None = None
    # host memory a rank and its loader workers use besides /dev/shm; null: the plan's
    # (launcher.plan.host, with a margin); a figure below the plan's need is refused
    mem_per_process: str | None = None
    shm_margin: str = "1G"  # in --mem on top of /dev/shm's need: NCCL's shared memory etc.
    exclusive: bool = False  # whole nodes: --exclusive, and --mem=0 unless mem is given
    constraint: str | None = None
    gpu_request: str = "gpus-per-node"  # or gres: --gres=gpu:N (clusters without cons_tres)
    extra_sbatch: list[str] = field(default_factory=list)  # more `#SBATCH` options, verbatim
    container_image: str | None = None  # an image (pyxis/enroot) or .sif file (apptainer)
    container_runtime: str = "pyxis"  # pyxis (srun --container-image), apptainer, singularity
    container_name: str | None = None  # pyxis --container-name; null: one per image
    container_mounts: list[str] = field(default_factory=list)  # more than the ones made
    modules: list[str] = field(default_factory=list)  # `module load` each, in order
    # more variables of the submitting shell to pass to the job (sbatch --export), by name
    export: list[str] = field(default_factory=list)
    resv_ports: bool = False  # rendezvous on a port Slurm reserves (srun --resv-ports; MpiParams)
    venv: str | None = None  # a virtual environment to activate on every node
    # Slurm warns (USR1) this long before the time limit
    signal_lead_s: int = ranged(300, AT_LEAST_1)
    requeue: bool = True  # on the warning or a hang: requeue while the checkpoint advances
    # requeues of one job (SLURM_RESTART_COUNT); null: no cap
    max_requeues: int | None = ranged(20, NON_NEGATIVE)
    # rendezvous port: cluster.rdzv_port + job id mod this
    rdzv_port_range: int = ranged(
        1000, Range(low=1, high=64535, why="ports above cluster.rdzv_port")
    )
    # a measured step time: checks time_limit (docs/slurm.md)
    step_time_s: float | None = ranged(None, POSITIVE)
    # one checkpoint write; null: estimated (docs)
    checkpoint_write_s: float | None = ranged(None, NON_NEGATIVE)
    # write bandwidth one rank reaches to run.root (measure yours)
    checkpoint_write_mb_s: float = ranged(100, POSITIVE)


def job_key(environ: Mapping[str, str]) -> str | None:
    """Slurm's job id (and array task) of the job this process runs in."""
    if not environ.get("SLURM_JOB_ID"):
        return None
    array = environ.get("SLURM_ARRAY_TASK_ID")
    return f"slurm{environ['SLURM_JOB_ID']}" + (f"_{array}" if array else "")


BACKEND = Backend(
    name="slurm",
    summary="an sbatch script",
    tool="sbatch",
    docs="docs/slurm.md",
    secret_way="export it in the shell you submit from and name it in cluster.secrets=[NAME]: "
    "the job gets it by name (sbatch --export)",
    schema=SlurmConfig,
    shell_text=("modules", "extra_sbatch", "container_mounts"),
    # squeue, sacct and scontrol show every user a job's options (its --comment among them)
    public_text=("extra_sbatch", "partition", "account", "qos", "constraint"),
    job_key=job_key,
    stop_window="signal_lead_s",
)
