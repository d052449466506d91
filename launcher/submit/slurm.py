"""The experiment as an sbatch script: one torchrun per node through srun, c10d rendezvous
on the first node (on a port derived from the job id, or one Slurm reserves), and a
checkpoint-and-requeue when Slurm warns of a preemption (always) or of the time limit, or
the trainer detects a hang (for as long as each start advances the checkpoint), at most
cluster.slurm.max_requeues times.

Nothing secret is written into it: the job gets the submitting shell's variables by name
(--export), the trainer's overrides through a 0600 file rather than the ranks' command
lines, and --mem is the node's need as a pod's memory request is (node_memory).

The script is `templates/slurm.sbatch` with the job's values filled in; slurm/README.md
explains it line by line and docs/slurm.md explains the choices (the signal path above all).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

from omegaconf import DictConfig

from launcher.config import ConfigError
from launcher.config.backends.slurm import BACKEND
from launcher.config.secret_keys import is_secret_key
from launcher.data.cache import cache_root
from launcher.resilience import bad_hosts, exit_codes
from launcher.runtime.args_file import ARGS_FILE_ENV
from launcher.submit import slurm_exclude, stop_time
from launcher.submit.job import (
    FRONT_DOOR,
    SubmitJob,
    check_interval_fits,
    prepare,
    time_limit_s,
    visible,
)
from launcher.submit.node_memory import PROCESS_MARGIN, NodeMemory, node_memory

SCRIPT = "job.sbatch"
OUTPUT = "slurm-%j.out"  # in the submit/ folder; requeued runs append to the same file
# Slurm checks time limits periodically and may send the warning this much early.
SIGNAL_EARLY_S = 60
# After the first task of the step ends, srun waits this long before it ends the others:
# time for every node to finish a stop together, not so long that a crash lingers.
SRUN_WAIT_S = 60
# The checked-in example (slurm/job.sbatch): the default experiment on 2 nodes x 8 GPUs, with
# fixed paths and run id so that it renders the same everywhere. Regenerate it with
#   python -m launcher.submit.slurm --example > slurm/job.sbatch
EXAMPLE_OVERRIDES = [
    "cluster.nodes=2",
    "cluster.gpus_per_node=8",
    "trainer.global_batch_size=64",  # 16 ranks x micro-batch 4; the default 16 cannot split
    "nccl=infiniband",
    "cluster.time_limit=04:00:00",
    "cluster.workdir=/shared/launcher",
    "cluster.slurm.partition=gpu",
    "cluster.slurm.cpus_per_task=64",
    "cluster.slurm.mem=0",
    "cluster.slurm.exclusive=true",
    "cluster.slurm.venv=/shared/launcher/.venv",
    "run.root=/shared/runs",
    "run.id=example",
]
# pyxis (NVIDIA's SPANK plugin) adds this option to srun; without it srun refuses the job.
PYXIS_OPTION = "--container-image"
CONTAINER_RUNTIMES = ("pyxis", "apptainer", "singularity")
# What the job gets of the submitting shell's environment (sbatch --export, by name; Slurm
# adds its SLURM_* variables): what a shell and Python need, then cluster.slurm.export, and
# at submit the variables of that shell whose names name a secret (WANDB_API_KEY, HF_TOKEN).
EXPORT_BASE = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LC_ALL",
    "TERM",
    "TMPDIR",
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "SLURM_CONF",
)
MIB = 2**20
# The warning comes signal_lead_s (and up to SIGNAL_EARLY_S more) before the time limit; a
# USR1 with more time left than that, and this slack, is a preemption (or an operator's).
WARNING_SLACK_S = 60
# A failed setup line ends the job with the contract's bad-input code: a retry fails alike.
SETUP_FAILED_EXIT = 2
MAX_SIGNAL_LEAD_S = 65535  # sbatch --signal takes at most 16 bits of seconds
GPU_REQUESTS = ("gpus-per-node", "gres")
_PLAIN = re.compile(r"^[^\s'\"\\`$;]+$")  # a value an #SBATCH line can carry as it is
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([KMGT]?)B?$", re.IGNORECASE)  # sbatch --mem's sizes
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


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
        if not _NAME.match(str(name)):
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


def render(job: SubmitJob) -> dict[str, str]:
    """The sbatch script for `job`, checked; `{file name: text}`."""
    check(job)
    c, s = job.cluster, job.cluster.slurm
    fields = {
        "title": f"{job.job_name}: {job.nodes} node(s) x {job.procs_per_node} process(es), "
        f"run {job.run_id}",
        "sbatch": "\n".join([*(f"#SBATCH {opt}" for opt in sbatch_options(job)), *_notes(job)]),
        "setup": "\n".join(_setup_lines(job)),
        "setup_failed_exit": str(SETUP_FAILED_EXIT),
        "bad_node_exit": str(exit_codes.BAD_NODE),
        "node_lost_exit": str(exit_codes.NODE_LOST),
        "warning_window": str(s.signal_lead_s + SIGNAL_EARLY_S + WARNING_SLACK_S),
        "exports": "\n".join(
            f"export {name}={shlex.quote(value)}" for name, value in job.env().items()
        ),
        "shutdown_timeout": str(s.signal_lead_s),
        # with reserved ports the step's own, known only inside the step (_torchrun)
        "port": "reserved"
        if s.resv_ports
        else f"$(({c.rdzv_port} + SLURM_JOB_ID % {s.rdzv_port_range}))",
        "run_dir": shlex.quote(str(job.run_dir)),
        "policy": _policy(job),
        "output": shlex.quote(str(job.submit_dir)) + '/slurm-"$SLURM_JOB_ID".out',
        "args_env": ARGS_FILE_ENV,
        "args": json.dumps(job.train_overrides()),
        "srun_options": " ".join(_srun_options(job)),
        "torchrun": _torchrun(job),
        "in_launcher": _in_launcher(job),
        "requeue": _requeue_block(job),
    }
    template = resources.files("launcher.submit").joinpath("templates/slurm.sbatch").read_text()
    text = re.sub(r"\{\{(\w+)\}\}", lambda m: fields[m.group(1)], template)
    return {SCRIPT: text}


def sbatch_options(job: SubmitJob) -> list[str]:
    """The #SBATCH options, in the order slurm/README.md explains them."""
    c, s = job.cluster, job.cluster.slurm
    opts = [f"--job-name={job.job_name}"]
    opts += [f"--{k}={s[k]}" for k in ("partition", "account", "qos") if s[k] is not None]
    opts += [f"--nodes={job.nodes}", "--ntasks-per-node=1"]
    if c.gpus_per_node and s.gpu_request == "gres":
        opts.append(f"--gres=gpu:{c.gpus_per_node}")
    elif c.gpus_per_node:
        opts.append(f"--gpus-per-node={c.gpus_per_node}")
    opts.append(f"--cpus-per-task={cpus_per_task(job)}")
    opts.append(f"--mem={mem_option(job)}")
    if c.time_limit is not None:
        opts.append(f"--time={c.time_limit}")
    if s.exclusive:
        opts.append("--exclusive")
    if s.constraint is not None:
        opts.append(f"--constraint={s.constraint}")
    refused = bad_hosts.read(job.run_dir)  # what this run's earlier jobs keep off (bad_hosts)
    if refused:
        opts.append(f"--exclude={','.join(refused)}")
    opts += [
        f"--export={','.join(export_names(job))}",
        f"--signal=B:USR1@{s.signal_lead_s}",
        "--requeue" if s.requeue else "--no-requeue",
        "--open-mode=append",
        f"--output={job.submit_dir / OUTPUT}",
        f"--chdir={job.workdir}",
    ]
    opts += [line.strip().removeprefix("#SBATCH").strip() for line in s.extra_sbatch]
    return opts


