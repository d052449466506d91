"""Facts about the machine a run happened on: versions, devices, topology, NCCL_* and shm.

Written to env.json by rank 0 and printed by `launcher.doctor`, so that a slow or failed run
can be explained later from its run directory alone.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import shutil
import socket
import subprocess
import sys

import torch

from launcher.runtime.disk import shm_available_bytes

PACKAGES = (
    "torch",
    "transformers",
    "hydra-core",
    "tokenizers",
    "tiktoken",
    "numpy",
    "deepspeed",
    "wandb",
)


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": sys.version.split()[0]}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    out["cuda"] = torch.version.cuda  # the CUDA runtime torch was built with
    out["nccl"] = nccl_version()
    out.update(driver_versions())
    return out


def nccl_version() -> str | None:
    """The NCCL library torch loaded (asked at run time, so an NCCL swapped in through
    LD_LIBRARY_PATH or a newer nvidia-nccl wheel shows), e.g. "2.21.5"."""
    if not torch.cuda.is_available():
        return None
    try:
        found = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):  # a build without NCCL (ROCm's RCCL, Windows)
        return None
    return ".".join(map(str, found)) if isinstance(found, tuple) else str(found)


def driver_versions() -> dict[str, str | None]:
    """The NVIDIA driver and the newest CUDA it supports, from nvidia-smi's banner: a CUDA
    runtime newer than the driver's CUDA is a classic reason for a GPU to be invisible."""
    found: dict[str, str | None] = {"nvidia_driver": None, "cuda_driver": None}
    banner = _nvidia_smi([])
    if banner:
        for key, label in (("nvidia_driver", "Driver Version"), ("cuda_driver", "CUDA Version")):
            m = re.search(label + r":\s*([0-9.]+)", banner)
            found[key] = m[1] if m else None
    return found


def devices() -> list[dict]:
    if not torch.cuda.is_available():
        return []
    found = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        found.append({"index": i, "name": p.name, "memory_gb": round(p.total_memory / 1e9, 1)})
    return found


def gpu_topology() -> str | None:
    """`nvidia-smi topo -m`: which GPUs talk over NVLink, PCIe switches or the CPU."""
    return _nvidia_smi(["topo", "-m"])


def _nvidia_smi(args: list[str]) -> str | None:
    """nvidia-smi's output, or None where it is missing or fails."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def shm_facts(need_bytes: int | None) -> dict:
    avail = shm_available_bytes()
    size, free = avail if avail else (None, None)
    return {"path": "/dev/shm", "size_bytes": size, "free_bytes": free, "need_bytes": need_bytes}


def collect(need_shm_bytes: int | None) -> dict:
    """Everything env.json records, for this process's machine (`need_shm_bytes`: this
    config's /dev/shm need; None where the config is too wrong to have one)."""
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        # torch's intra-op threads in this process: OpenMP fixes the count when torch is
        # imported (a warm-started rank's, in its agent's fork server), not when the
        # variable is read later
        "threads": {
            "intra_op": torch.get_num_threads(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        },
        "versions": package_versions(),
        "devices": devices(),
        "nccl_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")},
        "gpu_topology": gpu_topology(),
        "shm": shm_facts(need_shm_bytes),
    }
