"""The typed configuration schema, composition, and the semantic `validate` step.

Hydra composes `conf/train.yaml` from its groups on top of `TrainConfig`, so a wrong key or
type is rejected while composing. `validate` then rejects combinations that are each valid
alone but impossible together (a batch that does not divide, a file that is not there),
naming the key path. Both raise `ConfigError`, whose message is the one line a user sees.
"""

from __future__ import annotations

import difflib
import glob
import os
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

from launcher.nccl_vars import NcclEnv
from launcher.ranges import range_problem

CONFIG_MODULE = "launcher.conf"
CONFIG_NAME = "train"

LOGGER_MODES = ("online", "offline", "disabled")
PRECISIONS = ("fp32", "bf16", "fp16")
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune")
DATA_SOURCES = ("stdlib", "text_files", "wikitext2", "memmap", "synthetic")
DEVICES = ("auto", "cpu", "cuda")
BACKENDS = ("auto", "gloo", "nccl")
OFFLOAD_DEVICES = ("none", "cpu")
COMM_HOOKS = ("none", "fp16", "bf16", "powersgd")
PROFILERS = ("off", "steps", "full")
FAULT_KINDS = ("none", "stall", "sigstop", "exit", "oom", "loader_error", "slow", "slow_data")


class ConfigError(ValueError):
    """A configuration problem, worded as the single line the user will see."""


@dataclass
class RunConfig:
    root: str = "runs"
    id: str | None = None


@dataclass
class ModelConfig:
    name: str = MISSING
    n_layer: int = MISSING
    n_head: int = MISSING
    n_embd: int = MISSING
    n_positions: int = 1024
    vocab_size: int | None = None
    vocab_multiple: int = 64
    dropout: float = 0.0
    init_from: str | None = None


@dataclass
class DataConfig:
    source: str = "stdlib"
    paths: list[str] = field(default_factory=list)
    val_paths: list[str] = field(default_factory=list)
    max_bytes: int | None = None
    hf_path: str = "Salesforce/wikitext"
    hf_name: str | None = "wikitext-2-raw-v1"
    dtype: str = "uint16"
    vocab_size: int | None = None
    tokenizer: str = "auto"
    bpe_vocab_size: int = 8192
    val_fraction: float = 0.05
    cache_dir: str = "~/.cache/launcher"
    shard_tokens: int = 100_000_000
    num_workers: int = 2
    pin_memory: bool = True
    persistent_workers: bool | None = None  # null: true when num_workers > 0
    prefetch_factor: int = 2


@dataclass
class TrainerConfig:
    max_steps: int = 200
    global_batch_size: int | None = 16
    micro_batch_size: int = 4
    seq_len: int = 128
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 20
    lr_decay_steps: int | None = None
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    fused_adamw: bool = True
    precision: str = "fp32"
    compile: str = "off"
    grad_checkpointing: bool = False
    seed: int = 1337
    device: str = "auto"
    log_interval: int = 10
    eval_interval: int = 100
    eval_batches: int = 4
    checkpoint_interval: int = 100
    keep_checkpoints: int = 2
    async_checkpoint: bool = False  # strategy=fsdp2: files written while training goes on


@dataclass
class StrategyConfig:
    """What every engine has. Each engine's schema extends it and is registered as that
    option's schema (`conf/strategy/<engine>.yaml` names `<engine>_schema` first), so a key
    of another engine is an unknown key, not a setting silently ignored."""

    name: str = MISSING
    time_comm: bool = True


@dataclass
class DDPConfig(StrategyConfig):
    name: str = "ddp"
    bucket_cap_mb: float = 25.0
    gradient_as_bucket_view: bool = True
    static_graph: bool = False
    find_unused_parameters: bool = False
    broadcast_buffers: bool = True
    comm_hook: str = "none"
    powersgd_rank: int = 4
    powersgd_warmup_steps: int | None = None  # null: trainer.warmup_steps
    powersgd_min_compression_rate: float = 2.0