def export_names(job: SubmitJob, environ: dict[str, str] | None = None) -> list[str]:
    """What the job gets of the submitting shell, by name: EXPORT_BASE, cluster.slurm.export,
    cluster.secrets, and (given the shell's `environ`, at submit) its variables named as
    secrets."""
    names = [*EXPORT_BASE, *map(str, job.cluster.slurm.export), *map(str, job.cluster.secrets)]
    names += sorted(n for n in (environ or {}) if is_secret_key(n) and _NAME.match(n))
    return list(dict.fromkeys(names))


def check_secrets_set(job: SubmitJob, environ: dict[str, str]) -> None:
    """Each of cluster.secrets is set in the submitting shell, which the job takes it from:
    a job started without one fails at its first use, after the queue wait."""
    unset = [str(n) for n in job.cluster.secrets if not environ.get(str(n))]
    if unset:
        raise ConfigError(
            f"cluster.secrets names {', '.join(unset)}, which this shell does not set; export "
            f"{'it' if len(unset) == 1 else 'them'} before submitting (the job takes "
            "cluster.secrets from the submitting shell by name)"
        )


def _notes(job: SubmitJob) -> list[str]:
    """Comments under the #SBATCH lines for figures a reader should not have to guess."""
    s = job.cluster.slurm
    if s.mem is not None:
        return []
    if s.exclusive:
        return ["# --mem=0: all of each node's memory (cluster.slurm.exclusive=true, mem=null)."]
    m = job_memory(job)
    processes = (
        f"{job.procs_per_node} process(es) x cluster.slurm.mem_per_process={s.mem_per_process}"
        if s.mem_per_process is not None
        else f"{job.procs_per_node} process(es): the plan's {-(-m.processes_need // MIB)} MiB "
        f"+ {PROCESS_MARGIN:.0%} (launcher.plan host memory)"
    )
    return [
        f"# --mem: {processes} + /dev/shm {m.shm_need // MIB} MiB (loaders, memory tier)",
        f"# + cluster.slurm.shm_margin={s.shm_margin}: the node's need (cluster.slurm.mem=null).",
    ]


