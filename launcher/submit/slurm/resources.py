"""What an sbatch script asks of the cluster, checked before it is written: each
`cluster.slurm.*` value sbatch would misread or that cannot work refused in one line, the
CPUs and memory a node's processes need (`--cpus-per-task`, `--mem`: the same sum as a pod's
memory request, launcher.submit.node_memory), the time limit against Slurm's warning."""

from __future__ import annotations

import re
from pathlib import Path

from omegaconf import DictConfig

from launcher.config import ConfigError
from launcher.config.backends.slurm import BACKEND
from launcher.submit import stop_time
from launcher.submit.job import SubmitJob, check_interval_fits, time_limit_s, visible
from launcher.submit.node_memory import NodeMemory, node_memory

# Slurm checks time limits periodically and may send the warning this much early.
SIGNAL_EARLY_S = 60
CONTAINER_RUNTIMES = ("pyxis", "apptainer", "singularity")
MIB = 2**20
MAX_SIGNAL_LEAD_S = 65535  # sbatch --signal takes at most 16 bits of seconds
GPU_REQUESTS = ("gpus-per-node", "gres")
_PLAIN = re.compile(r"^[^\s'\"\\`$;]+$")  # a value an #SBATCH line can carry as it is
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([KMGT]?)B?$", re.IGNORECASE)  # sbatch --mem's sizes
VARIABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check(job: SubmitJob) -> None:
    """Reject settings sbatch would misread or that cannot work; one line each."""
    c, s, t = job.cluster, job.cluster.slurm, job.cfg.trainer
    for key in ("partition", "account", "qos", "mem", "constraint", "container_image"):
        _plain(f"cluster.slurm.{key}", s[key])
    _plain("cluster.job_name", job.job_name)
    if s.gpu_request not in GPU_REQUESTS:
        raise ConfigError(
            f"cluster.slurm.gpu_request={s.gpu_request}: not one of {', '.join(GPU_REQUESTS)} "
            "(gres: --gres=gpu:N, for clusters without select/cons_tres)"
        )
    last_port = c.rdzv_port + s.rdzv_port_range - 1
    if s.rdzv_port_range < 1 or not 1024 <= c.rdzv_port <= last_port <= 65535:
        raise ConfigError(
            f"cluster.rdzv_port={c.rdzv_port} with cluster.slurm.rdzv_port_range="
            f"{s.rdzv_port_range}: the ports {c.rdzv_port}..{last_port} must lie within "
            "1024..65535 (the job uses rdzv_port + job id mod rdzv_port_range)"
        )
    _check_cpus(job)
    stop_time.check_stop_window(job, BACKEND)
    _check_memory(job)
    if s.container_runtime not in CONTAINER_RUNTIMES:
        raise ConfigError(
            f"cluster.slurm.container_runtime={s.container_runtime}: not one of "
            f"{', '.join(CONTAINER_RUNTIMES)}"
        )
    for name in s.export:
        if not VARIABLE_NAME.match(str(name)):
            raise ConfigError(
                f"cluster.slurm.export: {name!r} is not a variable name; give names only "
                "(their values stay in the submitting shell)"
            )
    if s.venv is not None and visible(s.venv, job.workdir):
        activate = Path(s.venv).expanduser() / "bin" / "activate"
        if not activate.is_file():
            raise ConfigError(
                f"cluster.slurm.venv={s.venv}: {activate} does not exist; give the folder "
                "of a virtual environment (python -m venv makes one)"
            )
    if s.max_requeues is not None and s.max_requeues < 0:
        raise ConfigError(f"cluster.slurm.max_requeues={s.max_requeues}: must be 0 or more")
    if not 1 <= s.signal_lead_s <= MAX_SIGNAL_LEAD_S:
        raise ConfigError(
            f"cluster.slurm.signal_lead_s={s.signal_lead_s}: must be within 1..{MAX_SIGNAL_LEAD_S}"
        )
    for line in s.extra_sbatch:
        if "\n" in line or not line.strip().removeprefix("#SBATCH").strip().startswith("-"):
            raise ConfigError(
                f"cluster.slurm.extra_sbatch: {line!r} is not an sbatch option; "
                "give options such as --reservation=big or --mail-type=END, one per item"
            )
    for line in list(c.setup) + list(s.modules):
        if "\n" in line:
            raise ConfigError(f"cluster.setup/cluster.slurm.modules: {line!r} spans lines")
    if job.cfg.dist.backend == "nccl" and not c.gpus_per_node:
        raise ConfigError(
            "dist.backend=nccl needs GPUs but cluster.gpus_per_node=0; give the GPUs per node, "
            "or use dist.backend=auto (gloo on CPU-only partitions)"
        )
    if c.time_limit is not None:
        _check_time_limit(str(c.time_limit), s, t)