@dataclass
class DeepSpeedConfig(StrategyConfig):
    """strategy=deepspeed (and its presets zero1-3); see docs/deepspeed.md."""

    name: str = "deepspeed"
    zero_stage: int = 2
    offload_optimizer: str = "none"  # none | cpu: optimizer states and step on the CPU
    offload_param: str = "none"  # none | cpu: ZeRO-3 parameters live on the CPU
    overlap_comm: bool | None = None  # null: DeepSpeed's default for the stage
    reduce_bucket_size: int = 500_000_000  # elements per gradient reduction bucket
    allgather_bucket_size: int = 500_000_000  # elements per parameter all-gather (ZeRO-1/2)
    extra: dict[str, Any] = field(default_factory=dict)  # any other DeepSpeed config key


@dataclass
class FSDP2Config(StrategyConfig):
    """strategy=fsdp2: torch's fully_shard per GPT-2 block, then the root; see
    docs/strategies.md."""

    name: str = "fsdp2"
    reshard_after_forward: Any = True  # true | false | an int: reshard to that many ranks
    reduce_dtype: str = "fp32"  # fp32 | bf16: the dtype gradients are reduce-scattered in
    offload: str = "none"  # none | cpu: sharded parameters, gradients, optimizer on the CPU


# `strategy.name` -> its schema. A new engine adds its schema here and a
# conf/strategy/<name>.yaml whose defaults list starts with `<name>_schema`.
ENGINES: dict[str, type[StrategyConfig]] = {
    "ddp": DDPConfig,
    "deepspeed": DeepSpeedConfig,
    "fsdp2": FSDP2Config,
}


@dataclass
class DistConfig:
    backend: str = "auto"
    timeout_s: int = 900


@dataclass
class WatchdogConfig:
    """Hang detection on every rank (docs/faults.md). A hang is no completed step for
    max(min_s, step_multiple x the recent median step time); then every rank that can still
    run writes its stacks and flight-recorder buffer to logs/ and the job exits with 5."""

    enabled: bool = True
    step_multiple: float = 10.0
    min_s: float = 120.0  # never sooner: log, eval and checkpoint steps take longer
    first_step_s: float = 600.0  # the first step of a launch: compilation, warm-up, caches
    checkpoint_s: float = 600.0  # while a checkpoint is written
    flight_recorder_entries: int = 2000  # recent collectives kept per rank; 0: recorder off
    straggler_frac: float = 0.2  # a rank whose compute is this much above the others'...
    straggler_intervals: int = 3  # ...for this many log intervals in a row is named


@dataclass
class FaultConfig:
    """Rehearse a failure on purpose (docs/faults.md); `kind=none` (the default) does nothing.

    stall: rank `rank` sleeps `seconds` when step `step` starts; sigstop: it stops itself
    (SIGSTOP: frozen, as a process stuck in a driver is); exit: it exits with `exit_code`;
    oom: it raises an out-of-memory error; loader_error: its data loader raises for that
    step; slow: it spends `seconds` more in every step from `step` on (a straggler);
    slow_data: every rank's data source takes `seconds` for each micro-batch it reads (storage
    with a high latency, such as a busy network file system; `rank` and `step` do not apply).
    """

    kind: str = "none"
    rank: int = 0
    step: int = 1
    seconds: float = 60.0
    exit_code: int = 1
    once: bool = True  # fire in one attempt only: a restart or requeue then resumes past it


@dataclass
class NcclConfig:
    name: str = "default"
    env: NcclEnv = field(default_factory=NcclEnv)


@dataclass
class ProfilerConfig:
    name: str = "off"
    ranks: list[int] = field(default_factory=list)  # empty: every rank
    skip_first: int = 10
    wait: int = 0
    warmup: int = 2
    active: int = 3
    repeat: int = 1
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    memory_snapshot: bool = False  # GPU: allocation history and a snapshot per trace


@dataclass
class LoggerConfig:
    """Where metrics go besides metrics.jsonl (see docs/logging.md): Weights & Biases unless
    `mode` is disabled (`logger=none` keeps it so), and TensorBoard when `tensorboard` is
    true (`logger=tensorboard`; both: `logger=[wandb,tensorboard]`). The API key is never a
    config key: wandb reads WANDB_API_KEY from the environment."""

    mode: str = "disabled"
    project: str = "launcher"
    entity: str | None = None
    tags: list[str] = field(default_factory=list)
    group: str | None = None
    name: str | None = None  # the W&B run's name; null: the run id
    dir: str | None = None  # W&B files go to <dir>/wandb/; null: the run directory
    tensorboard: bool = False  # event files in <run dir>/tb/ (rank 0)


