"""The knob matrix's rows: every switch and every choice of the schema, with its proof.

A row is one sweep point of a knob launch (tests/launches/test_knob_matrix.py): its overrides on top
of the defaults users run (2 ranks, DataLoader workers on, 2 micro-batches per rank and
step), on each engine that accepts it, and what the run must show against the launch's
`reference` point:

- `equal`: every step's loss equal to the reference's within `rel` (0: bit for bit); the
  knobs the math says change nothing but speed, memory or what is recorded;
- `finite`: every loss finite and the last within `rel` of the reference's last; the
  knobs that change the numbers (precision, compression, data, model);
- `refused`: refused before start on this machine, one line holding `refusal` (checked in
  process by tests/unit/config/test_knob_rows.py: compose and preflight, what the front door runs).

tests/unit/config/test_knob_rows.py derives the knobs from launcher/config/schema.py itself
(every bool field, and every string key validate refuses with "not one of") and fails for any
(engine, key, value) no row covers: a new knob arrives with its row.

The engines are the registry's (launcher.config.registry), so a new engine is in the matrix
and its knobs need rows; a row about what an engine declares (an asynchronous save, dropping
a step, resizing the micro-batch, compiling, the memory tier) takes its engines from the
declarations, so a new engine gets that row, run or refused, without an edit here. A
refusal's `{engine}` is the engine it is checked on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from launcher.config.registry import Engine, engines

ENGINES = tuple(engines())


def declaring(allows: Callable[[Engine], bool]) -> tuple[str, ...]:
    """The engines whose declaration `allows`."""
    return tuple(name for name, e in engines().items() if allows(e))


def not_declaring(allows: Callable[[Engine], bool]) -> tuple[str, ...]:
    return tuple(name for name in ENGINES if name not in declaring(allows))


ASYNC_SAVE = declaring(lambda e: e.capabilities.async_checkpoint)
DROPS_STEPS = declaring(lambda e: e.capabilities.drops_steps)
RESIZES = declaring(lambda e: e.capabilities.resizes_micro_batch)
COMPILES = declaring(lambda e: e.capabilities.compiles)
MEMORY_TIER = declaring(lambda e: e.memory_checkpoint is not None)
# The groups whose knobs the matrix must cover (the other groups are launch-wide, cluster
# or fault settings: tests/launches/test_comm.py, test_slurm.py, test_k8s.py, test_faults.py).
GROUPS = ("strategy", "trainer", "model", "data", "profiler", "logger", "burnin", "run", "exclude")
# The data layer hands every engine the same token tensors, however they were read: its
# sources (and their dtype) are launched on DDP, and one of them (synthetic) on every engine.
# The burn-in gate runs before any engine is built, who may read the run directory is no
# engine's concern, nor what keeps a host off the next attempts: launched on DDP.
EXCLUDE = ("exclude.burnin", "exclude.hang", "exclude.device_error", "exclude.straggler")
ENGINE_FREE = ("data.source", "data.dtype", "burnin.enabled", "burnin.action", "run.access",
               "run.report", *EXCLUDE)  # fmt: skip
DATA_ENGINES = ENGINES[:1]  # DDP, the first built-in

# On top of tests/launch.py's FAST_USER_LOADER (workers on): short, no eval, no checkpoints.
BASE = [
    "trainer.max_steps=4",
    "trainer.eval_interval=0",
    "trainer.checkpoint_interval=0",
]
PROFILED = [  # profiler on for steps 2-3 of 4
    "profiler.skip_first=1",
    "profiler.warmup=0",
    "profiler.active=2",
]


@dataclass(frozen=True)
class Row:
    name: str  # the sweep point: knob=<name>
    overrides: tuple[str, ...]
    expect: str  # equal | finite | refused
    why: str
    rel: float = 0.0
    engines: tuple[str, ...] = ENGINES
    refusal: str = ""  # expect=refused: a part of the one line


def row(name, overrides, expect, why, **kw) -> Row:
    return Row(name, tuple(overrides), expect, why, **kw)


ROWS: list[Row] = [
    # Knobs that change nothing the model computes.
    row(
        "quiet",
        ["strategy.time_comm=false", "trainer.device=cpu", "logger.tensorboard=true"],
        "equal",
        "comm timing, the device auto picks on this machine, and TensorBoard only observe",
    ),
    row(
        "loader",
        ["data.pin_memory=false", "data.persistent_workers=false"],
        "equal",
        "the same batches in the same order, however workers hold and copy them",
    ),
    row(
        "no_workers",
        ["data.num_workers=0", "data.persistent_workers=false"],
        "equal",
        "the step-indexed sampler gives the same batches in process",
    ),
    row(
        "profiled",
        ["profiler.name=steps", *PROFILED, "profiler.with_flops=false"],
        "equal",
        "the profiler records and changes no operator",
    ),
    row(
        "profiled_full",
        ["profiler.name=full", *PROFILED, "profiler.record_shapes=true"]
        + ["profiler.profile_memory=true", "profiler.with_stack=true"]
        + ["profiler.memory_snapshot=true"],
        "equal",
        "what profiler=full records (the memory snapshot is a GPU's: tests/gpu/test_gpu.py)",
    ),
    row(
        "wandb_offline",
        ["logger.mode=offline"],
        "equal",
        "W&B offline writes files only",
    ),
    row(
        "grad_checkpointing",
        ["trainer.grad_checkpointing=true"],
        "equal",
        "recomputed activations: the same operators again, in the same order",
        rel=0.0,
    ),
    row(
        "attention_math",
        ["model.attention=math"],
        "equal",
        "SDPA's math kernel computes softmax(QK^T)V unfused: rounding only",
        rel=1e-5,
    ),
    row(
        "attention_flash",
        ["model.attention=flash"],
        "equal",
        "on the CPU auto picks the flash kernel",
    ),
    row(
        "fused_adamw_off",
        ["trainer.fused_adamw=false"],
        "equal",
        "the foreach AdamW: the same update, other rounding",
        rel=1e-6,
    ),
    # DDP.
    row(
        "bucket_view_off",
        ["strategy.gradient_as_bucket_view=false"],
        "equal",
        "gradients copied into the buckets instead of aliased",
        engines=("ddp",),
    ),
    row(
        "static_graph",
        ["strategy.static_graph=true"],
        "equal",
        "the first step all-reduces each micro-batch (torch cannot record the static graph "
        "under no_sync): the same average, other rounding",
        rel=1e-6,
        engines=("ddp",),
    ),
    row(
        "find_unused",
        ["strategy.find_unused_parameters=true"],
        "equal",
        "every parameter is used: the search finds none",
        engines=("ddp",),
    ),
    row(
        "no_broadcast_buffers",
        ["strategy.broadcast_buffers=false"],
        "equal",
        "GPT-2's buffers are constants, equal on every rank",
        engines=("ddp",),
    ),
    row(
        "tiny_buckets",
        ["strategy.bucket_cap_mb=0.01"],
        "equal",
        "more all-reduces of the same gradients: a sum of two ranks is order-free",
        engines=("ddp",),
    ),
    row(
        "hook_fp16",
        ["strategy.comm_hook=fp16"],
        "finite",
        "gradients all-reduced in fp16",
        rel=1e-5,
        engines=("ddp",),
    ),
    row(
        "hook_bf16",
        ["strategy.comm_hook=bf16"],
        "finite",
        "gradients all-reduced in bf16 (8 bits of mantissa)",
        rel=1e-4,
        engines=("ddp",),
    ),
    row(
        "hook_powersgd",
        ["strategy.comm_hook=powersgd", "strategy.powersgd_warmup_steps=1"],
        "finite",
        "rank-4 PowerSGD with error feedback from step 2",
        rel=5e-3,
        engines=("ddp",),
    ),
    # What the tuner may combine with static_graph (it proposes it on top of the incumbent).
    row(
        "static_graph_combined",
        ["strategy.static_graph=true", "trainer.grad_checkpointing=true"]
        + ["strategy.gradient_as_bucket_view=false", "strategy.bucket_cap_mb=0.01"],
        "equal",
        "static_graph with recomputed activations, copied gradients and tiny buckets",
        rel=1e-6,
        engines=("ddp",),
    ),
    row(
        "static_graph_hf_powersgd",
        ["strategy.static_graph=true", "model.impl=hf", "strategy.comm_hook=powersgd"]
        + ["strategy.powersgd_warmup_steps=1"],
        "finite",
        "static_graph with transformers' GPT-2 and PowerSGD (the hf and powersgd rows' "
        "tolerances together)",
        rel=2e-2,
        engines=("ddp",),
    ),
    row(
        "static_graph_compiled",
        ["strategy.static_graph=true", "trainer.compile=default"],
        "equal",
        "static_graph around a compiled module (the tuner keeps compile on a GPU, then may "
        "propose static_graph)",
        rel=1e-4,
        engines=("ddp",),
    ),
    # DeepSpeed (ZeRO-2 by default).
    row(
        "overlap_on",
        ["strategy.overlap_comm=true"],
        "equal",
        "the reduction overlapped with backward: the same sums",
        engines=("deepspeed",),
    ),
    row(
        "overlap_off",
        ["strategy.overlap_comm=false"],
        "equal",
        "the reduction after backward: the same sums",
        engines=("deepspeed",),
    ),
    row(
        "offload_optimizer",
        ["strategy.offload_optimizer=cpu"],
        "equal",
        "torch's AdamW on the CPU copies (tests/launches/test_deepspeed.py's offload test: 1e-4)",
        rel=1e-4,
        engines=("deepspeed",),
    ),
    row(
        "offload_param",
        ["strategy.zero_stage=3", "strategy.offload_optimizer=cpu", "strategy.offload_param=cpu"],
        "equal",
        "ZeRO-3 with parameters on the CPU against the ZeRO-2 reference: the same sums, "
        "partitioned otherwise",
        rel=1e-4,
        engines=("deepspeed",),
    ),
    # FSDP2.
    row(
        "no_reshard",
        ["strategy.reshard_after_forward=false"],
        "equal",
        "parameters kept gathered from forward to backward",
        engines=("fsdp2",),
    ),
    row(
        "reduce_bf16",
        ["strategy.reduce_dtype=bf16"],
        "finite",
        "gradients reduce-scattered in bf16",
        rel=1e-4,
        engines=("fsdp2",),
    ),
    row(
        "offload",
        ["strategy.offload=cpu"],
        "equal",
        "parameters, gradients and optimizer already live on the CPU here",
        engines=("fsdp2",),
    ),
    row(
        "async_checkpoint",
        ["trainer.async_checkpoint=true", "trainer.checkpoint_interval=2"],
        "equal",
        "checkpoint files written while training goes on",
        engines=ASYNC_SAVE,
    ),
    row(
        "async_checkpoint_refused",
        ["trainer.async_checkpoint=true"],
        "refused",
        "its engine writes its checkpoints synchronously",
        engines=not_declaring(lambda e: e.capabilities.async_checkpoint),
        refusal=f"trainer.async_checkpoint=true needs strategy={' or '.join(ASYNC_SAVE)}",
    ),
    row(
        "memory_tier",
        ["trainer.memory_checkpoint_interval=2"],
        "equal",
        "the memory tier copies each rank's state (FSDP2's shards, ZeRO's partition) between "
        "steps and writes it from a thread",
        engines=MEMORY_TIER,
    ),
    row(
        "memory_tier_refused",
        ["trainer.memory_checkpoint_interval=2"],
        "refused",
        "its engine declares no memory snapshot",
        engines=not_declaring(lambda e: e.memory_checkpoint is not None),
        refusal=f"trainer.memory_checkpoint_interval=2 needs strategy={' or '.join(MEMORY_TIER)}",
    ),
    row(
        "memory_tier_peer",
        ["trainer.memory_checkpoint_interval=2", "trainer.memory_checkpoint_peer=true"],
        "equal",
        "one node: no peer to copy to, said in one line (two nodes' copies and a lost node's "
        "restore from them: tests/launches/test_memory_tier.py)",
        engines=MEMORY_TIER,
    ),
    row(
        "auto_intervals",
        [
            "trainer.checkpoint_interval=auto",
            "trainer.memory_checkpoint_interval=auto",
            "trainer.mtbf_h=0.001",
            "trainer.memory_loss_mtbf_h=0.004",
        ],  # fmt: skip
        "equal",
        "both tiers at Young's interval from their measured costs (a failure every 3.6 s, one "
        "that loses the memory tier every 14.4 s: a save every step or few after the first at "
        "step 2); saves change no number",
        engines=MEMORY_TIER,
    ),
    row(
        "on_nonfinite_skip",
        ["trainer.on_nonfinite=skip"],
        "equal",
        "no bad step: the per-step check drops nothing (tests/launches/test_faults.py injects one)",
        engines=DROPS_STEPS,
    ),
    row(
        "on_nonfinite_skip_refused",
        ["trainer.on_nonfinite=skip"],
        "refused",
        "its engine owns the optimizer step",
        engines=not_declaring(lambda e: e.capabilities.drops_steps),
        refusal="trainer.on_nonfinite=skip is not supported with strategy={engine}",
    ),
    row(
        "on_nonfinite_rewind",
        ["trainer.on_nonfinite=rewind"],
        "equal",
        "no bad step: nothing rewound (tests/launches/test_faults.py injects one)",
        engines=DROPS_STEPS,
    ),
    row(
        "on_nonfinite_rewind_refused",
        ["trainer.on_nonfinite=rewind"],
        "refused",
        "its engine owns the optimizer step",
        engines=not_declaring(lambda e: e.capabilities.drops_steps),
        refusal="trainer.on_nonfinite=rewind is not supported with strategy={engine}",
    ),
    row(
        "on_oom_retry",
        ["trainer.on_oom=retry"],
        "equal",
        "no out-of-memory: one vote per step, nothing halved (test_oom.py injects one)",
        engines=RESIZES,
    ),
    row(
        "on_oom_retry_refused",
        ["trainer.on_oom=retry"],
        "refused",
        "its engine cannot redo a step part-way at another micro-batch (DeepSpeed fixes it in "
        "its config)",
        engines=not_declaring(lambda e: e.capabilities.resizes_micro_batch),
        refusal="trainer.on_oom=retry is not supported with strategy={engine}",
    ),
    row(
        "micro_batch_auto_refused",
        ["trainer.micro_batch_size=auto"],
        "refused",
        "its engine cannot redo a step part-way at another micro-batch (DeepSpeed fixes it in "
        "its config)",
        engines=not_declaring(lambda e: e.capabilities.resizes_micro_batch),
        refusal="trainer.micro_batch_size=auto is not supported with strategy={engine}",
    ),
    # Knobs that change the numbers.
    row(
        "micro_batch_auto",
        ["trainer.micro_batch_size=auto"],
        "finite",
        "the search finds the whole per-rank batch fits (4, accumulation 1 instead of 2): the "
        "same sequences per step, summed in another order",
        rel=1e-6,  # measured 3.9e-8
        engines=RESIZES,
    ),
    row(
        "bf16",
        ["trainer.precision=bf16"],
        "finite",
        "bf16 autocast: 8 bits of mantissa in the matmuls",
        rel=1e-3,
    ),
    row(
        "fp16",
        ["trainer.precision=fp16"],
        "finite",
        "fp16 autocast with a loss scaler",
        rel=1e-3,
        engines=("ddp",),
    ),
    row(
        "fp16_deepspeed",
        ["trainer.precision=fp16"],
        "refused",
        "DeepSpeed refuses fp16 on a CPU without AVX-512 FP16 (this machine's)",
        engines=("deepspeed",),
        refusal="needs a GPU or a CPU with AVX-512 FP16",
    ),
    row(
        "fp16_fsdp2",
        ["trainer.precision=fp16"],
        "refused",
        "FSDP2 would need a sharded loss scaler",
        engines=("fsdp2",),
        refusal="trainer.precision=fp16 is not supported with strategy=fsdp2",
    ),
    row(
        "hf",
        ["model.impl=hf"],
        "finite",
        "transformers' GPT-2 from the same seed: other initial weights",
        rel=1e-2,
    ),
    row(
        "no_bias",
        ["model.bias=false"],
        "finite",
        "the native GPT-2 without biases",
        rel=2e-2,
    ),
    row(
        "synthetic",
        ["data.source=synthetic", "data.vocab_size=512"],
        "finite",
        "random tokens: the loss stays near ln(512) = 6.24",
        rel=5e-2,
    ),
    row(
        "text_files",
        ["data.source=text_files", "data.paths=[{docs}/*.md]"],
        "finite",
        "this project's docs instead of Python's standard library: other text",
        rel=0.2,
        engines=DATA_ENGINES,
    ),
    row(
        "memmap",
        ["data.source=memmap", "data.paths=[{memmap}]", "data.vocab_size=512"],
        "finite",
        "pre-tokenized random uint16 tokens below 512",
        rel=5e-2,
        engines=DATA_ENGINES,
    ),
    row(
        "memmap_uint32",
        ["data.source=memmap", "data.paths=[{memmap32}]", "data.vocab_size=512"]
        + ["data.dtype=uint32"],
        "finite",
        "the same tokens stored as uint32",
        rel=5e-2,
        engines=DATA_ENGINES,
    ),
    row(
        "wikitext2",
        ["data.source=wikitext2", "data.hf_path={wikitext}", "data.hf_name=null"],
        "finite",
        "a local folder laid out like WikiText-2 (train.txt, validation.txt)",
        rel=0.2,
        engines=DATA_ENGINES,
    ),
    row(
        "burnin",
        ["burnin.enabled=true", "burnin.action=refuse", "burnin.tolerance=3"],
        "equal",
        "the gate only measures, before the model exists, with a private generator: the "
        "same losses bit for bit; no rank of one machine is 4x slower, so refuse lets it train",
        engines=DATA_ENGINES,
    ),
    *[
        row(
            f"run_access_{access}",
            [f"run.access={access}"],
            "equal",
            "who may read the run directory (its mode; tests/unit/runtime/test_run_dir_check.py "
            "reads it back): nothing the ranks compute",
            engines=DATA_ENGINES,
        )
        for access in ("group", "world")
    ],
    row(
        "run_report_on",
        ["run.report=true"],
        "equal",
        "report.png is drawn from the run's files after its last step (the base, like every "
        "FAST launch, draws none): nothing the ranks compute",
        engines=DATA_ENGINES,
    ),
    row(
        "exclude_off",
        [f"{key}=false" for key in EXCLUDE],
        "equal",
        "no failure names a host in a healthy run: nothing would be recorded either way (the "
        "kinds that record: tests/unit/resilience/test_bad_hosts.py and the launches it names)",
        engines=DATA_ENGINES,
    ),
    row(
        "wandb_online",
        ["logger.mode=online"],
        "refused",
        "no W&B API key in the test's environment (online W&B needs a server)",
        refusal="logger.mode=online needs a W&B API key",
    ),
    row(
        "cuda",
        ["trainer.device=cuda"],
        "refused",
        "no GPU on the machine the suite runs on (tests/gpu/test_gpu.py runs it on one)",
        refusal="trainer.device=cuda but no CUDA device is visible",
    ),
    row(
        "attention_gpu_only",
        ["model.attention=efficient"],
        "refused",
        "the CPU has SDPA's flash and math kernels only",
        refusal="model.attention=efficient needs a CUDA GPU",
    ),
    row(
        "attention_cudnn",
        ["model.attention=cudnn"],
        "refused",
        "the CPU has SDPA's flash and math kernels only",
        refusal="model.attention=cudnn needs a CUDA GPU",
    ),
    row(
        "compile",
        ["trainer.compile=default"],
        "equal",
        "inductor's kernels: the same operators fused, other rounding",
        rel=1e-4,
        engines=COMPILES,
    ),
    row(
        "compile_reduce_overhead",
        ["trainer.compile=reduce-overhead"],
        "equal",
        "CUDA graphs are a GPU's: off CUDA the launcher compiles the default mode "
        "(launcher.strategy.base.compile_mode), from the graphs the compile row cached",
        rel=1e-4,
        engines=COMPILES,
    ),
    row(
        "compile_max_autotune",
        ["trainer.compile=max-autotune"],
        "equal",
        "autotuned kernels: other rounding (off CUDA: max-autotune-no-cudagraphs)",
        rel=1e-4,
        engines=COMPILES,
    ),
    *[
        row(
            f"compile_{mode}_refused",
            [f"trainer.compile={mode}"],
            "refused",
            "its engine is not compiled here (DeepSpeed's)",
            engines=not_declaring(lambda e: e.capabilities.compiles),
            refusal=f"trainer.compile={mode} is not supported with strategy={{engine}}",
        )
        for mode in ("default", "reduce-overhead", "max-autotune")
    ],
]


def launched(engine: str) -> list[Row]:
    """The rows one engine's launch runs as its points."""
    return [r for r in ROWS if engine in r.engines and r.expect in ("equal", "finite")]