def _setup_lines(job: SubmitJob) -> list[str]:
    """Each setup line in braces, so that its own `;`, `&&`, `&` or comment stays its own,
    and its failure ends the job at once, naming the line (setup_failed in the template).
    With cluster.slurm.modules, `module` is initialised first: a batch script is no login
    shell, and the submitting shell's function does not travel with --export."""
    c, s = job.cluster, job.cluster.slurm
    init = [MODULE_INIT] if s.modules else []
    lines = [f"module load {m}" for m in s.modules]
    if s.venv is not None:
        lines.append(f"source {shlex.quote(str(Path(s.venv).expanduser()))}/bin/activate")
    if s.container_image is not None:
        lines.append(f"mkdir -p {shlex.quote(str(_cache_dir(job)))}")  # a mount's source
    lines += list(c.setup)
    sif = image_file(job)
    if sif is not None:  # after the setup lines: they may load the runtime (module load)
        lines.append(_convert_once(job, sif))
    if not lines:
        return ["  : # (none: cluster.slurm.modules, cluster.slurm.venv and cluster.setup)"]
    return init + [f"  {{ {line}\n  }} || setup_failed $? {shlex.quote(line)}" for line in lines]


# `module` where the site has Lmod or Environment Modules, found where they install it.
MODULE_INIT = (
    "  type module >/dev/null 2>&1 || for init in /etc/profile.d/lmod.sh "
    "/etc/profile.d/modules.sh /usr/share/lmod/lmod/init/bash /usr/share/Modules/init/bash; "
    'do [ -r "$init" ] && . "$init" && break; done'
)


def _cache_dir(job: SubmitJob) -> Path:
    return cache_root(str(job.cfg.data.cache_dir))