@dataclass
class SlurmConfig:
    """sbatch settings (cluster=slurm); see docs/slurm.md. A null leaves the choice to the
    cluster's defaults (no `#SBATCH` line is written for it)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    cpus_per_task: int | None = None  # CPUs for one node's torchrun and all its workers
    mem: str | None = None  # per node, as sbatch takes it: 500G, 0 (all of the node's)
    exclusive: bool = False
    constraint: str | None = None
    gpu_request: str = "gpus-per-node"  # or gres: --gres=gpu:N (clusters without cons_tres)
    extra_sbatch: list[str] = field(default_factory=list)  # more `#SBATCH` options, verbatim
    container_image: str | None = None  # pyxis/enroot: srun --container-image
    container_mounts: list[str] = field(default_factory=list)  # besides workdir and run root
    modules: list[str] = field(default_factory=list)  # `module load` each, in order
    venv: str | None = None  # a virtual environment to activate on every node
    signal_lead_s: int = 300  # Slurm warns (USR1) this long before the time limit
    requeue: bool = True  # on the warning or a hang: requeue while the checkpoint advances
    max_requeues: int | None = 20  # requeues of one job (SLURM_RESTART_COUNT); null: no cap
    rdzv_port_range: int = 1000  # rendezvous port: cluster.rdzv_port + job id mod this
    step_time_s: float | None = None  # a measured step time: checks time_limit (docs/slurm.md)


@dataclass
class K8sConfig:
    """Kubernetes manifest settings (cluster=k8s); see docs/kubernetes.md.

    Every pod runs one torchrun for one node; memory and /dev/shm are per pod.
    """

    kind: str = "job"  # job (Indexed Job + headless Service), jobset, pytorchjob
    name: str | None = None  # the objects' name; null: <cluster.job_name>-<run id>
    namespace: str | None = None  # null: kubectl's current namespace
    image: str = "launcher:latest"  # an image with this project and its torch installed
    image_pull_policy: str | None = None  # null: Always for :latest/untagged, else IfNotPresent
    image_pull_secrets: list[str] = field(default_factory=list)
    service_account: str | None = None
    cpu: str | None = None  # CPU request per pod; null: processes x (1 + DataLoader workers)
    memory: str = "64Gi"  # for the processes; the container limit adds /dev/shm's size
    guaranteed: bool = False  # Guaranteed QoS: CPU limit = request (whole CPUs)
    gpu_resource: str = "nvidia.com/gpu"  # the extended resource cluster.gpus_per_node counts
    rdma_resource: str | None = None  # e.g. rdma/ib: RDMA devices for nccl=infiniband
    rdma_per_node: int = 1  # how many of rdma_resource each pod requests
    shm_size: str | None = None  # /dev/shm sizeLimit; null: the loaders' need + shm_margin
    shm_margin: str = "1Gi"  # on top of the loaders' need: NCCL's shared-memory transport etc.
    runs_pvc: str = "launcher-runs"  # PersistentVolumeClaim (ReadWriteMany) mounted at run.root
    wandb_secret: str | None = "wandb"  # Secret holding WANDB_API_KEY; null: none
    wandb_secret_key: str = "api-key"  # the key inside that Secret
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[Any] = field(default_factory=list)
    affinity: dict[str, Any] = field(default_factory=dict)
    priority_class: str | None = None
    labels: dict[str, str] = field(default_factory=dict)  # added to every object and pod
    annotations: dict[str, str] = field(default_factory=dict)  # added to the pods
    security: str = "default"  # or restricted: Pod Security 'restricted' (docs/kubernetes.md)
    run_as_user: int = 1000  # the UID with security=restricted (runAsNonRoot needs one)
    gang: str = "none"  # none, kueue (queue-name label, suspended) or volcano (min members)
    queue: str | None = None  # the Kueue LocalQueue or the Volcano queue
    backoff_limit_per_node: int = 3  # failed pods tolerated per node (disruptions not counted)
    max_restarts: int = 3  # torchrun --max-restarts: re-rendezvous when a peer pod is replaced
    rdzv_timeout_s: int = 900  # how long torchrun waits for all pods to join (join_timeout)
    termination_grace_s: int = 120  # SIGTERM -> SIGKILL: time to write the stop checkpoint
    step_time_s: float | None = None  # a measured step time: checks termination_grace_s
    checkpoint_write_s: float = 30  # how long one checkpoint write takes (measure; docs)
    ttl_after_finished_s: int | None = None  # delete the finished Job after this long


@dataclass
class ClusterConfig:
    """Where the job runs. `local` is torchrun on this machine; `slurm` and `k8s` are what
    `python -m launcher.submit` renders (docs/slurm.md, docs/kubernetes.md)."""

    name: str = "local"
    nodes: int = 1
    gpus_per_node: int = 0  # 0: a CPU-only job (gloo)
    procs_per_node: int | None = None  # null: gpus_per_node, or 1 without GPUs
    job_name: str | None = None  # null: launcher-<exp or model>, e.g. launcher-bucket_sweep
    time_limit: str | None = None  # [D-]HH:MM:SS; null: the cluster's default
    rdzv_port: int = 29500  # c10d rendezvous on the first node (Slurm: the range's start)
    workdir: str | None = None  # where the job starts (the checkout); null: submit's cwd
    setup: list[str] = field(default_factory=list)  # shell lines run before torchrun
    env: dict[str, str] = field(default_factory=dict)  # extra environment variables
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    k8s: K8sConfig = field(default_factory=K8sConfig)


@dataclass
class TuneConfig:
    """`python -m launcher.tune`'s rounds (docs/tuning.md); launcher.train ignores it.

    A candidate is kept when its median step time beats the incumbent's by more than
    `noise_multiple` x the measured noise (the larger spread of the two sets of repeats)
    and by at least `min_gain` of the incumbent's step time."""

    budget_s: float = 1800.0  # wall time for the rounds; the confirmation runs come after
    trial_steps: int = 12  # steps of each timed trial, warm-up included
    warmup_steps: int = 3  # a trial's first steps, not timed: start-up, DDP's bucket rebuild
    repeats: int = 3  # timed trials of each candidate and of the incumbent, every round
    loss_tolerance: float = 0.02  # math-changing candidates: |mean loss diff| / incumbent's
    min_gain: float = 0.05  # the smallest speed-up worth keeping, as a fraction of a step
    noise_multiple: float = 1.0  # how many measured spreads a gain must exceed
    max_rounds: int = 6
    confirm_steps: int = 40  # steps of each confirmation run (baseline and winner)
    skip: list[str] = field(default_factory=list)  # keys never to change: [strategy.comm_hook]


