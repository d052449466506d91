"""Process-group lifecycle, device, run id and run directory, rank-aware logging, seeding.

Everything that differs between "torchrun on a laptop", "srun on Slurm" and "a pod on
Kubernetes" is read from the environment here, so nothing downstream has to know how the
ranks were started.
"""

from __future__ import annotations

import datetime as dt
import gc
import hashlib
import logging
import os
import random
import secrets
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from launcher.config.schema import DistConfig, NcclConfig, RunConfig, TrainConfig
from launcher.runtime import disk, nccl_capture
from launcher.runtime.launch_state import LaunchState
from launcher.runtime.placement import env_world, launch_key, node_name

log = logging.getLogger("launcher")

LOG_FORMAT = "%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s"


@dataclass
class Runtime:
    """What every layer needs to know about this process and its place in the job."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str | None
    run_id: str = ""
    run_dir: Path = field(default_factory=Path)
    control_group: object | None = None
    log_file: logging.Handler | None = None
    launch: LaunchState = field(default_factory=LaunchState)  # what outlives this job

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return dist.is_available() and dist.is_initialized()

    def barrier(self) -> None:
        """Wait for every rank (on the CPU control group: no device work involved)."""
        if self.distributed:
            dist.barrier(group=self.control_group)

    def all_gather_floats(self, values: list[float]) -> list[list[float]]:
        """One small all-gather of a float vector from every rank, on the CPU group."""
        local = torch.tensor(values, dtype=torch.float64)
        if not self.distributed:
            return [local.tolist()]
        out = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(out, local, group=self.control_group)
        return [t.tolist() for t in out]

    def all_gather_objects(self, obj) -> list:
        """Every rank's `obj` (picklable), in rank order, on the CPU group."""
        if not self.distributed:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.control_group)
        return out

    def gather_objects(self, obj) -> list | None:
        """Every rank's `obj` (picklable), in rank order, on rank 0; None on the others.
        For what only rank 0 reads: sent to it alone, each rank's share crosses the network
        once, where an all-gather would send every rank's to every rank (W x W)."""
        if not self.distributed:
            return [obj]
        out = [None] * self.world_size if self.is_main else None
        dist.gather_object(obj, out, dst=0, group=self.control_group)
        return out

    def side_group(self, purpose: str):
        """A gloo group of every rank for one purpose (e.g. a background checkpoint
        writer's collectives), made the first time it is asked for (every rank must ask at
        the same point) and kept for the rest of the process, as the process group is."""
        groups = self.launch.side_groups
        if purpose not in groups:
            groups[purpose] = dist.new_group(backend="gloo")
        return groups[purpose]

    def broadcast_object(self, obj):
        """Rank 0's value of `obj` on every rank."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.control_group)
        return box[0]


@dataclass
class RuntimeConfig:
    """The sections of the checked config the runtime reads: where runs go (`run`), the
    process group (`dist`, `nccl`), the device, the seed, and the flight recorder's size
    (it must be set before the process group exists)."""

    run: RunConfig
    dist: DistConfig
    nccl: NcclConfig
    device: str  # trainer.device
    seed: int  # trainer.seed
    flight_recorder_entries: int  # watchdog.flight_recorder_entries

    @classmethod
    def of(cls, cfg: TrainConfig) -> RuntimeConfig:
        t = cfg.trainer
        return cls(
            cfg.run, cfg.dist, cfg.nccl, t.device, t.seed, cfg.watchdog.flight_recorder_entries
        )


def start(
    cfg: RuntimeConfig,
    launch: LaunchState,
    point: str | None = None,
    *,
    needs_group: bool = False,
) -> Runtime:
    """Join the job, pick the device, and agree on the run directory's name (made, once
    every entry of it was checked, by the launch's claim: launcher.train.job).

    The process group is created by the first job of the process and kept in `launch` for
    the next ones; a one-process run gets a group of one only when its engine cannot run
    without one (`needs_group`: DeepSpeed, FSDP2). `point` names a sweep point: its run
    directory is `<sweep_id>/<point>`, the sweep id being chosen once, by the first point,
    as a run id would be.
    """
    rank, local_rank, world = env_world()
    _configure_console_logging(rank, launch.console_logger if launch.quiet_progress else None)
    device = pick_device(cfg.device, local_rank)
    # DeepSpeed picks its accelerator when first imported, from this variable if set: a
    # CPU run on a GPU machine stays on the CPU.
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if device.type == "cuda" else "cpu")
    launched = world > 1 or "MASTER_ADDR" in os.environ
    if (launched or needs_group) and not dist.is_initialized():
        launch.backend = pick_backend(cfg.dist.backend, device)
        apply_nccl_env(cfg.nccl)
        nccl_capture.enable_flight_recorder(cfg.flight_recorder_entries)
        launch.nccl_capture = nccl_capture.stage_debug_file(
            cfg.run.root, launch.backend, rank, launch.nccl_capture
        )
        timeout = dt.timedelta(seconds=cfg.dist.timeout_s)
        if launched:
            init_process_group(launch.backend, timeout, device)
        else:
            init_single_process_group(launch.backend, timeout, device)
        # Control traffic (barriers, metric gathers, stop votes) goes over gloo on the CPU
        # so it never queues behind, or is timed with, gradient communication.
        launch.control_group = dist.new_group(backend="gloo")
        launch.attempt = attempt_name(launch.control_group)
        log.info("process group created: %s, %d ranks", launch.backend, world, extra=LAUNCH_LINE)
    rt = Runtime(rank, local_rank, world, device, launch.backend, launch=launch)
    rt.control_group = launch.control_group
    if point is None:
        rt.run_id = rt.broadcast_object(choose_run_id(cfg.run) if rt.is_main else None)
    else:
        if launch.sweep_id is None:
            launch.sweep_id = rt.broadcast_object(choose_run_id(cfg.run) if rt.is_main else None)
        rt.run_id = f"{launch.sweep_id}/{point}"
    rt.run_dir = Path(cfg.run.root).expanduser() / rt.run_id
    seed_everything(cfg.seed)
    return rt


def attempt_name(group) -> str:
    """A name that every rank of this process group shares and no other attempt's ranks
    have (rank 0's host, pid and clock), broadcast once: what tells a node's heartbeat of
    this attempt from another's (launcher.resilience.node_presence), with no clock of two
    hosts compared."""
    box = [f"{node_name()}-{os.getpid()}-{time.time_ns()}" if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def open_run_dir(rt: Runtime) -> None:
    """Once this launch may use the run directory (it holds its lock): the per-rank logs.

    Nothing is written into the directory before, so that a launch refused there (the
    directory is in use, or its checkpoints do not fit) leaves it as it was.
    """
    if rt.is_main:
        (rt.run_dir / "logs").mkdir(exist_ok=True)
    rt.barrier()
    nccl_capture.adopt_debug_file(rt.launch.nccl_capture, rt.run_dir)
    rt.log_file = _add_file_logging(rt)
    log.info(
        "rank %d/%d (local %d, pid %d) on host %s, device %s, backend %s, run dir %s",
        rt.rank,
        rt.world_size,
        rt.local_rank,
        os.getpid(),
        node_name(),
        rt.device,
        rt.backend or "none (one process, no process group)",
        rt.run_dir,
    )


def init_process_group(backend: str, timeout: dt.timedelta, device: torch.device) -> None:
    """init_process_group from the env:// variables, on a store private to this attempt.

    torchrun shares its rendezvous store with the workers, and the keys a failed attempt
    wrote survive into the next one: a restarted gloo group could read a dead peer's
    address and fail to connect. Prefixing the store with torchrun's restart count keeps
    each attempt's keys apart. Across nodes that count is per agent (a replaced pod starts
    at 0 while its peers are at 1), so multi-node launches run torchrun with
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: then every rendezvous round gets a fresh store,
    hosted by the new rank 0, with no keys to keep apart and no prefix to disagree on.
    """
    store, rank, world = next(dist.rendezvous("env://", timeout=timeout))
    prefix = "launcher"
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        prefix += f"/attempt{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    dist.init_process_group(
        backend=backend,
        store=dist.PrefixStore(prefix, store),
        rank=rank,
        world_size=world,
        timeout=timeout,
        device_id=device if device.type == "cuda" else None,
    )


def init_single_process_group(backend: str, timeout: dt.timedelta, device: torch.device) -> None:
    """A process group of this one process (`python -m launcher.train`), with the variables
    torchrun would have set, which DeepSpeed reads."""
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(name, value)
    dist.init_process_group(
        backend=backend,
        store=dist.HashStore(),
        rank=0,
        world_size=1,
        timeout=timeout,
        device_id=device if device.type == "cuda" else None,
    )


def launch_runtime(launch: LaunchState) -> Runtime:
    """This process's place in the launch between its jobs: rank, world size and the control
    group the first job created, for a front door that decides on rank 0 between jobs and
    tells the others (launcher.tune). It has no run directory of its own."""
    rank, local_rank, world = env_world()
    rt = Runtime(rank, local_rank, world, torch.device("cpu"), launch.backend, launch=launch)
    rt.control_group = launch.control_group
    return rt


def freeze_what_lasts() -> None:
    """Collect, then move every object still alive out of the garbage collector's reach, at
    the start of a job, before it builds anything.

    What is alive then outlives the job: the imports (torch's alone are some 170,000 objects,
    300,000 with torch._dynamo), Hydra's configs, the process group. A full collection walks
    all of them, 0.15-0.2 s a rank on a loaded 2-core machine: the job's collections (the
    host-peak reset at the start of its loop, `end_job` after it, and any the interpreter
    starts during training) then walk only what this job made, so that none of them costs
    a step's time, and a sweep point runs without two full collections. The collection
    first walks everything only in a process's first job; in a sweep's later points it
    walks what the previous job left, and frees its reference cycles (its loop and model)
    rather than freezing them for the rest of the sweep. The job's own objects are never
    frozen: `end_job` collects them.

    torch._dynamo is loaded first: every optimizer's first call loads it (some 130,000
    objects), so it belongs with what lasts. The collector, off since the process began
    (launcher/train/__main__.py), is on from here."""
    import torch._dynamo  # noqa: F401  (what torch.optim loads at the optimizer's first call)

    gc.collect()
    gc.freeze()
    gc.enable()


def end_job(rt: Runtime) -> None:
    """Close this job's log file; the process group stays for the next job of a sweep.

    Collects garbage first, so that the job's DDP reducer is gone before anything else
    happens to the group (see `teardown`); what outlives the job was frozen when it
    started (`freeze_what_lasts`), so this walks the job's own objects only.
    """
    gc.collect()
    if rt.log_file is not None:
        logging.getLogger().removeHandler(rt.log_file)
        rt.log_file.close()
    rt.launch.job_started = time.time()  # the next job's wall time counts from here


def teardown(launch: LaunchState, collect: bool = True) -> None:
    """Leave the process group, once, after the last job of the process.

    A DDP reducer still alive while the process group is destroyed can hang the exit on
    gloo (its destructor joins a gloo thread while holding the GIL): collect first, unless
    the caller knows every job ended through `end_job`, which collected after it (a full
    collection costs 0.2-1 s once torch is imported).
    """
    if collect:
        gc.collect()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    launch.forget_process_group()


def pick_device(choice: str, local_rank: int) -> torch.device:
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(
            "trainer.device=cuda but no CUDA device is visible; use trainer.device=cpu"
        )
    device = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def pick_backend(choice: str, device: torch.device) -> str:
    if choice != "auto":
        return choice
    return "nccl" if device.type == "cuda" else "gloo"


def apply_nccl_env(nccl: NcclConfig) -> None:
    """Export the `nccl` group's variables; NCCL reads them once, when it first starts."""
    for name, value in vars(nccl.env).items():
        if value is not None:
            os.environ[name] = str(value)


