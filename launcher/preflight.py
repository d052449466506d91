"""Checks that must pass before any process group or DataLoader worker starts.

`validate` judges the config alone. `check_config` adds what the layers above the config
judge of it (DeepSpeed's own config, built from these keys), wherever the job will run;
`machine_problems` what depends on the machine the job is about to run on: the device
asked for, the files and folders the run will read and write (data, a checkpoint to resume,
the run root, caches), the optional packages its settings need, and whether /dev/shm can
hold what the DataLoader workers will put there. `launcher.doctor` prints every problem;
`preflight` refuses the first, as one line.
"""

from __future__ import annotations

import glob
import importlib.util
import netrc
import os
from pathlib import Path
from urllib.parse import urlsplit

from omegaconf import DictConfig

from launcher.checkpoint import memory, pretrained
from launcher.checkpoint.protocol import find_resumable
from launcher.config import ConfigError
from launcher.config.registry import engine
from launcher.config.schema import DataConfig, LoggerConfig, TrainConfig
from launcher.config.validate import check_config
from launcher.data.cache import CACHE_ENV, cache_root
from launcher.data.shm import check_shm, loader_shm_need
from launcher.data.tokenizer import tokenizer_path_problem
from launcher.observe.tensorboard_sink import WRITER_PACKAGE, tensorboard_enabled
from launcher.paths import creatable_dir_problem, writable_dir_problem
from launcher.runtime.disk import shm_available_bytes

WANDB_DEFAULT_HOST = "https://api.wandb.ai"


def preflight(cfg: DictConfig, world_size: int, ranks_per_node: int) -> TrainConfig:
    """Raise ConfigError, worded for the user, on anything that would fail later; the
    checked config as the job's parts read it."""
    checked = check_config(cfg, world_size)
    problems = machine_problems(checked, ranks_per_node, world_size)
    if problems:
        raise ConfigError(problems[0])
    return checked


def machine_problems(
    cfg: TrainConfig, ranks_per_node: int, world_size: int | None = None
) -> list[str]:
    """Every reason this machine cannot run a validated config, one line each (`world_size`:
    the job's, else this node's ranks)."""
    problems = [
        *device_problems(cfg),
        *path_problems(cfg),
        *package_problems(cfg),
        *logger_problems(cfg.logger),
    ]
    shm = shm_problem(cfg, ranks_per_node, world_size or ranks_per_node)
    return [*problems, shm] if shm else problems


def shm_problem(cfg: TrainConfig, ranks_per_node: int, world_size: int) -> str | None:
    """What this machine's /dev/shm cannot hold: the DataLoader workers' batches, or a memory
    tier asked for by trainer.memory_checkpoint_interval that exceeds its whole size (the
    job's start checks the free space, counting what the run's tier holds already, and turns
    a default tier off: launcher.checkpoint.memory.open_tier)."""
    loaders = check_shm(need=loader_shm_need(cfg) * ranks_per_node)
    available = shm_available_bytes()
    if loaders or available is None or not memory.asked(cfg):
        return loaders
    return memory.room(cfg, ranks_per_node, world_size, available[0])


def device_problems(cfg: TrainConfig) -> list[str]:
    """A CUDA device or NCCL asked for on a machine without a visible GPU; what the engine
    cannot do on this device (fp16 DeepSpeed on a CPU that DeepSpeed refuses it on); an
    attention kernel the device or precision does not have."""
    import torch

    t = cfg.trainer
    on_cpu = t.device == "cpu" or (t.device == "auto" and not torch.cuda.is_available())
    refused = engine(cfg.strategy.name).capabilities.device_problem(cfg, on_cpu)
    if refused:
        return [refused]
    attention = attention_problem(cfg.model.attention, on_cpu, t.precision)
    if attention:
        return [attention]
    wants_cuda = t.device == "cuda" or cfg.dist.backend == "nccl"
    if not wants_cuda or torch.cuda.is_available():
        return []
    key = "trainer.device=cuda" if cfg.trainer.device == "cuda" else "dist.backend=nccl"
    return [
        f"{key} but no CUDA device is visible (CUDA_VISIBLE_DEVICES="
        f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); use trainer.device=auto "
        "and dist.backend=auto, or run where a GPU is"
    ]


def attention_problem(attention: str, on_cpu: bool, precision: str) -> str | None:
    """SDPA on the CPU has a flash kernel and the math one only; on a GPU the flash and
    cuDNN kernels take bf16 or fp16 inputs only (autocast gives them that)."""
    key = f"model.attention={attention}"
    if on_cpu and attention in ("efficient", "cudnn"):
        return (
            f"{key} needs a CUDA GPU (on the CPU SDPA has flash and math); use "
            "model.attention=auto, flash or math"
        )
    if not on_cpu and attention in ("flash", "cudnn") and precision == "fp32":
        return (
            f"{key} takes bf16 or fp16 inputs only, and trainer.precision=fp32 gives it "
            "fp32; use trainer.precision=bf16, or model.attention=auto or efficient"
        )
    return None