@dataclass
class TrainConfig:
    run: RunConfig = field(default_factory=RunConfig)
    resume: str = "auto"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    nccl: NcclConfig = field(default_factory=NcclConfig)
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    tune: TuneConfig = field(default_factory=TuneConfig)


def register_schema() -> None:
    """Register `TrainConfig` so `train.yaml` can name it first in its defaults list, and
    each engine's schema for its `strategy` option to name first in its own."""
    store = ConfigStore.instance()
    store.store(name="train_schema", node=TrainConfig)
    for name, schema in ENGINES.items():
        store.store(group="strategy", name=f"{name}_schema", node=schema)


register_schema()


def compose(overrides: list[str], sweep: bool = False) -> DictConfig:
    """Compose the training config as `launcher.train` would, raising `ConfigError`.

    Used by the front doors that do not run under `@hydra.main` (doctor, submit) and by
    `launcher.train` to check the overrides before Hydra starts any job. `sweep=True`
    composes as Hydra's multirun does (sweep values such as `key=a,b` are accepted) and
    keeps the `hydra` node, whose `mode` and `sweeper.params` say what a sweep will run.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
            if not sweep:
                return hydra_compose(config_name=CONFIG_NAME, overrides=overrides)
            return GlobalHydra.instance().hydra.compose_config(
                config_name=CONFIG_NAME,
                overrides=overrides,
                run_mode=RunMode.MULTIRUN,
                validate_sweep_overrides=False,
            )
    except Exception as exc:  # noqa: BLE001 - every composition failure becomes one line
        raise ConfigError(describe_compose_error(exc)) from exc
    finally:
        GlobalHydra.instance().clear()


def friendly_overrides(overrides: list[str]) -> list[str]:
    """The overrides with a single value given to a list key made a one-element list.

    `data.paths=/data/*.txt` means `data.paths=[/data/*.txt]`; the schema would refuse the
    string. Sweeps (`key=a,b`) and anything that does not parse are left as they are, for
    Hydra to judge. The entry points apply this to the command line before composing, so
    Hydra's own composition of each job sees the same overrides.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType, ValueType
    from hydra.errors import HydraException

    out = []
    for text in overrides:
        try:
            (override,) = OverridesParser.create().parse_overrides([text])
        except HydraException:
            out.append(text)
            continue
        value = override.value() if override.value_type == ValueType.ELEMENT else None
        wrap = (
            override.type in (OverrideType.CHANGE, OverrideType.ADD, OverrideType.FORCE_ADD)
            and value is not None
            and not isinstance(value, (list, dict))
            and isinstance(_schema_node(override.key_or_group), ListConfig)
        )
        prefix = text[: len(text) - len(text.lstrip("+~"))]
        element = override.get_value_element_as_str() if wrap else ""
        out.append(f"{prefix}{override.key_or_group}=[{element}]" if wrap else text)
    return out