def cpus_per_task(job: SubmitJob) -> int:
    """cluster.slurm.cpus_per_task, else what one node's processes use: each rank and each
    of its DataLoader workers (one CPU each), as a pod's CPU request."""
    given = job.cluster.slurm.cpus_per_task
    return int(given) if given is not None else job.cpu_need


def slurm_bytes(text: str, key: str) -> int:
    """A size as sbatch --mem takes it (500G, 1.5T, 4096 = MiB) in bytes; ConfigError if not."""
    m = _SIZE.match(str(text).strip())
    if not m:
        raise ConfigError(f"{key}={text!r}: not a size sbatch takes; write e.g. 8G, 500M, 0")
    unit = {"": 1, "K": 2**-10, "M": 1, "G": 2**10, "T": 2**20}[m.group(2).upper()]
    return int(float(m.group(1)) * unit * MIB)


def job_memory(job: SubmitJob) -> NodeMemory:
    """The node's need (node_memory, the same sum as a pod's memory request): its processes
    (processes x cluster.slurm.mem_per_process, or the plan's), the /dev/shm need,
    cluster.slurm.shm_margin. Slurm does not restart torchrun's workers (--max-restarts 0):
    the memory tier keeps its default."""
    s = job.cluster.slurm
    margin = slurm_bytes(s.shm_margin, "cluster.slurm.shm_margin")
    given = None
    if s.mem_per_process is not None:
        per_process = slurm_bytes(s.mem_per_process, "cluster.slurm.mem_per_process")
        given = (f"cluster.slurm.mem_per_process={s.mem_per_process} (x {job.procs_per_node} "
                 "process(es))", per_process * job.procs_per_node)  # fmt: skip
    return node_memory(job, 0, margin, given)


def mem_option(job: SubmitJob) -> str:
    """--mem's value: cluster.slurm.mem; else 0 (the whole node's) with exclusive=true;
    else the job's need in MiB, rounded up."""
    s = job.cluster.slurm
    if s.mem is not None:
        return str(s.mem)
    if s.exclusive:
        return "0"
    return f"{-(-job_memory(job).total // MIB)}M"


def _check_memory(job: SubmitJob) -> None:
    """A given --mem must hold /dev/shm's need (refused) and should hold the whole need
    (warned); 0, or null (computed), always does."""
    s = job.cluster.slurm
    need = job_memory(job)
    if s.mem is None or str(s.mem) == "0":
        return
    given = slurm_bytes(s.mem, "cluster.slurm.mem")
    if given < need.shm:
        raise ConfigError(
            f"cluster.slurm.mem={s.mem} is less than the {need.shm // MIB} MiB /dev/shm alone "
            "needs per node (DataLoader workers, memory tier and cluster.slurm.shm_margin, "
            "docs/shared-memory.md); raise it, or leave it null to have it computed"
        )
    if given < need.total:
        job.warnings.append(
            f"cluster.slurm.mem={s.mem} is less than the {need.total // MIB} MiB the job needs "
            f"per node ({need.processes // MIB} MiB for its {job.procs_per_node} process(es) + "
            f"{need.shm // MIB} MiB of /dev/shm); leave it null to have it computed"
        )


def _check_cpus(job: SubmitJob) -> None:
    given = job.cluster.slurm.cpus_per_task
    if given is not None and given < 1:
        raise ConfigError(f"cluster.slurm.cpus_per_task={given}: must be at least 1")
    if given is not None and given < job.cpu_need:
        job.warnings.append(
            f"cluster.slurm.cpus_per_task={given} is less than the {job.cpu_need} CPUs the "
            f"node's {job.procs_per_node} process(es) and their data.num_workers DataLoader "
            "workers use (one each); where Slurm confines tasks to their CPUs they share "
            "these; leave it null to have it computed"
        )


def _check_time_limit(limit: str, s: DictConfig, t: DictConfig) -> None:
    total = time_limit_s(limit)
    usable = total - s.signal_lead_s - SIGNAL_EARLY_S
    if usable <= 0:
        raise ConfigError(
            f"cluster.time_limit={limit} ({total} s) leaves no time to train: Slurm warns "
            f"cluster.slurm.signal_lead_s={s.signal_lead_s} s (and up to {SIGNAL_EARLY_S} s "
            "more) before it; raise the time limit or lower signal_lead_s"
        )
    check_interval_fits(limit, usable, t, s.step_time_s, "cluster.slurm", "before Slurm's warning")


def _plain(key: str, value) -> None:
    if value is not None and not _PLAIN.match(str(value)):
        raise ConfigError(
            f"{key}={value!r}: sbatch cannot take spaces, quotes or $ here; give a plain value"
        )
