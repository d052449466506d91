"""Whether a `save_pretrained` folder (`model.init_from`, what `launcher.export` writes) can
be loaded, checked before anything starts and without loading it.

transformers reads config.json and then the weights; a garbage config.json, or a missing
or truncated `model.safetensors`, would otherwise end the launch with its traceback after
the process group and the data were set up.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from launcher.checkpoint.protocol import unreadable

WEIGHTS = ("model.safetensors", "pytorch_model.bin")
SHARD_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def safetensors_problem(path: Path) -> str | None:
    """Why `path` is not a whole safetensors file (its header says how long it must be)."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if size < 8 + length:
                raise ValueError("the header is cut")
            header = json.loads(f.read(length))
        ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    except (OSError, ValueError, struct.error, KeyError, TypeError, AttributeError) as exc:
        return f"{path.name} is not a readable safetensors file ({exc or type(exc).__name__})"
    expected = 8 + length + max(ends, default=0)
    if size != expected:
        return f"{path.name} is {size:,} bytes, its header says {expected:,} (truncated or padded)"
    return None


def folder_problem(path: Path) -> str | None:
    """What keeps the `save_pretrained` folder `path` from loading, or None."""
    config = path / "config.json"
    if not config.is_file():
        return f"{path} holds no config.json"
    try:
        loaded = json.loads(config.read_text())
    except (OSError, ValueError) as exc:
        return f"{config} is not readable JSON ({' '.join(str(exc).split())[:80]})"
    if not isinstance(loaded, dict) or "model_type" not in loaded:
        return f"{config} is not a model config (no model_type)"
    if any((path / name).is_file() for name in SHARD_INDEXES):
        return None  # sharded weights: transformers checks the shards it names
    present = [path / name for name in WEIGHTS if (path / name).is_file()]
    if not present:
        return f"{path} holds no {' or '.join(WEIGHTS)}"
    weights = present[0]
    return (
        safetensors_problem(weights) if weights.suffix == ".safetensors" else unreadable([weights])
    )