def _schema_node(key: str) -> Any:
    """The schema's node at a dotted key (engine keys looked up in every engine), or None."""
    head, _, rest = key.partition(".")
    if head == "strategy" and rest:
        engines = (OmegaConf.structured(schema) for schema in ENGINES.values())
        nodes = (e._get_node(rest, validate_access=False) for e in engines)
        return next((n for n in nodes if n is not None), None)
    parent, _, leaf = key.rpartition(".")
    root = OmegaConf.structured(TrainConfig)
    holder = OmegaConf.select(root, parent, default=None) if parent else root
    return holder._get_node(leaf, validate_access=False) if isinstance(holder, DictConfig) else None


def describe_compose_error(exc: BaseException) -> str:
    """Turn Hydra's and OmegaConf's multi-line errors into one line naming key and fix."""
    from hydra.errors import MissingConfigException
    from omegaconf.errors import (
        ConfigAttributeError,
        ConfigKeyError,
        OmegaConfBaseException,
        ValidationError,
    )

    chain: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in chain:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    for err in chain:
        if isinstance(err, MissingConfigException):
            group = (err.missing_cfg_file or "").split("/")[0]
            options = ", ".join(sorted(err.options or []))
            wanted = (err.missing_cfg_file or "").split("/")[-1]
            if options:
                return f"{group}={wanted}: no such option; choose one of: {options}"
            return f"{err.missing_cfg_file}: config not found"
    for err in chain:
        if isinstance(err, (ConfigKeyError, ConfigAttributeError)):
            key = str(err.full_key or getattr(err, "key", "?"))
            return unknown_key_line(key, err.object_type, "check the spelling, or see")
        if isinstance(err, ValidationError):
            key = err.full_key or "?"
            if isinstance(_schema_node(key), ListConfig):
                return (
                    f"{key}: a list is expected; write {key}='[{err.value}]' "
                    f"(quoted, so the shell keeps the brackets), or [a,b] for several"
                )
            first = str(err.msg).splitlines()[0]
            return f"{key}: {first}; give a value of the right type"
        if isinstance(err, OmegaConfBaseException) and getattr(err, "full_key", None):
            return f"{err.full_key}: {str(err.msg).splitlines()[0]}"
    text = " ".join(str(exc).split())
    return f"bad override: {text}"


def unknown_key_line(key: str, parent_type: Any, advice: str = "see") -> str:
    """`<key>: unknown key` with the closest keys of its parent's schema, and, for a key of
    another engine than the chosen one, which engine has it."""
    parent, _, leaf = key.rpartition(".")
    known = [f.name for f in fields(parent_type)] if is_dataclass(parent_type) else []
    close = difflib.get_close_matches(leaf, known, n=3)
    hint = f" (did you mean {', '.join(f'{parent}.{c}' if parent else c for c in close)}?)"
    hint = hint if close else ""
    if parent == "strategy" and is_dataclass(parent_type):
        chosen = next((n for n, s in ENGINES.items() if s is parent_type), "?")
        owners = [n for n, s in ENGINES.items() if leaf in {f.name for f in fields(s)}]
        if owners:
            hint = (
                f" for strategy={chosen}: it is a key of strategy={'/'.join(owners)}, "
                f"which this engine does not read"
            )
    return f"{key}: unknown key{hint}; {advice} docs/configuration.md"


def _choice(cfg: DictConfig, key: str, allowed: tuple[str, ...]) -> None:
    value = OmegaConf.select(cfg, key)
    if value not in allowed:
        raise ConfigError(f"{key}={value}: not one of {', '.join(allowed)}")


