"""What every cluster renderer needs: the checked experiment, its run directory, and the
torchrun command each node runs.

The job's ranks rendezvous through c10d on the first node; the run id is fixed here, at
submit time, and passed to every rank as `run.id`, so all nodes, and a restarted or
requeued job, write into the same run directory and `resume=auto` finds its checkpoints.

Each node starts `python -m launcher.torchrun`, torchrun's own arguments in front of the
trainer: unlike plain torchrun (which exits 1 whatever went wrong) it exits with the job's
contract code (launcher/exit_codes.py), which the Slurm script's requeue decision and the
Kubernetes failure policies act on.
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig

from launcher import sweep
from launcher.config import ConfigError
from launcher.paths import can_create_in
from launcher.preflight import check_config

SUBMIT_DIR = "submit"
# What each node runs in place of `torchrun` (same arguments; exits with the contract code).
FRONT_DOOR = ("python", "-m", "launcher.torchrun")
DEFAULT_JOB_NAME = "launcher"


@dataclass
class SubmitJob:
    """One experiment (a single run or a sweep) as a multi-node job."""

    target: str  # slurm or k8s
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
        """
        self.submit_dir.mkdir(parents=True, exist_ok=True)
        n = 1
        while any((self.submit_dir / _numbered(name, n)).exists() for name in files):
            n += 1
        paths = []
        for name, text in files.items():
            path = self.submit_dir / _numbered(name, n)
            path.write_text(text)
            paths.append(path)
        return paths


def _numbered(name: str, n: int) -> str:
    """job.sbatch, job-2.sbatch, job-3.sbatch..."""
    if n == 1:
        return name
    stem, dot, ext = name.partition(".")
    return f"{stem}-{n}{dot}{ext}"


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
    run_id = (
        str(cfg.run.id)
        if cfg.run.id
        else f"{dt.datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(4)}"
    )
    return SubmitJob(target, cfg, list(overrides), run_id, root, workdir, configs)


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
