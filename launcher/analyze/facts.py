"""What the run directory says about a run besides its traces: the settings the advice
must not recommend again (precision, compile, checkpointing, the model's implementation),
the device (its name gives its bf16 peak) and the memory figures that show pressure (peak
against the device's size). Every field may be unknown: the analyser also reads trace
folders that were copied without the rest of the run directory."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from launcher.config.batch import BatchPlan


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
    seq_len: int | None = None
    peak_mem_gb: float | None = None  # mem/peak_gb in summary.json: the device's peak
    device_mem_gb: float | None = None  # the first GPU's size, from env.json
    device_name: str | None = None  # the first GPU's name, from env.json (its bf16 peak)
    # "<file>: why" for each file that was there but could not be read as the launcher
    # writes it (the report says so, rather than reason from a silent gap)
    skipped: list[str] = field(default_factory=list)

    @property
    def batch(self) -> BatchPlan | None:
        """The run's batch arithmetic, where its figures are known."""
        if not (self.micro_batch_size and self.global_batch_size and self.world_size):
            return None
        return BatchPlan(self.global_batch_size, self.micro_batch_size, self.world_size,
                         self.seq_len or 0)  # fmt: skip


def _read(path: Path, parse, skipped: list[str]) -> dict:
    """The file's mapping; {} when it is absent, and also, with a note in `skipped`, when
    it cannot be read or is not a mapping (a list, a number: not what the launcher wrote)."""
    if not path.exists():
        return {}
    try:
        data = parse(path.read_text())
    except (OSError, ValueError, yaml.YAMLError) as exc:
        skipped.append(f"{path}: unreadable ({type(exc).__name__})")
        return {}
    if not isinstance(data, dict):
        skipped.append(f"{path}: holds a {type(data).__name__}, not a mapping")
        return {}
    return data


def _section(data: dict, key: str) -> dict:
    value = data.get(key)
    return value if isinstance(value, dict) else {}


def _typed(value, *types):
    """`value` when it is of one of `types` (bool is no number here), else None."""
    if isinstance(value, bool) and bool not in types:
        return None
    return value if isinstance(value, types) else None


def read_facts(run_dir: Path) -> RunFacts:
    skipped: list[str] = []
    config = _read(run_dir / "config.yaml", yaml.safe_load, skipped)
    trainer, model = _section(config, "trainer"), _section(config, "model")
    summary = _read(run_dir / "summary.json", json.loads, skipped)
    env = _read(run_dir / "env.json", json.loads, skipped)
    devices = env.get("devices")
    first = devices[0] if isinstance(devices, list) and devices else {}
    first = first if isinstance(first, dict) else {}
    # what ran: summary.json's where it can change in-process (auto, on_oom=retry)
    micro = _typed(summary.get("micro_batch"), int) or _typed(trainer.get("micro_batch_size"), int)
    return RunFacts(
        precision=_typed(trainer.get("precision"), str),
        compile=None if "compile" not in trainer else str(trainer["compile"]),
        grad_checkpointing=_typed(trainer.get("grad_checkpointing"), bool),
        impl=_typed(model.get("impl"), str),
        attention=_typed(model.get("attention"), str),
        micro_batch_size=micro,
        global_batch_size=_typed(trainer.get("global_batch_size"), int),
        world_size=_typed(env.get("world_size"), int),
        seq_len=_typed(trainer.get("seq_len"), int),
        peak_mem_gb=_typed(summary.get("mem/peak_gb"), int, float),
        device_mem_gb=_typed(first.get("memory_gb"), int, float),
        device_name=_typed(first.get("name"), str),
        skipped=skipped,
    )


def logger_config(run_dir: Path):
    """The `logger` section of the run's config.yaml (where its metrics went: W&B,
    TensorBoard), or None if there is none (or it cannot be read: read_facts says so)."""
    logger = _section(_read(run_dir / "config.yaml", yaml.safe_load, []), "logger")
    return OmegaConf.create(logger) if logger else None