def normalize(cfg: DictConfig, world_size: int) -> None:
    """Resolve the values that have a spelled-out default.

    YAML's boolean spellings of `trainer.compile` (off/on/true/false) become modes, a
    null `trainer.global_batch_size` becomes one micro-batch per rank (no accumulation),
    and a null `data.persistent_workers` follows `data.num_workers` (workers kept when
    there are any).
    """
    mode = str(cfg.trainer.compile).lower()
    cfg.trainer.compile = {"false": "off", "none": "off", "true": "default", "on": "default"}.get(
        mode, mode
    )
    if cfg.trainer.global_batch_size is None and isinstance(cfg.trainer.micro_batch_size, int):
        cfg.trainer.global_batch_size = cfg.trainer.micro_batch_size * world_size
    if cfg.data.persistent_workers is None and isinstance(cfg.data.num_workers, int):
        cfg.data.persistent_workers = cfg.data.num_workers > 0
    if cfg.strategy.get("powersgd_warmup_steps", 0) is None:
        cfg.strategy.powersgd_warmup_steps = cfg.trainer.warmup_steps


def validate(cfg: DictConfig, world_size: int) -> None:
    """Reject impossible values and combinations before any process group or worker starts.

    Order matters: unknown keys, then every numeric key's range (docs/configuration.md),
    then choices, then the rules that relate keys, so that each later check may assume
    the earlier ones held (no division by a zero `model.n_head`).
    """
    normalize(cfg, world_size)
    _reject_unknown_keys(cfg, "")
    problem = range_problem(cfg)
    if problem:
        raise ConfigError(problem)
    t, d, m = cfg.trainer, cfg.data, cfg.model
    _choice(cfg, "logger.mode", LOGGER_MODES)
    _choice(cfg, "trainer.precision", PRECISIONS)
    _choice(cfg, "trainer.compile", COMPILE_MODES)
    _choice(cfg, "trainer.device", DEVICES)
    _choice(cfg, "dist.backend", BACKENDS)
    _choice(cfg, "data.source", DATA_SOURCES)
    _choice(cfg, "profiler.name", PROFILERS)
    _validate_engine(cfg)
    per_step = t.micro_batch_size * world_size
    if t.global_batch_size % per_step:
        raise ConfigError(
            f"trainer.global_batch_size={t.global_batch_size} is not divisible by "
            f"trainer.micro_batch_size={t.micro_batch_size} x world size {world_size} = "
            f"{per_step}; choose a global batch that is a multiple of {per_step}"
        )
    if t.seq_len > m.n_positions:
        raise ConfigError(
            f"trainer.seq_len={t.seq_len} exceeds model.n_positions={m.n_positions}; "
            f"shorten the sequence or raise model.n_positions"
        )
    if m.n_embd % m.n_head:
        raise ConfigError(f"model.n_embd={m.n_embd} is not divisible by model.n_head={m.n_head}")
    if d.num_workers == 0 and d.persistent_workers:
        raise ConfigError(
            "data.persistent_workers=true needs data.num_workers>0; "
            "set data.persistent_workers=false (or leave it null) or add workers"
        )
    _validate_data_files(d)
    _validate_profiler(cfg.profiler, t.max_steps, world_size)
    _validate_watchdog(cfg.watchdog, cfg.dist.timeout_s)
    _validate_fault(cfg, world_size)
    if t.async_checkpoint and cfg.strategy.name != "fsdp2":
        raise ConfigError(
            f"trainer.async_checkpoint=true needs strategy=fsdp2 (DCP's asynchronous save); "
            f"strategy={cfg.strategy.name} writes its checkpoints synchronously"
        )
    engine_rules = {
        "ddp": _validate_ddp,
        "deepspeed": _validate_deepspeed,
        "fsdp2": _validate_fsdp2,
    }
    if cfg.strategy.name in engine_rules:
        engine_rules[cfg.strategy.name](cfg, world_size)
    _validate_resume(cfg)


def _validate_engine(cfg: DictConfig) -> None:
    """`strategy.name` must be the engine whose schema the strategy option loaded."""
    name, loaded = cfg.strategy.name, OmegaConf.get_type(cfg.strategy)
    if name not in ENGINES:
        raise ConfigError(f"strategy.name={name}: not one of {', '.join(ENGINES)}")
    if ENGINES[name] is not loaded:
        chosen = next((n for n, s in ENGINES.items() if s is loaded), "?")
        raise ConfigError(
            f"strategy.name={name} does not match the strategy option (strategy={chosen}); "
            f"choose the engine with strategy={name}, not with strategy.name"
        )


