"""What the plan assumes where nothing was measured: the devices' memory and the MFU a
well-tuned GPT-2 step reaches on them, and the interconnects' bus bandwidth and latency.

Every figure here is stated, not measured, and a plan marks each one it uses as assumed,
with where it comes from (docs/plan.md). `--from RUN_DIR` replaces the MFU (and the overlap,
the checkpoint write speed) with what a run on the target hardware measured; the command's
flags replace the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.observe.peaks import PEAK_BF16_FLOPS, peak_for_name


@dataclass(frozen=True)
class Device:
    name: str
    peak_flops: float  # dense bf16, launcher.observe.peaks
    memory_bytes: int  # what the framework can use of it
    mfu: float  # a tuned GPT-2 step's model FLOPs utilisation (assumed)
    source: str  # where the MFU comes from


GB = 10**9
# MFU: the project's H200 run (benchmarks/results/2026-12-04-nvidia-h200.json, 45.7% at
# micro-batch 64) rounded down for a first plan; llm.c's A100 figures (about 50-56%, shared
# notes) for Ampere.
DEVICES = {
    "H200": Device("H200", peak_for_name("H200"), 141 * GB, 0.45,
                   "the project's H200 run: 45.7% MFU, gpt2 124M, micro-batch 64"),
    "H100": Device("H100", peak_for_name("H100"), 80 * GB, 0.40,
                   "llm.c / modded-nanogpt GPT-2 124M on 8xH100: about 40% MFU"),
    "A100": Device("A100", peak_for_name("A100"), 80 * GB, 0.50,
                   "llm.c GPT-2 124M on 8xA100: about 50-56% MFU"),
}  # fmt: skip
DEFAULT_DEVICE = "H100"
KNOWN_PEAKS = tuple(name for name, _ in PEAK_BF16_FLOPS)


@dataclass(frozen=True)
class Link:
    """An interconnect as an alpha-beta model: a collective of B bytes over n ranks takes
    steps x alpha + traffic(B, n) / bus bandwidth (docs/plan.md)."""

    name: str
    busbw: float  # bytes/s: nccl-tests' bus bandwidth, per rank
    alpha: float  # seconds a step of a ring or tree costs besides its bytes
    source: str


LINKS = {
    "nvlink": Link("nvlink", 370 * GB, 5e-6,
                   "nccl-tests, 8xH100 NVLink all-reduce ring: about 370 GB/s bus bandwidth"),
    "infiniband": Link("infiniband", 46 * GB, 10e-6,
                       "NDR 400 Gb/s, one NIC per GPU: 46-48 GB/s bus bandwidth (nccl-tests)"),
    "ethernet": Link("ethernet", 10 * GB, 50e-6,
                     "100 GbE shared by a node's GPUs: about 10 GB/s bus bandwidth"),
    "gloo": Link("gloo", 1.5 * GB, 50e-6,
                 "gloo on CPU, 2 processes: 1-2.4 GB/s (public reports, shared notes)"),
}  # fmt: skip


def link_for(nccl_preset: str, nodes: int, on_gpu: bool) -> Link:
    """The link a job's gradients cross: its `nccl` group's, else NVLink within one GPU
    node, InfiniBand across nodes, gloo on the CPU."""
    if not on_gpu:
        return LINKS["gloo"]
    if nccl_preset in LINKS:
        return LINKS[nccl_preset]
    return LINKS["nvlink"] if nodes == 1 else LINKS["infiniband"]