def choose_run_id(run: RunConfig) -> str:
    """The run directory's name, decided on rank 0 and broadcast to the others.

    `run.id` or `LAUNCHER_RUN_ID` win. Otherwise the name is `<time>-<key>`, where key is a
    hash of the launch's shared id (torchrun's rendezvous id, Slurm's job id): a restarted
    or requeued launch finds its earlier directory by that key and resumes in it.
    """
    if run.id:
        return str(run.id)
    if os.environ.get("LAUNCHER_RUN_ID"):
        return os.environ["LAUNCHER_RUN_ID"]
    key = launch_key()
    suffix = hashlib.sha1(key.encode()).hexdigest()[:8] if key else secrets.token_hex(4)
    root = Path(run.root).expanduser()
    if key and root.is_dir():
        earlier = sorted(p.name for p in root.glob(f"*-{suffix}") if p.is_dir())
        if earlier:
            return earlier[-1]
    return f"{dt.datetime.now():%Y%m%d-%H%M%S}-{suffix}"


def seed_everything(seed: int) -> None:
    """Same seed on every rank: identical initial weights; data order has its own seed."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# A line about the launch, not its job (the process group, made once for every job of the
# process): on the console even while the jobs' own lines are quiet.
LAUNCH_LINE = {"launch_line": True}


def _configure_console_logging(rank: int, only: str | None = None) -> None:
    """Rank 0's INFO lines and every rank's warnings on stderr; with `only`, INFO lines of
    that logger alone and the launch's own (a tuner's trial is a job whose start-up the
    tuner's line replaces; its warnings still show: a trial folder moved aside, a
    straggler)."""
    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(logging.INFO)
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    console.setFormatter(logging.Formatter(LOG_FORMAT.format(rank=rank), "%H:%M:%S"))
    # records marked file_only (launcher.resilience.first_failure.FILE_ONLY) stay in the log
    console.addFilter(lambda record: not getattr(record, "file_only", False))
    if only is not None:
        console.addFilter(
            lambda r: r.levelno >= logging.WARNING or r.name == only or hasattr(r, "launch_line")
        )
    root.addHandler(console)
    logging.captureWarnings(True)


class RankLogFile(logging.FileHandler):
    """logs/rank<r>.log. On a full disk a record that cannot be written is dropped
    silently (the console still has it, and the error line says the disk is full), not
    reported with logging's traceback for every line that follows."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError) and exc.errno in disk.NO_SPACE:
            return
        super().handleError(record)

    def close(self) -> None:
        try:
            super().close()
        except OSError as exc:  # its last lines cannot be flushed to a full disk
            if exc.errno not in disk.NO_SPACE:
                raise


def _add_file_logging(rt: Runtime) -> logging.Handler:
    handler = RankLogFile(rt.run_dir / "logs" / f"rank{rt.rank}.log")
    handler.setFormatter(logging.Formatter(LOG_FORMAT.format(rank=rt.rank)))
    logging.getLogger().addHandler(handler)
    return handler