def _validate_profiler(p: DictConfig, max_steps: int, world_size: int) -> None:
    outside = [r for r in p.ranks if not r < world_size]
    if outside:
        raise ConfigError(
            f"profiler.ranks={list(p.ranks)}: rank(s) {outside} do not exist in a job of "
            f"{world_size} rank(s); give ranks 0..{world_size - 1} or [] for all"
        )
    if p.name == "off":
        return
    cycle = p.wait + p.warmup + p.active
    cycles = max(p.repeat, 1)
    needed = p.skip_first + cycles * cycle
    if needed <= max_steps:
        return
    first = p.skip_first + p.wait + p.warmup + 1
    recorded = (
        "nothing would be recorded"
        if first > max_steps
        else f"only steps {first}-{min(first + p.active - 1, max_steps)} would be recorded"
    )
    raise ConfigError(
        f"profiler: profiler.skip_first={p.skip_first} then {cycles} cycle(s) of "
        f"wait={p.wait} + warmup={p.warmup} + active={p.active} steps need {needed} steps but "
        f"trainer.max_steps={max_steps}, so {recorded}; lower profiler.skip_first "
        f"(or repeat, wait, warmup, active) or raise trainer.max_steps"
    )


def _validate_watchdog(w: DictConfig, dist_timeout_s: int) -> None:
    """The allowances must end before a collective times out (ranges are in ranges.py)."""
    if not w.enabled:
        return
    for key in ("min_s", "first_step_s", "checkpoint_s"):
        if w[key] >= dist_timeout_s:
            raise ConfigError(
                f"watchdog.{key}={w[key]} is not below dist.timeout_s={dist_timeout_s}: a "
                "collective would time out before the hang is explained; lower it or raise "
                "dist.timeout_s"
            )


def _validate_fault(cfg: DictConfig, world_size: int) -> None:
    f = cfg.fault
    _choice(cfg, "fault.kind", FAULT_KINDS)
    if f.kind == "none":
        return
    if not 0 <= f.rank < world_size:
        raise ConfigError(
            f"fault.rank={f.rank}: no such rank in a job of {world_size}; give 0..{world_size - 1}"
        )
    if not 1 <= f.step <= cfg.trainer.max_steps:
        raise ConfigError(
            f"fault.step={f.step}: the fault would never fire; give a step within "
            f"1..trainer.max_steps={cfg.trainer.max_steps}"
        )


def _validate_ddp(cfg: DictConfig, world_size: int) -> None:
    """strategy=ddp: the compression hook, and what PowerSGD cannot do."""
    s = cfg.strategy
    _choice(cfg, "strategy.comm_hook", COMM_HOOKS)
    if s.comm_hook == "powersgd" and cfg.trainer.precision == "fp16":
        raise ConfigError(
            "strategy.comm_hook=powersgd does not work with trainer.precision=fp16: its error "
            "feedback would keep loss-scaled (and overflowed) gradients; use bf16 or fp32"
        )


def _validate_deepspeed(cfg: DictConfig, world_size: int) -> None:
    """strategy=deepspeed: the stage, offload and `strategy.extra` against trainer.*."""
    s, t = cfg.strategy, cfg.trainer
    _choice(cfg, "strategy.offload_optimizer", OFFLOAD_DEVICES)
    _choice(cfg, "strategy.offload_param", OFFLOAD_DEVICES)
    if s.offload_optimizer != "none" and s.zero_stage == 0:
        raise ConfigError(
            "strategy.offload_optimizer=cpu needs ZeRO: set strategy.zero_stage to 1, 2 or 3"
        )
    if s.offload_param != "none" and s.zero_stage != 3:
        raise ConfigError(
            f"strategy.offload_param={s.offload_param} needs strategy.zero_stage=3 (only ZeRO-3 "
            f"partitions parameters; zero_stage is {s.zero_stage})"
        )
    if t.compile != "off":
        raise ConfigError(
            f"trainer.compile={t.compile} is not supported with strategy=deepspeed; "
            "use trainer.compile=off (or strategy=ddp to compile)"
        )
    if t.precision == "fp16" and _fp16_refused_on_cpu(t.device):
        raise ConfigError(
            "trainer.precision=fp16 with strategy=deepspeed needs a GPU or a CPU with AVX-512 "
            "FP16 (DeepSpeed refuses fp16 on this CPU); use trainer.precision=bf16 or fp32"
        )
    from launcher.strategy.ds_config import DeepSpeedConfigError, build_ds_config

    try:
        build_ds_config(cfg, world_size)
    except DeepSpeedConfigError as exc:
        raise ConfigError(str(exc)) from exc


