"""What every cluster renderer needs: the checked experiment, its run directory, and the
torchrun command each node runs.

The job's ranks rendezvous through c10d on the first node; the run id is fixed here, at
submit time, and passed to every rank as `run.id`, so all nodes, and a restarted or
requeued job, write into the same run directory and `resume=auto` finds its checkpoints.

Each node starts `python -m launcher.torchrun`, torchrun's own arguments in front of the
trainer: unlike plain torchrun (which exits 1 whatever went wrong) it exits with the job's
contract code (launcher/resilience/exit_codes.py), which the Slurm script's requeue decision and the
Kubernetes failure policies act on.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from launcher.config import ConfigError, sweep
from launcher.data.tokenizer import tokenizer_path_problem
from launcher.paths import can_create_in, make_run_dir
from launcher.preflight import (
    check_config,
    data_file_problems,
    init_from_problem,
    resume_problem,
)
from launcher.runtime import run_dir_check
from launcher.runtime.lock import LockHeld, tool_lock
from launcher.submit.secret_checks import check_secrets, shell_texts

SUBMIT_DIR = "submit"
# What each node runs in place of `torchrun` (same arguments; exits with the contract code).
FRONT_DOOR = ("python", "-m", "launcher.torchrun")
DEFAULT_JOB_NAME = "launcher"


@dataclass
class SubmitJob:
    """One experiment (a single run or a sweep) as a multi-node job."""

    target: str  # the backend's name (launcher.config.backends)
    cfg: DictConfig  # the first point's composed config (cluster.* is the same for all)
    overrides: list[str]  # as the user gave them; the trainer composes them again
    run_id: str
    run_root: Path  # absolute: every node must see it at the same path
    workdir: Path
    points: list[DictConfig] = field(default_factory=list)  # every sweep point's config
    warnings: list[str] = field(default_factory=list)  # one line each, printed by submit
    module: str = "launcher.train"  # what each node's torchrun runs; --tune: launcher.tune

    @property
    def cluster(self) -> DictConfig:
        return self.cfg.cluster

    @property
    def job_name(self) -> str:
        """cluster.job_name, else launcher-<exp> for an experiment, else launcher-<model>."""
        if self.cluster.job_name:
            return str(self.cluster.job_name)
        exp = [o.split("=", 1)[1] for o in self.overrides if o.lstrip("+").startswith("exp=")]
        return f"{DEFAULT_JOB_NAME}-{exp[-1] if exp else self.cfg.model.name}"

    @property
    def nodes(self) -> int:
        return int(self.cluster.nodes)

    @property
    def procs_per_node(self) -> int:
        return procs_per_node(self.cluster)

    @property
    def cpu_need(self) -> int:
        """CPUs one node's processes use: each rank and each of its DataLoader workers
        (every sweep point's most), what Slurm's --cpus-per-task and a pod's CPU request
        default to."""
        workers = max(int(p.data.num_workers) for p in (self.points or [self.cfg]))
        return self.procs_per_node * (1 + workers)

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def run_dir(self) -> Path:
        return self.run_root / self.run_id

    @property
    def submit_dir(self) -> Path:
        return self.run_dir / SUBMIT_DIR

    def train_overrides(self) -> list[str]:
        """The trainer's overrides: the user's, with the run directory pinned (in place of
        any run.root/run.id the user gave)."""
        pinned = ("run.root", "run.id")
        mine = [o for o in self.overrides if o.split("=", 1)[0].lstrip("+~") not in pinned]
        return [*mine, f"run.root={self.run_root}", f"run.id={self.run_id}"]

    def torchrun_argv(self, endpoint: str, node_rank: str | None = None) -> list[str]:
        """One node's torchrun (through launcher.torchrun, FRONT_DOOR): all nodes rendezvous
        at `endpoint` (host:port of node 0)."""
        rank = [f"--node-rank={node_rank}"] if node_rank is not None else []
        return [
            *FRONT_DOOR,
            f"--nnodes={self.nodes}",
            f"--nproc-per-node={self.procs_per_node}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}",
            f"--rdzv-id={self.run_id}",
            *rank,
            "-m",
            self.module,
            *self.train_overrides(),
        ]

    def env(self) -> dict[str, str]:
        """Variables every node exports: the `nccl` group's, then `cluster.env`.

        TORCH_DISABLE_SHARE_RDZV_TCP_STORE: each node's torchrun agent counts its own
        restarts, so workers must not share the rendezvous store (see runtime).
        """
        env = {name: str(v) for name, v in self.cfg.nccl.env.items() if v is not None}
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        env.update({str(k): str(v) for k, v in self.cluster.env.items()})
        return env

    def write(self, files: dict[str, str]) -> list[Path]:
        """Write the rendered files into the run directory's submit/ folder.

        A resubmission into the same run directory (the same run.id, to resume) keeps the
        earlier files: the new set gets the first free suffix, job-2.sbatch, job-3.sbatch...
        The run directory's entries are checked first, and `.submit.lock` held while the
        suffix is chosen and the files written (two renders at once would share one).
        """
        problem = run_dir_check.problem(self.submit_dir.parent)
        if problem:
            raise ConfigError(problem)
        make_run_dir(self.run_dir, self.run_root, self.cfg.run.access)
        try:
            with tool_lock(self.submit_dir.parent, "submit"):
                self.submit_dir.mkdir(exist_ok=True)
                return self._write_numbered(files)
        except LockHeld as exc:
            raise ConfigError(str(exc)) from exc

    def _write_numbered(self, files: dict[str, str]) -> list[Path]:
        n = 1
        while any((self.submit_dir / _numbered(name, n)).exists() for name in files):
            n += 1
        paths = []
        for name, text in files.items():
            path = self.submit_dir / _numbered(name, n)
            # Only the submitting user reads them (the scheduler reads the script as that
            # user): a job's files may name paths, accounts and hosts others need not see.
            path.touch(mode=0o600)
            path.write_text(text)
            paths.append(path)
        return paths


def _numbered(name: str, n: int) -> str:
    """job.sbatch, job-2.sbatch, job-3.sbatch..."""
    if n == 1:
        return name
    stem, dot, ext = name.partition(".")
    return f"{stem}-{n}{dot}{ext}"


_TIME = re.compile(
    r"^(?:(?P<d>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
    r"|(?P<h>\d+):(?P<m>\d+):(?P<s>\d+)|(?P<mm>\d+):(?P<ss>\d+)|(?P<min>\d+))$"
)


def time_limit_s(text: str) -> int:
    """Seconds in cluster.time_limit, any Slurm form: M, M:S, H:M:S, D-H, D-H:M or D-H:M:S
    (Kubernetes' deadline takes the same text)."""
    m = _TIME.match(text.strip())
    if not m:
        raise ConfigError(
            f"cluster.time_limit={text}: not a Slurm time; use [D-]HH:MM:SS, e.g. 04:00:00"
        )
    g = {k: int(v) for k, v in m.groupdict().items() if v is not None}
    if "d" in g:
        return ((g["d"] * 24 + g["dh"]) * 60 + g.get("dm", 0)) * 60 + g.get("ds", 0)
    if "h" in g:
        return (g["h"] * 60 + g["m"]) * 60 + g["s"]
    if "mm" in g:
        return g["mm"] * 60 + g["ss"]
    return g["min"] * 60


def check_interval_fits(
    limit: str, usable: float, t: DictConfig, step_time_s, group: str, before: str
) -> None:
    """One checkpoint interval must fit into the time a start can train, or a job that is
    stopped or killed at its limit makes no progress but through its stop checkpoint. An
    `auto` interval is the run's to choose (launcher.checkpoint.cadence): not checked here."""
    if (
        step_time_s is None
        or not isinstance(t.checkpoint_interval, int)
        or not t.checkpoint_interval
    ):
        return
    needed = t.checkpoint_interval * step_time_s
    if needed > usable:
        raise ConfigError(
            f"cluster.time_limit={limit} is shorter than one checkpoint interval: "
            f"trainer.checkpoint_interval={t.checkpoint_interval} steps x "
            f"{group}.step_time_s={step_time_s} = {needed:.0f} s, but only "
            f"{usable:.0f} s remain {before}; lower the interval or raise the limit"
        )


def procs_per_node(cluster: DictConfig) -> int:
    """Processes per node: `cluster.procs_per_node`, else one per GPU, else one."""
    if cluster.procs_per_node is not None:
        return int(cluster.procs_per_node)
    return int(cluster.gpus_per_node) or 1


def prepare(target: str, overrides: list[str], check_paths: bool = True) -> SubmitJob:
    """Compose and check the experiment as the cluster job will run it; raise ConfigError.

    Every sweep point is validated at the job's world size (nodes x processes per node), so
    a batch that does not divide over the ranks fails here, not on the cluster.
    `check_paths=False` skips the check that run.root is writable from here (for rendering
    the checked-in examples, whose paths exist only on a cluster).
    """
    overrides = [quote_hash(o) for o in overrides]
    if not any(o.split("=", 1)[0].lstrip("+") == "cluster" for o in overrides):
        overrides = [f"cluster={target}", *overrides]
    _, configs = sweep.compose_points(overrides, multirun=False)
    cfg = configs[0]
    if cfg.cluster.name != target:
        raise ConfigError(
            f"cluster={cfg.cluster.name} does not match `submit {target}`; use cluster={target}"
        )
    _check_shape(cfg.cluster)
    check_shell_text(overrides)
    check_interpolations(cfg)
    warnings = check_secrets(target, overrides, configs)
    world = cfg.cluster.nodes * procs_per_node(cfg.cluster)
    for point in configs:
        try:
            check_config(point, world)
        except ConfigError as exc:
            raise ConfigError(
                f"{exc} (world size {world} = cluster.nodes={cfg.cluster.nodes} x "
                f"{procs_per_node(cfg.cluster)} processes per node)"
            ) from None
    sweep.check_launch_wide(configs)
    workdir = Path(cfg.cluster.workdir or os.getcwd()).expanduser()
    root = Path(cfg.run.root).expanduser()
    root = root if root.is_absolute() else workdir / root
    if check_paths:
        _check_writable(root)
        for point in configs:
            check_visible_files(point, workdir)
    run_id = (
        str(cfg.run.id)
        if cfg.run.id
        else f"{dt.datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(4)}"
    )
    return SubmitJob(target, cfg, list(overrides), run_id, root, workdir, configs, warnings)


def quote_hash(override: str) -> str:
    """`key=a#b` as `key='a#b'`: Hydra's override lexer refuses a bare `#`, which enroot
    image names carry (nvcr.io#nvidia/pytorch:24.05-py3). Values that already use quotes,
    lists, dicts or sweeps are left alone."""
    key, eq, value = override.partition("=")
    if not eq or "#" not in value or any(ch in value for ch in "'\"[]{}(),\\ "):
        return override
    return f"{key}='{value}'"


def _check_shape(cluster: DictConfig) -> None:
    for key in ("nodes",):
        if cluster[key] < 1:
            raise ConfigError(f"cluster.{key}={cluster[key]}: must be at least 1")
    if cluster.gpus_per_node < 0:
        raise ConfigError(f"cluster.gpus_per_node={cluster.gpus_per_node}: must be 0 or more")
    if cluster.procs_per_node is not None and cluster.procs_per_node < 1:
        raise ConfigError(f"cluster.procs_per_node={cluster.procs_per_node}: must be at least 1")
    if cluster.gpus_per_node and procs_per_node(cluster) != cluster.gpus_per_node:
        raise ConfigError(
            f"cluster.procs_per_node={cluster.procs_per_node} differs from "
            f"cluster.gpus_per_node={cluster.gpus_per_node}: each process drives one GPU; "
            "leave procs_per_node=null"
        )


def _check_writable(root: Path) -> None:
    """The run root (or the folder it will be made in) must be writable from here."""
    existing = root
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not can_create_in(existing):
        raise ConfigError(
            f"run.root={root}: {existing} is not a writable directory; give run.root a path "
            "on the file system all nodes share (e.g. run.root=/shared/$USER/runs)"
        )


def check_shell_text(overrides: list[str]) -> None:
    """A value Hydra typed (`false` as the boolean False, `1e3` as 1000.0, `0022` as 22) is
    written into the job as Python prints it, not as typed: refuse it in the keys that
    become shell text, with the quoting that keeps it as typed."""
    parser = OverridesParser.create()
    for override in overrides:
        key, _, raw = override.partition("=")
        key = key.lstrip("+~")
        if not any(key == k or key.startswith(f"{k}.") for k in shell_texts()):
            continue
        typed = _retyped(parser.parse_override(override).value(), raw)
        if typed:
            value = typed[0]
            raise ConfigError(
                f"{override}: Hydra reads a value here as the {type(value).__name__} "
                f"{value!r}, and the job would get `{value}`; quote it to keep it as typed, "
                f"e.g. {key}='\"text\"' or {key}='[\"text\"]'"
            )


def check_interpolations(cfg: DictConfig) -> None:
    """A shell `${VAR}` in those keys is an OmegaConf interpolation, which fails (or takes
    a config value) when the renderer reads it; say how to write it for the shell."""
    for key in shell_texts():
        try:
            OmegaConf.to_container(OmegaConf.select(cfg, key, default=[]), resolve=True)
        except OmegaConfBaseException as exc:
            where = getattr(exc, "full_key", None) or key
            raise ConfigError(
                f"{where}: ${{...}} is read as a config interpolation here; for the shell "
                "write $VAR, or escape it as \\${VAR}"
            ) from None


def _retyped(value, raw: str) -> list:
    """The scalars in a parsed override value whose text is not the one in `raw`."""
    if isinstance(value, dict):
        return [w for v in value.values() for w in _retyped(v, raw)]
    if isinstance(value, list):
        return [w for v in value for w in _retyped(v, raw)]
    if value is None or isinstance(value, str):
        return []
    return [] if re.search(rf"(?<![\w.]){re.escape(str(value))}(?![\w.])", raw) else [value]


def check_visible_files(cfg: DictConfig, workdir: Path) -> None:
    """The files the run reads (data, a checkpoint to resume, pretrained weights, a
    tokenizer), checked now rather than on the nodes after the queue wait, where they lie
    on a file system this host sees too (relative paths: under an existing workdir)."""
    with contextlib.chdir(workdir) if workdir.is_dir() else contextlib.nullcontext():
        problems = _file_problems(cfg, workdir)
    if problems:
        raise ConfigError(f"{problems[0]} (checked at submit: the job would fail on the nodes)")


def _file_problems(cfg: DictConfig, workdir: Path) -> list[str]:
    d = cfg.data
    data = OmegaConf.masked_copy(d, ["source", "paths", "val_paths"])
    data.paths = [p for p in d.paths if visible(p, workdir)]
    data.val_paths = [p for p in d.get("val_paths", []) if visible(p, workdir)]
    problems = data_file_problems(data)
    if cfg.resume not in ("auto", "never", "archive") and visible(cfg.resume, workdir):
        problems.append(resume_problem(cfg.resume))
    for value, check in (
        (cfg.model.init_from, init_from_problem),
        (d.tokenizer, tokenizer_path_problem),
    ):
        path = str(value or "")
        if path.startswith(("/", ".", "~")) and visible(path, workdir):  # not a hub name
            problems.append(check(path))
    return [p for p in problems if p]


def visible(path: str, workdir: Path) -> bool:
    """Whether this host sees the file system `path` lies on: its top folder exists here
    (/shared of /shared/data/*.txt); for a relative path, the workdir does."""
    p = Path(os.path.expanduser(str(path)))
    if not p.is_absolute():
        return workdir.is_dir()
    return len(p.parts) > 1 and Path(p.parts[0], p.parts[1]).exists()