def container_mounts(job: SubmitJob) -> list[str]:
    """What the container must see at the same paths: the workdir, the run root, the data
    cache, the home folder (netrc, Hugging Face cache) and the venv, a folder inside another
    mount left out; then cluster.slurm.container_mounts."""
    s = job.cluster.slurm
    paths = [job.workdir, job.run_root, _cache_dir(job), Path.home()]
    if s.venv is not None:
        paths.append(Path(s.venv).expanduser())
    paths = [p.resolve() for p in paths]
    own = [
        p for p in dict.fromkeys(paths) if not any(p != q and p.is_relative_to(q) for q in paths)
    ]
    return [f"{p}:{p}" for p in own] + list(s.container_mounts)


def container_name(job: SubmitJob) -> str:
    """cluster.slurm.container_name, else one per image: pyxis keeps a named container and
    starts it again without importing the image (every step; with the site's
    container_scope=global also every start, requeue and later job)."""
    s = job.cluster.slurm
    if s.container_name:
        return str(s.container_name)
    return f"launcher-{hashlib.sha256(str(s.container_image).encode()).hexdigest()[:12]}"


def _srun_options(job: SubmitJob) -> list[str]:
    s = job.cluster.slurm
    # Slurm 22.05's srun no longer inherits --cpus-per-task from the batch job. The binding
    # is stated, not left to the site's TaskPluginParam: the one task of each node, torchrun
    # and its ranks, is held to the CPUs the job was given (docs/slurm.md).
    opts = [f"--nodes={job.nodes}", "--ntasks-per-node=1", f"--cpus-per-task={cpus_per_task(job)}"]
    opts.append(f"--cpu-bind={s.cpu_bind}")
    opts.append(f"--wait={SRUN_WAIT_S}")
    if s.resv_ports:
        opts.append("--resv-ports=1")
    if s.container_image is not None and s.container_runtime == "pyxis":
        opts += _pyxis_options(job)
    return opts


def _pyxis_options(job: SubmitJob) -> list[str]:
    return [
        f"{PYXIS_OPTION}={job.cluster.slurm.container_image}",
        f"--container-name={container_name(job)}",
        f"--container-mounts={shlex.quote(','.join(container_mounts(job)))}",
        f"--container-workdir={shlex.quote(str(job.workdir))}",
    ]


# Images an Apptainer/Singularity exec would pull and convert itself (on every node, at
# every start): converted once instead, into a SIF under run.root (image_file).
REMOTE_IMAGES = ("docker://", "docker-daemon://", "oras://", "library://", "shub://")
IMAGES_DIR = ".images"  # under run.root, which every node sees; launcher.runs skips it


def image_file(job: SubmitJob) -> Path | None:
    """The SIF an Apptainer/Singularity job runs a remote image (docker://...) from: one
    per image under run.root, converted once by the batch shell (`_convert_once`) and
    reused by every node, start, requeue and later run of that image; None for a local
    .sif or pyxis."""
    s = job.cluster.slurm
    image = str(s.container_image or "")
    if s.container_runtime == "pyxis" or not image.startswith(REMOTE_IMAGES):
        return None
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", image.split("://", 1)[1].rsplit("/", 1)[-1])
    digest = hashlib.sha256(image.encode()).hexdigest()[:12]
    return job.run_root / IMAGES_DIR / f"{name}-{digest}.sif"


def _convert_once(job: SubmitJob, sif: Path) -> str:
    """The setup line that builds `sif` from the remote image unless it is there: into a
    name of this job's, then renamed, so a job that starts meanwhile never runs half a
    file (two jobs converting at once each rename a whole one)."""
    s = job.cluster.slurm
    tmp = shlex.quote(f"{sif}.job") + '"$SLURM_JOB_ID"'
    final, folder = shlex.quote(str(sif)), shlex.quote(str(sif.parent))
    image = shlex.quote(str(s.container_image))
    return (
        f"[ -s {final} ] || {{ mkdir -p {folder} && {s.container_runtime} build --force "
        f"{tmp} {image} && mv -f {tmp} {final}; }}"
    )


