"""The typed configuration schema: one dataclass per config group; each strategy engine's
is declared by the engine (launcher.config.registry).

Hydra composes `conf/train.yaml` from its groups on top of `TrainConfig` (registered in
Hydra's ConfigStore as `train_schema`), so a wrong key or type is rejected while composing.
The `strategy` node takes the chosen engine's schema (`conf/strategy/<engine>.yaml` names
`<engine>_schema` first), so a key of another engine is an unknown key. The `cluster` node
holds a section per built-in backend, and an added backend's when it is chosen
(launcher.config.backends).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from launcher.config import backends
from launcher.config.fault_kinds import kind_names
from launcher.config.nccl_vars import NcclEnv
from launcher.config.ranges import (
    AT_LEAST_1,
    BELOW_1,
    FRACTION,
    NON_NEGATIVE,
    POSITIVE,
    Range,
    choices_of,
    one_of,
    ranged,
    ranges_of,
)
from launcher.config.registry import StrategyConfig, engines
from launcher.paths import ACCESS_MODES

CONFIG_MODULE = "launcher.conf"
CONFIG_NAME = "train"

LOGGER_MODES = ("online", "offline", "disabled")
PRECISIONS = ("fp32", "bf16", "fp16")
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune")
DATA_SOURCES = ("stdlib", "text_files", "wikitext2", "memmap", "synthetic")
DEVICES = ("auto", "cpu", "cuda")
BACKENDS = ("auto", "gloo", "nccl")
PROFILERS = ("off", "steps", "full")
MODEL_IMPLS = ("native", "hf")
ATTENTION_BACKENDS = ("auto", "flash", "efficient", "cudnn", "math")
BURNIN_ACTIONS = ("warn", "refuse")
NONFINITE_POLICIES = ("stop", "skip", "rewind")
OOM_POLICIES = ("stop", "retry")
AUTO = "auto"  # trainer.micro_batch_size=auto: the largest that fits, found at start


@dataclass
class RunConfig:
    root: str = "runs"
    id: str | None = None
    # who may read the run directory besides you: private (0700), group (0750), world
    # (0755); its files are reachable only through it (docs/run-directory.md)
    access: str = one_of("private", tuple(ACCESS_MODES))
    # report.png at the end of the run (rank 0: about a second of CPU for matplotlib);
    # false for runs nobody looks at one by one, such as the points of a large sweep
    report: bool = True


@dataclass
class ModelConfig:
    name: str = MISSING
    n_layer: int = ranged(MISSING, AT_LEAST_1)
    n_head: int = ranged(MISSING, AT_LEAST_1)
    n_embd: int = ranged(MISSING, AT_LEAST_1)
    n_positions: int = ranged(1024, AT_LEAST_1)
    vocab_size: int | None = ranged(None, AT_LEAST_1)
    vocab_multiple: int = ranged(64, AT_LEAST_1)
    dropout: float = ranged(0.0, BELOW_1)
    init_from: str | None = None
    # native (launcher.model.gpt2) or hf (transformers' GPT2LMHeadModel)
    impl: str = one_of("native", MODEL_IMPLS)
    bias: bool = True  # biases in linears and LayerNorms (GPT-2's weights have them)
    # SDPA's kernel: auto (PyTorch picks), flash, efficient, cudnn, math
    attention: str = one_of("auto", ATTENTION_BACKENDS)


@dataclass
class DataConfig:
    source: str = one_of("stdlib", DATA_SOURCES)
    paths: list[str] = field(default_factory=list)
    val_paths: list[str] = field(default_factory=list)
    max_bytes: int | None = ranged(None, AT_LEAST_1)
    hf_path: str = "Salesforce/wikitext"
    hf_name: str | None = "wikitext-2-raw-v1"
    dtype: str = "uint16"
    vocab_size: int | None = ranged(None, AT_LEAST_1)
    tokenizer: str = "auto"
    bpe_vocab_size: int = ranged(8192, Range(low=257, why="the 256 byte tokens plus <|endoftext|>"))
    val_fraction: float = ranged(0.05, Range(low=0.0, high=1.0, low_open=True, high_open=True))
    cache_dir: str = "~/.cache/launcher"
    shard_tokens: int = ranged(
        100_000_000,
        Range(low=65536, why="tokens per cache file; smaller shards make millions of files"),
    )
    num_workers: int = ranged(2, NON_NEGATIVE)
    pin_memory: bool = True
    persistent_workers: bool | None = None  # null: true when num_workers > 0
    prefetch_factor: int = ranged(2, AT_LEAST_1)


@dataclass
class TrainerConfig:
    max_steps: int = ranged(200, AT_LEAST_1)
    global_batch_size: int | None = ranged(16, AT_LEAST_1)
    # sequences per forward/backward on one rank; auto: the largest that fits, found at
    # start by halving from the per-rank batch (docs/faults.md); checked in validate
    micro_batch_size: Any = ranged(4, AT_LEAST_1)
    seq_len: int = ranged(128, AT_LEAST_1)
    lr: float = ranged(1e-3, POSITIVE)
    min_lr_ratio: float = ranged(0.1, FRACTION)
    warmup_steps: int = ranged(20, NON_NEGATIVE)
    lr_decay_steps: int | None = ranged(None, AT_LEAST_1)
    weight_decay: float = ranged(0.1, Range(low=0.0))
    beta1: float = ranged(0.9, BELOW_1)
    beta2: float = ranged(0.95, BELOW_1)
    grad_clip: float = ranged(1.0, Range(low=0.0, why="0 disables clipping"))
    fused_adamw: bool = True
    precision: str = one_of("fp32", PRECISIONS)
    compile: str = one_of("off", COMPILE_MODES)
    grad_checkpointing: bool = False
    seed: int = ranged(1337, Range(low=0, high=2**32 - 1))
    device: str = one_of("auto", DEVICES)
    log_interval: int = ranged(10, AT_LEAST_1)
    eval_interval: int = ranged(100, Range(low=0, why="0: never"))
    eval_batches: int = ranged(4, AT_LEAST_1)
    # steps between durable checkpoints; 0: never; auto: Young's interval, sqrt(2 x the
    # measured write cost x trainer.mtbf_h), recomputed at every save (docs/checkpoints.md)
    checkpoint_interval: Any = ranged(100, Range(low=0, why="0: never; or auto"))
    keep_checkpoints: int = ranged(2, AT_LEAST_1)
    async_checkpoint: bool = False  # strategy=fsdp2: files written while training goes on
    # Steps between two memory-tier checkpoints (each rank's state in node memory; what a
    # torchrun restart resumes from, docs/checkpoints.md); 0: off; null: 10 where torchrun
    # restarts the job (--max-restarts > 0) and the engine can, else off; auto: Young's
    # interval from the measured copy time, as trainer.checkpoint_interval=auto.
    memory_checkpoint_interval: Any = ranged(
        None, Range(low=0, why="0: off; null: 10 under restarts; or auto")
    )
    # The job's mean time between failures (hours), which the `auto` intervals follow; null:
    # 6,300 node-hours (Llama 3's training) divided by the job's nodes (docs/checkpoints.md)
    mtbf_h: float | None = ranged(None, POSITIVE)
    # The mean time between the failures the memory tier cannot recover from (hours): a node
    # lost with its peer copy, every node's memory wiped. The durable interval under auto
    # follows it while the memory tier is on; null: trainer.mtbf_h, as if every failure
    # lost the tier (docs/checkpoints.md)
    memory_loss_mtbf_h: float | None = ranged(None, POSITIVE)
    memory_checkpoint_dir: str = "/dev/shm"  # node-local memory (a tmpfs) the tier writes to
    # Also keep each rank's memory checkpoints in the memory of a rank on the next node, so
    # that a node lost whole costs at most one memory interval (docs/checkpoints.md)
    memory_checkpoint_peer: bool = False
    # stop (exit 3), skip the update, or rewind (docs/faults.md)
    on_nonfinite: str = one_of("stop", NONFINITE_POLICIES)
    # skipped steps allowed within bad_step_window; one more: exit 3
    max_bad_steps: int = ranged(3, Range(low=0, why="0: the first bad step stops the run"))
    bad_step_window: int = ranged(100, AT_LEAST_1)  # steps
    # stop (exit 4), or retry the step at half the micro-batch (docs/faults.md)
    on_oom: str = one_of("stop", OOM_POLICIES)


@dataclass
class DistConfig:
    backend: str = one_of("auto", BACKENDS)
    # gloo and the c10d store keep the time-out in milliseconds in a 32-bit int: past
    # about 24 days it overflows into a socket error (or Python's OverflowError) at start
    timeout_s: int = ranged(
        900, Range(low=1, high=2_147_483, why="the sockets' limit, 2^31 - 1 ms (about 24 days)")
    )


# The phases a rank goes through, each with its own hang allowance (docs/faults.md), that
# cannot be cut short by a stop request (launcher.resilience.watchdog.CUT_SHORT lists those
# that can); `fault.phases` names some of them.
PHASES = ("start-up", "first step", "eval", "checkpoint", "profiler flush", "end of run")


@dataclass
class WatchdogConfig:
    """Hang detection on every rank (docs/faults.md). A hang is no completed step for
    max(min_s, step_multiple x the recent median step time); then every rank that can still
    run writes its stacks and flight-recorder buffer to logs/ and the job exits with 5."""

    enabled: bool = True
    step_multiple: float = ranged(10.0, POSITIVE)
    # never sooner. 60: a frozen rank of a short-step job ends it within 90 s of its last
    # step; the long stretches (first step, eval, checkpoint, trace) have their own.
    min_s: float = ranged(60.0, POSITIVE)
    # start-up: data preparation, model build, resume
    startup_s: float = ranged(600.0, POSITIVE)
    # the first step of a launch: compilation, warm-up, caches
    first_step_s: float = ranged(600.0, POSITIVE)
    # a checkpoint or trace write, until one was measured
    checkpoint_s: float = ranged(600.0, POSITIVE)
    # recent collectives kept per rank; 0: recorder off
    flight_recorder_entries: int = ranged(2000, Range(low=0, why="0: the recorder is off"))
    # a rank whose compute is this much above the others'...
    straggler_frac: float = ranged(0.2, POSITIVE)
    # ...for this many log intervals in a row is named
    straggler_intervals: int = ranged(3, Range(low=0, why="0: never name a straggler"))


@dataclass
class FaultConfig:
    """Rehearse a failure on purpose (docs/faults.md); `kind=none` (the default) does nothing.

    stall: rank `rank` sleeps `seconds` when step `step` starts; sigstop: it stops itself
    (SIGSTOP: frozen, as a process stuck in a driver is); exit: it exits with `exit_code`;
    oom: it raises an out-of-memory error (with `micro_batch`: in every forward of a larger
    micro-batch); nonfinite: its loss in that step is NaN;
    loader_error: its data loader raises for that
    step; slow: it spends `seconds` more in every step from `step` on (a straggler);
    slow_data: every rank's data source takes `seconds` for each micro-batch it reads (storage
    with a high latency, such as a busy network file system; `rank` and `step` do not apply);
    slow_device: its device is slow in the burn-in gate, each of its matmuls there takes
    `seconds` more (the gate's outlier, docs/burnin.md; `step` does not apply).
    slow_phase: every rank spends `seconds` more in each phase named in `phases` (start-up,
    first step, eval, checkpoint, profiler flush, end of run), each time it comes.
    """

    kind: str = one_of("none", kind_names)  # the kinds launcher.config.fault_kinds declares
    rank: int = ranged(0, NON_NEGATIVE)
    step: int = ranged(1, AT_LEAST_1)
    seconds: float = ranged(60.0, NON_NEGATIVE)
    exit_code: int = ranged(1, Range(low=0, high=255, why="a process exit code"))
    once: bool = True  # fire in one attempt only: a restart or requeue then resumes past it
    phases: list[str] = field(default_factory=list)  # kind=slow_phase: the phases slowed
    # kind=oom: a device that holds this many sequences per micro-batch: from `step` on,
    # every forward of more raises out-of-memory on `rank` (the micro_batch_size=auto search
    # included; `once` does not apply); null: one OOM at `step`
    micro_batch: int | None = ranged(None, Range(low=0, why="0: not even one sequence fits"))


@dataclass
class BurninConfig:
    """The burn-in gate before training (docs/burnin.md): every rank times a matmul on its
    device and an all-reduce within its node and across nodes; a rank (or node) slower than
    the median of the others by more than `tolerance` is named, and with `action=refuse`
    the job exits with the bad-node code before any step, its host recorded for exclusion."""

    enabled: bool | None = None  # null: on for cluster=slurm and k8s, off for local
    tolerance: float = ranged(0.25, POSITIVE)  # slower than the others' median by this: named
    action: str = one_of("warn", BURNIN_ACTIONS)  # refuse: exit 6 (bad node) before any step
    # n of the n x n matmul; null: 8192 (bf16) on a GPU, 512 (fp32) on a CPU
    matmul_size: int | None = ranged(
        None, Range(low=16, why="n of the n x n matmul each rank times")
    )
    iters: int = ranged(10, AT_LEAST_1)  # timed repetitions of the matmul and each all-reduce
    budget_s: float = ranged(10.0, POSITIVE)  # the gate's budget: one that takes longer says so


@dataclass
class ExcludeConfig:
    """Which failures keep their host off the run's next attempts: recorded with the reason
    in the run directory's bad_hosts, which a Slurm requeue adds to the job's excluded nodes
    and a re-render of the pods to their node anti-affinity (docs/faults.md)."""

    burnin: bool = True  # a host the burn-in gate refused (burnin.action=refuse)
    hang: bool = True  # a hang's culprit, as the hang verdict names it
    device_error: bool = True  # a rank that failed with a device error (ECC, Xid, ...)
    straggler: bool = True  # a straggler for straggler_intervals log intervals in a row
    straggler_intervals: int = ranged(
        20, Range(low=1, why="log intervals in a row as the slowest rank, watchdog.straggler_frac")
    )


@dataclass
class NcclConfig:
    name: str = "default"
    env: NcclEnv = field(default_factory=NcclEnv)


@dataclass
class ProfilerConfig:
    name: str = one_of("off", PROFILERS)
    # empty: every rank
    ranks: list[int] = ranged(factory=list, allowed=Range(low=0, why="each rank"))
    skip_first: int = ranged(10, NON_NEGATIVE)
    wait: int = ranged(0, NON_NEGATIVE)
    warmup: int = ranged(2, NON_NEGATIVE)
    active: int = ranged(3, Range(low=1, why="steps recorded"))
    repeat: int = ranged(1, Range(low=0, why="0: cycles until the end of the run"))
    record_shapes: bool = False
    with_flops: bool = True  # input shapes of matmuls and SDPA: FLOP/s per kernel class
    profile_memory: bool = False
    with_stack: bool = False
    memory_snapshot: bool = False  # GPU: allocation history and a snapshot per trace


@dataclass
class LoggerConfig:
    """Where metrics go besides metrics.jsonl (see docs/logging.md): Weights & Biases unless
    `mode` is disabled (`logger=none` keeps it so), and TensorBoard when `tensorboard` is
    true (`logger=tensorboard`; both: `logger=[wandb,tensorboard]`). The API key is never a
    config key: wandb reads WANDB_API_KEY from the environment."""

    # online, offline (files only; `wandb sync` later), disabled
    mode: str = one_of("disabled", LOGGER_MODES)
    project: str = "launcher"
    entity: str | None = None
    tags: list[str] = field(default_factory=list)
    group: str | None = None
    name: str | None = None  # the W&B run's name; null: the run id
    dir: str | None = None  # W&B files go to <dir>/wandb/; null: the run directory
    tensorboard: bool = False  # event files in <run dir>/tb/ (rank 0)


@dataclass
class ClusterBase:
    """Where the job runs. `local` is torchrun on this machine; every other option is a
    backend that `python -m launcher.submit` renders for (launcher.config.backends), whose
    section `cluster.<backend>` holds its own keys."""

    name: str = "local"
    nodes: int = ranged(1, AT_LEAST_1)
    # 0: a CPU-only job (gloo)
    gpus_per_node: int = ranged(0, Range(low=0, why="0: a CPU-only job"))
    procs_per_node: int | None = ranged(None, AT_LEAST_1)  # null: gpus_per_node, or 1 without GPUs
    # the GPUs' kind for `launcher.plan` (H200, H100, A100); null: H100, assumed
    gpu_type: str | None = None
    # what a GPU-hour costs, for the plan's total (any currency); null: no cost
    gpu_hour_cost: float | None = ranged(None, POSITIVE)
    job_name: str | None = None  # null: launcher-<exp or model>, e.g. launcher-bucket_sweep
    time_limit: str | None = None  # [D-]HH:MM:SS; null: the cluster's default
    # c10d rendezvous on the first node (Slurm: the range's start)
    rdzv_port: int = ranged(29500, Range(low=1, high=65535))
    workdir: str | None = None  # where the job starts (the checkout); null: submit's cwd
    setup: list[str] = field(default_factory=list)  # shell lines run before torchrun
    env: dict[str, str] = field(default_factory=dict)  # extra environment variables
    # variables holding secrets the job needs, by name: Slurm passes them from the
    # submitting shell, Kubernetes from a Secret (cluster.k8s.env_secret); values never
    # enter the job's files
    secrets: list[str] = field(default_factory=list)


# The built-in backends' sections (cluster.slurm, cluster.k8s) are there whatever the cluster.
ClusterConfig = backends.with_sections(ClusterBase, list(backends.builtin().values()))


@dataclass
class TuneConfig:
    """`python -m launcher.tune`'s rounds (docs/tuning.md); launcher.train ignores it.

    A candidate is kept when its repeats give more tokens/s than the incumbent's in a rank
    test (launcher.tune.decision), its median gain exceeds `noise_multiple` x the measured
    noise (the larger relative spread of the two sides' repeats, outliers left out) and is
    at least `min_gain`."""

    # wall time for the rounds; the confirmation runs come after
    budget_s: float = ranged(1800.0, POSITIVE)
    # steps of each timed trial, warm-up included
    trial_steps: int = ranged(
        12, Range(low=4, why="and tune.warmup_steps + 3: warm-up, then 3 profiled")
    )
    # a trial's first steps, not timed: start-up, DDP's bucket rebuild
    warmup_steps: int = ranged(3, Range(low=1, why="the first step holds start-up"))
    # timed trials of each candidate and of the incumbent, every round
    repeats: int = ranged(3, Range(low=2, why="one trial cannot measure noise"))
    # math-changing candidates: |mean loss diff| / incumbent's
    loss_tolerance: float = ranged(
        0.02, Range(low=0.0, why="0: a math-changing candidate must match exactly")
    )
    # the smallest gain in tokens/s worth keeping, as a fraction of the incumbent's
    min_gain: float = ranged(0.05, BELOW_1)
    # how many measured relative spreads a gain in tokens/s must exceed
    noise_multiple: float = ranged(1.0, NON_NEGATIVE)
    max_rounds: int = ranged(6, AT_LEAST_1)
    # steps of each confirmation run (baseline and winner)
    confirm_steps: int = ranged(40, Range(low=4, why="and tune.warmup_steps + 3"))
    skip: list[str] = field(default_factory=list)  # keys never to change: [strategy.comm_hook]


@dataclass
class RehearseConfig:
    """`python -m launcher.rehearse`'s cases (docs/rehearse.md); launcher.train ignores it."""

    only: list[str] = field(default_factory=list)  # run just these cases: [stop,hung_rank]
    skip: list[str] = field(default_factory=list)  # every case but these
    # ranks of each case; null: torchrun's, else the GPUs here, else 2
    nproc: int | None = ranged(None, Range(low=2, why="a killed, hung or slow rank needs a peer"))
    # one launch of a case, start-up included; then it is killed
    timeout_s: float = ranged(300.0, POSITIVE)


@dataclass
class TrainConfig:
    run: RunConfig = field(default_factory=RunConfig)
    # auto: continue from the latest complete checkpoint of this run directory if there is one;
    # never: start fresh (refuses a run directory that already holds checkpoints);
    # a path: a run directory, its checkpoints/ folder, or one step_<n> folder.
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
    burnin: BurninConfig = field(default_factory=BurninConfig)
    exclude: ExcludeConfig = field(default_factory=ExcludeConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    tune: TuneConfig = field(default_factory=TuneConfig)
    rehearse: RehearseConfig = field(default_factory=RehearseConfig)


@functools.cache
def register_schema() -> None:
    """Register `TrainConfig` so `train.yaml` can name it first in its defaults list, and
    each engine's schema for its `strategy` option to name first in its own (an engine from
    another package, without a YAML, gets its schema as the option itself); a backend from
    another package gets its `cluster` option: the cluster schema with its section.

    Called by whatever composes, before Hydra reads the config module (compose, the train
    front door), not on import: an engine's package imports this layer, and may be imported
    first."""
    store = ConfigStore.instance()
    store.store(name="train_schema", node=TrainConfig)
    for name, engine in engines().items():
        store.store(group="strategy", name=f"{name}_schema", node=engine.schema)
        if not engine.has_yaml:
            store.store(group="strategy", name=name, node=engine.schema)
    for added in backends.added():
        option = backends.with_sections(ClusterConfig, [added], name=added.name)
        store.store(group="cluster", name=added.name, node=option)


def _sections():
    """(schema, key prefix) of the sections that are not in TrainConfig's own tree: every
    engine's `strategy`, and the added backends' `cluster.<name>`."""
    yield from ((engine.schema, "strategy.") for engine in engines().values())
    yield from ((b.schema, f"cluster.{b.name}.") for b in backends.added() if b.schema)


def all_ranges() -> dict[str, Range]:
    """Every numeric key's range, read from the fields of the schema and of every engine's
    and added backend's (a key absent from the chosen one's schema is skipped when
    checked)."""
    found = ranges_of(TrainConfig)
    for schema, prefix in _sections():
        found.update(ranges_of(schema, prefix))
    return found


def all_choices() -> dict[str, tuple[str, ...]]:
    """Every string key with a fixed set of values, the engines' `strategy.` keys and the
    added backends' sections included."""
    found = choices_of(TrainConfig)
    for schema, prefix in _sections():
        found.update(choices_of(schema, prefix))
    return found


def typed(cfg: DictConfig) -> TrainConfig:
    """The checked config as the schema's dataclasses (each `strategy` as its engine's),
    converted once after the front door's checks: what the job's components read."""
    return OmegaConf.to_object(cfg)
