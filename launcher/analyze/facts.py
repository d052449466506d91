"""What the run directory says about a run besides its traces: the settings the advice
must not recommend again (precision, compile, checkpointing, the model's implementation),
the device (its name gives its bf16 peak) and the memory figures that show pressure (peak
against the device's size). Every field may be unknown: the analyser also reads trace
folders that were copied without the rest of the run directory."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml
from omegaconf import OmegaConf


@dataclass
class RunFacts:
    precision: str | None = None
    compile: str | None = None
    grad_checkpointing: bool | None = None
    impl: str | None = None  # model.impl: native or hf
    attention: str | None = None  # model.attention: SDPA's kernel (auto, flash, cudnn, ...)
    micro_batch_size: int | None = None
    global_batch_size: int | None = None
    world_size: int | None = None  # from env.json
    peak_mem_gb: float | None = None  # mem/peak_gb in summary.json: the device's peak
    device_mem_gb: float | None = None  # the first GPU's size, from env.json
    device_name: str | None = None  # the first GPU's name, from env.json (its bf16 peak)


def _read(path: Path, parse):
    try:
        return parse(path.read_text()) or {}
    except (OSError, ValueError, yaml.YAMLError):
        return {}


def read_facts(run_dir: Path) -> RunFacts:
    config = _read(run_dir / "config.yaml", yaml.safe_load)
    trainer = config.get("trainer") or {}
    model = config.get("model") or {}
    summary = _read(run_dir / "summary.json", json.loads)
    env = _read(run_dir / "env.json", json.loads)
    devices = env.get("devices") or [{}]
    # what ran: summary.json's where it can change in-process (auto, on_oom=retry)
    micro = summary.get("micro_batch") or trainer.get("micro_batch_size")
    return RunFacts(
        precision=trainer.get("precision"),
        compile=None if "compile" not in trainer else str(trainer["compile"]),
        grad_checkpointing=trainer.get("grad_checkpointing"),
        impl=model.get("impl"),
        attention=model.get("attention"),
        micro_batch_size=micro if isinstance(micro, int) else None,
        global_batch_size=trainer.get("global_batch_size"),
        world_size=env.get("world_size"),
        peak_mem_gb=summary.get("mem/peak_gb"),
        device_mem_gb=devices[0].get("memory_gb"),
        device_name=devices[0].get("name"),
    )


def logger_config(run_dir: Path):
    """The `logger` section of the run's config.yaml (where its metrics went: W&B,
    TensorBoard), or None if there is none."""
    config = _read(run_dir / "config.yaml", yaml.safe_load)
    return OmegaConf.create(config["logger"]) if config.get("logger") else None