def _apptainer(job: SubmitJob) -> str:
    """`apptainer exec` (or singularity) of the image (its SIF, for a remote one), the
    mounts bound, GPUs passed in."""
    s = job.cluster.slurm
    gpus = " --nv" if job.cluster.gpus_per_node else ""
    binds = shlex.quote(",".join(container_mounts(job)))
    workdir = shlex.quote(str(job.workdir))
    image = shlex.quote(str(image_file(job) or s.container_image))
    return f"{s.container_runtime} exec{gpus} --bind {binds} --pwd {workdir} {image}"


def _in_launcher(job: SubmitJob) -> str:
    """What runs a command of the launcher's from the batch shell: itself, or the container
    (pyxis: a one-task step in the job's named container; Apptainer: exec here)."""
    s = job.cluster.slurm
    if s.container_image is None:
        return ""
    if s.container_runtime == "pyxis":
        return f"srun --nodes=1 --ntasks=1 {' '.join(_pyxis_options(job))} "
    return f"{_apptainer(job)} "


def _torchrun(job: SubmitJob) -> str:
    """`python -m launcher.torchrun`, then one option per line and `-m launcher.train`; the
    trainer's overrides are not here but in the arguments file (LAUNCHER_ARGS_FILE). With
    reserved ports the rendezvous port is the step's first (SLURM_STEP_RESV_PORTS, known only
    in the step): a shell in the task puts it in place of @PORT@."""
    s = job.cluster.slurm
    argv = job.torchrun_argv("@ENDPOINT@")
    module = argv.index("-m", len(FRONT_DOOR))
    argv = [shlex.quote(a) for a in argv[: module + 2]]
    front = len(FRONT_DOOR)
    lines = [" ".join(argv[:front]), *argv[front:module], " ".join(argv[module:])]
    if s.container_image is not None and s.container_runtime != "pyxis":
        lines[0] = f"{_apptainer(job)} {lines[0]}"
    endpoint = '"$head_node:@PORT@"' if s.resv_ports else '"$endpoint"'
    if s.resv_ports:
        lines[0] = "bash -c 'exec \"${@//@PORT@/${SLURM_STEP_RESV_PORTS%%[-,]*}}\"' - " + lines[0]
    return " \\\n    ".join(lines).replace("@ENDPOINT@", endpoint)


def _policy(job: SubmitJob) -> str:
    """The requeue policy, as the job log states it at every start."""
    s = job.cluster.slurm
    if not s.requeue:
        return "requeue policy: none (cluster.slurm.requeue=false); resubmit to resume"
    cap = "no cap" if s.max_requeues is None else f"at most {s.max_requeues} requeues"
    return (
        "requeue policy: on a preemption (USR1 well before the time limit) or a lost node "
        "(exit 8) always; on the time limit's warning (USR1) or a detected hang (exit 5) only "
        f"when a newer checkpoint was completed during this start; {cap} "
        "(cluster.slurm.max_requeues), without the hosts in the run directory's bad_hosts; "
        "this job has been requeued $restart time(s)"
    )


def _requeue_block(job: SubmitJob) -> str:
    """Requeue only what can make progress: after a preemption or a lost node (whether or
    not this start advanced: the next may run undisturbed), after the time limit's warning
    or a hang only when this start completed a newer checkpoint than the one it began from,
    never after bad input (2), a non-finite loss (3) or out of memory (4); once after a
    refused node (6). Every requeue keeps the run's bad hosts out (launcher.submit.
    slurm_exclude)."""
    s = job.cluster.slurm
    if not s.requeue:
        return "# cluster.slurm.requeue=false: a stopped job is not requeued; submit it again"
    lost = exit_codes.NODE_LOST
    lines = [
        *slurm_exclude.function(job.nodes),
        *_bad_node_block(job),
        "# Requeue after a preemption or a lost node; after the time limit's warning or a hang",
        "# only when this start advanced the checkpoint.",
        f'[ "$code" -eq {lost} ] && cause="node lost"',
        f'if {{ [ "$stop" = USR1 ] || [ "$code" -eq 5 ] || [ "$code" -eq {lost} ]; }} '
        '&& [ "$code" -ne 2 ] && [ "$code" -ne 3 ] && [ "$code" -ne 4 ]; then',
        "  reached=$(checkpoints)",
    ]
    test = "if"
    if s.max_requeues is not None:
        lines += [
            f'  if [ "$restart" -ge {s.max_requeues} ]; then',
            f'    echo "launcher: not requeued: cluster.slurm.max_requeues={s.max_requeues} '
            'reached"',
        ]
        test = "elif"
    lines += [
        f'  {test} [ "$cause" != preemption ] && [ "$cause" != "node lost" ] '
        '&& [ "$reached" = "$started_at" ]; then',
        '    echo "launcher: not requeued: no newer checkpoint was completed during this start '
        '(still ${started_at:-none}); a requeue would make no progress"',
        "  else",
        f'    {slurm_exclude.FUNCTION} "${{cause:+ ($cause)}}; it resumes from '
        '${reached:-the start}"',
        "  fi",
        "fi",
    ]
    return "\n".join(lines)