def path_problems(cfg: TrainConfig) -> list[str]:
    """The folders the run writes (run.root, the token cache, W&B's files) and the local
    files it reads (data, a checkpoint to resume, pretrained weights, a tokenizer) exist or
    can be made."""
    problems = [*data_file_problems(cfg.data), resume_problem(cfg.resume)]
    problems.append(_writable_key("run.root", cfg.run.root))
    if cfg.data.source in ("stdlib", "text_files", "wikitext2"):  # tokenized into the cache
        cache, key = cache_root(cfg.data.cache_dir), "data.cache_dir"
        key = CACHE_ENV if os.environ.get(CACHE_ENV) else key
        fix = f"choose a {key} you can write to (or one already built)"
        problems.append(creatable_dir_problem(cache, f"{key}={cache}", fix))
    if cfg.logger.mode != "disabled" and cfg.logger.dir:
        problems.append(_writable_key("logger.dir", cfg.logger.dir))
    if cfg.model.init_from:
        problems.append(init_from_problem(str(cfg.model.init_from)))
    if cfg.data.source in ("stdlib", "text_files", "wikitext2"):
        problems.append(tokenizer_path_problem(str(cfg.data.tokenizer)))
    return [p for p in problems if p]


def data_file_problems(d: DataConfig) -> list[str]:
    """Every text glob matches a file; every pre-tokenized file is there."""
    if d.source == "text_files":
        return [
            f"data.paths: no file matches {pattern!r}; fix the glob or path"
            for pattern in d.paths
            if not glob.glob(os.path.expanduser(pattern), recursive=True)
        ]
    if d.source == "memmap":
        return [
            f"data.paths: {path} does not exist; give pre-tokenized files"
            for path in [*d.paths, *d.val_paths]
            if not Path(os.path.expanduser(path)).is_file()
        ]
    return []


def resume_problem(resume: str) -> str | None:
    """`resume=<path>` points at a complete checkpoint (the keywords need nothing)."""
    if resume in ("auto", "never", "archive"):
        return None
    if find_resumable(Path(os.path.expanduser(resume))) is None:
        return (
            f"resume={resume}: no complete checkpoint there; give a run directory, "
            f"its checkpoints/ folder or a step_<n> folder, or use resume=auto"
        )
    return None


def _writable_key(key: str, value: str) -> str | None:
    return writable_dir_problem(value, f"{key}={value}", f"choose a {key} you can write to")


def init_from_problem(value: str) -> str | None:
    """`model.init_from` is a folder written by `save_pretrained`, or a hub name that can
    be loaded (in the local cache when the hub is switched off)."""
    path = Path(value).expanduser()
    if path.is_dir():
        problem = pretrained.folder_problem(path)
        if problem is None:
            return None
        return (
            f"model.init_from={value}: {problem}; give a folder written by save_pretrained "
            "(python -m launcher.export RUN_DIR OUT_DIR writes one)"
        )
    if path.exists() or value.startswith(("/", ".", "~")) or value.count("/") > 1:
        return (
            f"model.init_from={value}: no such folder; give a folder written by "
            "save_pretrained, or a hub name such as gpt2"
        )
    if _env_true("HF_HUB_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE"):
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(value, "config.json"), str):
            return (
                f"model.init_from={value}: not in the Hugging Face cache and the hub is "
                "switched off (HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE); download it first or "
                "give a local folder"
            )
    return None


def package_problems(cfg: TrainConfig) -> list[str]:
    """Optional packages the chosen settings import later."""
    strategy = cfg.strategy.name
    needs = [(p, f"strategy={strategy}", fix) for p, fix in engine(strategy).capabilities.packages]
    if cfg.data.source == "wikitext2":
        needs.append(("datasets", "data=wikitext2", "pip install 'launcher[hub]'"))
    return [p for p in (missing_package(*need) for need in needs) if p]


def missing_package(package: str, setting: str, fix: str) -> str | None:
    """One line when `setting` needs `package` and it is not installed (nothing imported)."""
    if importlib.util.find_spec(package) is not None:
        return None
    return f"{setting} needs the {package} package, which is not installed: {fix}"


def logger_problems(logger: LoggerConfig) -> list[str]:
    """What the chosen loggers need from this machine: their packages and, for W&B online,
    an API key in WANDB_API_KEY or in the netrc file `wandb login` writes."""
    problems = []
    if tensorboard_enabled(logger):
        problems.append(
            missing_package(
                WRITER_PACKAGE,
                "logger.tensorboard=true (logger=tensorboard)",
                "pip install 'launcher[tensorboard]', or logger=none",
            )
        )
    return [p for p in problems if p] + _wandb_problems(logger)


def _wandb_problems(logger: LoggerConfig) -> list[str]:
    if logger.mode == "disabled":
        return []
    problem = missing_package(
        "wandb", f"logger.mode={logger.mode}", "pip install 'launcher[wandb]', or logger=none"
    )
    if problem:
        return [problem]
    if logger.mode == "online" and not os.environ.get("WANDB_API_KEY") and not _netrc_has_key():
        return [
            "logger.mode=online needs a W&B API key: set WANDB_API_KEY or run `wandb login`; "
            "or logger.mode=offline (sync later with `wandb sync`)"
        ]
    return []


def _netrc_has_key() -> bool:
    """Whether the netrc file wandb reads ($NETRC, else ~/.netrc) holds the W&B host."""
    path = Path(os.environ.get("NETRC") or "~/.netrc").expanduser()
    host = urlsplit(os.environ.get("WANDB_BASE_URL") or WANDB_DEFAULT_HOST).netloc
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
