"""The sbatch script: `templates/slurm.sbatch` with the job's values filled in. One torchrun
per node through srun, c10d rendezvous on the first node (on a port derived from the job id,
or one Slurm reserves), the job's environment by name (--export), the trainer's overrides
through a 0600 file rather than the ranks' command lines, containers (pyxis, Apptainer), and
the requeue that runs when Slurm warns or a start ends (launcher.submit.slurm.exclude keeps
the run's bad hosts out). slurm/README.md explains the script line by line."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from importlib import resources
from pathlib import Path

from launcher.config.secret_keys import is_secret_key
from launcher.data.cache import cache_root
from launcher.resilience import bad_hosts, exit_codes
from launcher.resilience.node_presence import WAIT_ENV
from launcher.runtime.args_file import ARGS_FILE_ENV
from launcher.submit.job import FRONT_DOOR, SubmitJob, prepare
from launcher.submit.node_memory import PROCESS_MARGIN
from launcher.submit.slurm import exclude
from launcher.submit.slurm.probes import PYXIS_OPTION
from launcher.submit.slurm.resources import (
    MIB,
    SIGNAL_EARLY_S,
    VARIABLE_NAME,
    check,
    cpus_per_task,
    job_memory,
    mem_option,
)

SCRIPT = "job.sbatch"
OUTPUT = "slurm-%j.out"  # in the submit/ folder; requeued runs append to the same file
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
# The warning comes signal_lead_s (and up to SIGNAL_EARLY_S more) before the time limit; a
# USR1 with more time left than that, and this slack, is a preemption (or an operator's).
WARNING_SLACK_S = 60
# A failed setup line ends the job with the contract's bad-input code: a retry fails alike.
SETUP_FAILED_EXIT = 2


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
            f"export {name}={shlex.quote(value)}" for name, value in exports(job).items()
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
    names += sorted(n for n in (environ or {}) if is_secret_key(n) and VARIABLE_NAME.match(n))
    return list(dict.fromkeys(names))


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


# How long the other nodes wait for a lost node's replacement: nothing can take a node's
# place inside an allocation, so only as long as an agent takes to end after its ranks
# (when every node ends together, a preemption or a failure they share, the front door that
# ends first must not be taken for a lost node by one still ending).
LOST_NODE_WAIT_S = 5


def exports(job: SubmitJob) -> dict[str, str]:
    """What every node's task exports: the job's variables, and a lost node's short wait
    (LOST_NODE_WAIT_S; the requeue brings a full set of nodes); `cluster.env` may set it."""
    return {WAIT_ENV: str(LOST_NODE_WAIT_S), **job.env()}


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
    slurm.exclude)."""
    s = job.cluster.slurm
    if not s.requeue:
        return "# cluster.slurm.requeue=false: a stopped job is not requeued; submit it again"
    lost = exit_codes.NODE_LOST
    lines = [
        *exclude.function(job.nodes),
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
        f'    {exclude.FUNCTION} "${{cause:+ ($cause)}}; it resumes from ${{reached:-the start}}"',
        "  fi",
        "fi",
    ]
    return "\n".join(lines)


def _bad_node_block(job: SubmitJob) -> list[str]:
    """After the burn-in gate refused a node (exit 6, the hosts in the run directory's
    bad_hosts): requeue once, the hosts excluded (launcher.submit.slurm.exclude)."""
    code = exit_codes.BAD_NODE
    return [
        f"# The burn-in gate refused a node (exit {code}): requeue once, without the hosts.",
        f'if [ "$code" -eq {code} ]; then',
        '  marker="$run_dir/submit/burnin-requeued.$SLURM_JOB_ID"',
        f'  if [ -z "$({exclude.HOSTS})" ]; then',
        f'    echo "launcher: not requeued: exit {code} but no $run_dir/{bad_hosts.FILE} names '
        'a host"',
        '  elif [ -e "$marker" ]; then',
        '    echo "launcher: not requeued: the burn-in gate refused a node again after its one '
        "requeue (kept off so far: $(" + exclude.HOSTS + '))"',
        "  else",
        '    touch "$marker"',
        f'    {exclude.FUNCTION} " once after the burn-in gate refused a node"',
        "  fi",
        "fi",
    ]


def render_example() -> str:
    """slurm/job.sbatch as the renderer writes it today (a test keeps the two identical)."""
    return render(prepare("slurm", EXAMPLE_OVERRIDES, check_paths=False))[SCRIPT]