def _bad_node_block(job: SubmitJob) -> list[str]:
    """After the burn-in gate refused a node (exit 6, the hosts in the run directory's
    bad_hosts): requeue once, the hosts excluded (launcher.submit.slurm_exclude)."""
    code = exit_codes.BAD_NODE
    return [
        f"# The burn-in gate refused a node (exit {code}): requeue once, without the hosts.",
        f'if [ "$code" -eq {code} ]; then',
        '  marker="$run_dir/submit/burnin-requeued.$SLURM_JOB_ID"',
        f'  if [ -z "$({slurm_exclude.HOSTS})" ]; then',
        f'    echo "launcher: not requeued: exit {code} but no $run_dir/{bad_hosts.FILE} names '
        'a host"',
        '  elif [ -e "$marker" ]; then',
        '    echo "launcher: not requeued: the burn-in gate refused a node again after its one '
        "requeue (kept off so far: $(" + slurm_exclude.HOSTS + '))"',
        "  else",
        '    touch "$marker"',
        f'    {slurm_exclude.FUNCTION} " once after the burn-in gate refused a node"',
        "  fi",
        "fi",
    ]


def submit(job: SubmitJob, paths: list[Path]) -> str:
    """`sbatch` the script; what the partition cannot give, and Slurm's rejection (a missing
    partition...), become one line. --export on the command line, which SBATCH_EXPORT in
    the submitting shell cannot override as it does an #SBATCH line."""
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise ConfigError(
            "sbatch not found: submit from a machine with the Slurm client, or use --dry-run "
            f"and run `sbatch {paths[0]}` there"
        )
    s = job.cluster.slurm
    if s.container_image is not None and s.container_runtime == "pyxis":
        _check_pyxis()
    check_secrets_set(job, dict(os.environ))
    check_partition(job)
    if s.resv_ports:
        _check_resv_ports()
    export = f"--export={','.join(export_names(job, dict(os.environ)))}"
    proc = subprocess.run(
        [sbatch, "--parsable", export, str(paths[0])], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise ConfigError(f"sbatch rejected the job: {_slurm_error(proc.stderr)}")
    job_id = proc.stdout.strip().split(";")[0]
    output = job.submit_dir / OUTPUT.replace("%j", job_id)
    return f"submitted Slurm job {job_id}; run dir {job.run_dir}; Slurm output {output}"


def check_partition(job: SubmitJob) -> None:
    """The partition must hold cluster.nodes nodes that are not excluded (the burn-in
    gate's refusals) and have the memory --mem asks for (`sinfo`: each node's RealMemory);
    otherwise the job would pend for ever. One line naming the figures and the keys."""
    s = job.cluster.slurm
    where = ["-p", str(s.partition)] if s.partition else []
    proc = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N %m %P", *where], capture_output=True, text=True
    )
    rows = [ln.split() for ln in proc.stdout.splitlines() if len(ln.split()) == 3]
    if not s.partition:
        rows = [r for r in rows if r[2].endswith("*")]  # the default partition
    nodes = {r[0]: int(r[1].rstrip("+")) for r in rows if r[1].rstrip("+").isdigit()}
    if proc.returncode != 0 or not nodes:
        return  # sbatch names the partition problem itself
    name = s.partition or next(iter(rows))[2].rstrip("*")
    refused = set(bad_hosts.read(job.run_dir))
    usable = {n: m for n, m in nodes.items() if n not in refused}
    if len(usable) < job.nodes:
        raise ConfigError(
            f"cluster.nodes={job.nodes}: partition {name} has {len(usable)} node(s) besides "
            f"the ones this run keeps off ({', '.join(sorted(refused))}, "
            f"{job.run_dir / bad_hosts.FILE}); fix or replace those nodes, or lower cluster.nodes"
        )
    mem = mem_option(job)
    if mem == "0":
        return
    need = -(-slurm_bytes(mem, "cluster.slurm.mem") // MIB)
    fits = sorted(m for m in usable.values() if m >= need)
    if len(fits) < job.nodes:
        raise ConfigError(
            f"--mem={mem} ({need} MiB per node) is more than partition {name} can give "
            f"{job.nodes} node(s) (largest: {max(usable.values())} MiB): lower "
            "cluster.slurm.mem_per_process or data.num_workers, set cluster.slurm.mem, or "
            "use cluster.slurm.exclusive=true (--mem=0: whole nodes)"
        )


def _check_resv_ports() -> None:
    """srun --resv-ports needs a port range in MpiParams; without one the step fails after
    the queue wait."""
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True)
    if not re.search(r"^MpiParams\s*=.*\bports=\d", config.stdout, re.MULTILINE):
        raise ConfigError(
            "cluster.slurm.resv_ports=true, but this cluster reserves no ports (no "
            "MpiParams=ports=<range> in `scontrol show config`); leave resv_ports=false, or "
            "ask your admins for a port range"
        )


