"""Checks that must pass before any process group or DataLoader worker starts.

`validate` judges the config alone; this adds what depends on the machine the job is about
to run on: whether /dev/shm can hold what the DataLoader workers will put there, and
whether the packages of the chosen loggers are installed.
"""

from __future__ import annotations

from omegaconf import DictConfig

from launcher.config import ConfigError, validate
from launcher.data.shm import check_shm, shm_need_bytes
from launcher.sinks import missing_package
from launcher.tensorboard_sink import missing_writer, tensorboard_enabled
from launcher.wandb_sink import wandb_enabled


def shm_need(cfg: DictConfig) -> int:
    """Bytes of /dev/shm this config's DataLoader workers need on one rank."""
    return shm_need_bytes(
        num_workers=cfg.data.num_workers,
        prefetch_factor=cfg.data.prefetch_factor,
        micro_batch=cfg.trainer.micro_batch_size,
        seq_len=cfg.trainer.seq_len,
    )


def preflight(cfg: DictConfig, world_size: int, ranks_per_node: int) -> None:
    """Raise ConfigError, worded for the user, on anything that would fail later."""
    validate(cfg, world_size)
    problem = logger_package_missing(cfg.logger) or check_shm(need=shm_need(cfg) * ranks_per_node)
    if problem:
        raise ConfigError(problem)


def logger_package_missing(logger_cfg) -> str | None:
    """The chosen loggers' packages are optional extras: one line if one is not installed."""
    if wandb_enabled(logger_cfg) and (
        problem := missing_package("wandb", f"logger.mode={logger_cfg.mode}", "wandb")
    ):
        return problem
    return missing_writer() if tensorboard_enabled(logger_cfg) else None