def _validate_fsdp2(cfg: DictConfig, world_size: int) -> None:
    """strategy=fsdp2: reshard_after_forward's three forms, dtypes, offload."""
    s = cfg.strategy
    _choice(cfg, "strategy.reduce_dtype", ("fp32", "bf16"))
    _choice(cfg, "strategy.offload", OFFLOAD_DEVICES)
    raf = s.reshard_after_forward
    if not isinstance(raf, bool):
        divides = isinstance(raf, int) and 1 < raf < world_size and world_size % raf == 0
        if not divides:
            raise ConfigError(
                f"strategy.reshard_after_forward={raf}: give true, false, or a number of ranks "
                f"to reshard to that divides the world size {world_size} (neither 1 nor "
                f"{world_size} itself)"
            )
    if cfg.trainer.precision == "fp16":
        raise ConfigError(
            "trainer.precision=fp16 is not supported with strategy=fsdp2 (it would need a "
            "sharded loss scaler); use trainer.precision=bf16 or fp32"
        )


def _fp16_refused_on_cpu(device: str) -> bool:
    """Whether the run will be on a CPU whose oneDNN has no fp16: DeepSpeed's check."""
    import torch

    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        return False
    try:
        return not torch.ops.mkldnn._is_mkldnn_fp16_supported()
    except (AttributeError, RuntimeError):
        return True


def _reject_unknown_keys(node: DictConfig, prefix: str) -> None:
    """Catch keys added with Hydra's `+key=value`, which composition lets through. Each
    node is judged by its own schema: the `strategy` node by the chosen engine's."""
    schema_type = OmegaConf.get_type(node)
    if not is_dataclass(schema_type):
        return  # a free-form mapping such as strategy.extra or cluster.env
    known = {f.name for f in fields(schema_type)}
    for key in node:
        path = f"{prefix}{key}"
        if key not in known:
            raise ConfigError(unknown_key_line(path, schema_type))
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            _reject_unknown_keys(child, f"{path}.")


def _validate_data_files(d: DictConfig) -> None:
    if d.source == "text_files":
        if not d.paths:
            raise ConfigError(
                "data.paths is empty; give text file globs, e.g. data.paths=[a/*.txt]"
            )
        for pattern in d.paths:
            if not glob.glob(os.path.expanduser(pattern), recursive=True):
                raise ConfigError(f"data.paths: no file matches {pattern!r}; fix the glob or path")
    if d.source == "memmap":
        if not d.paths:
            raise ConfigError("data.paths is empty; give pre-tokenized .bin files")
        for path in list(d.paths) + list(d.val_paths):
            if not Path(os.path.expanduser(path)).is_file():
                raise ConfigError(f"data.paths: {path} does not exist; give pre-tokenized files")
        if d.vocab_size is None:
            raise ConfigError("data.vocab_size is not set; memmap data needs its vocabulary size")
    if d.source == "memmap" or d.source == "synthetic":
        _dtype_ok(d)
    if d.source == "synthetic" and d.vocab_size is None:
        raise ConfigError("data.vocab_size is not set; synthetic data needs a vocabulary size")


def _dtype_ok(d: DictConfig) -> None:
    if d.dtype not in ("uint16", "uint32"):
        raise ConfigError(f"data.dtype={d.dtype}: not one of uint16, uint32")


def _validate_resume(cfg: DictConfig) -> None:
    from launcher.checkpoint import find_resumable

    if cfg.resume in ("auto", "never", "archive"):
        return
    path = Path(os.path.expanduser(cfg.resume))
    if find_resumable(path) is None:
        raise ConfigError(
            f"resume={cfg.resume}: no complete checkpoint there; give a run directory, "
            f"its checkpoints/ folder or a step_<n> folder, or use resume=auto"
        )