def _check_pyxis() -> None:
    """Containers need pyxis on the nodes; without it srun refuses the option after the
    queue wait. The plugin adds its options to `srun --help`, so ask that here."""
    srun = shutil.which("srun")
    found = (
        srun
        and PYXIS_OPTION in subprocess.run([srun, "--help"], capture_output=True, text=True).stdout
    )
    if not found:
        raise ConfigError(
            "cluster.slurm.container_image needs the pyxis plugin, but this cluster's srun "
            f"has no {PYXIS_OPTION} (`srun --help`); ask your admins for pyxis and enroot, "
            "or leave container_image=null and use cluster.slurm.modules or venv"
        )


def _slurm_error(stderr: str) -> str:
    """Slurm's error lines, without their `sbatch: error:` prefixes, as one line."""
    lines = [ln.split("error:", 1)[1].strip() for ln in stderr.splitlines() if "error:" in ln]
    unique = list(dict.fromkeys(ln for ln in lines if ln))
    return "; ".join(unique) or " ".join(stderr.split()) or "no reason given"


def render_example() -> str:
    """slurm/job.sbatch as the renderer writes it today (a test keeps the two identical)."""
    return render(prepare("slurm", EXAMPLE_OVERRIDES, check_paths=False))[SCRIPT]


if __name__ == "__main__":
    if sys.argv[1:] != ["--example"]:
        sys.exit("usage: python -m launcher.submit.slurm --example > slurm/job.sbatch")
    sys.stdout.write(render_example())


def rehearse(seen, s: DictConfig, key: str, write: stop_time.WriteTime) -> None:
    """launcher.rehearse's cluster case: the signal lead holds the stop checkpoint's write,
    and a preempted job is requeued, a limited number of times."""
    seen.ok(
        f"signal_lead_s={s.signal_lead_s} holds the {write.seconds:.1f} s "
        f"stop checkpoint ({write.why})"
    )
    seen.require(bool(s.requeue), f"{key}.requeue=false: a preempted job is not requeued")
    seen.require(s.max_requeues is not None,
                 f"{key}.max_requeues=null: a failing job requeues forever")  # fmt: skip
    seen.ok(f"requeue limited to {s.max_requeues}")
