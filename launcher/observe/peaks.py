"""Dense bf16 tensor-core peaks of the GPUs we know, by device name.

MFU and the analyser's "share of peak" are only as honest as the peak they divide by, so
a device missing here gets None (reported as null), never a guessed figure. Kept free of
torch so that the analyser, which reads traces, can use it without the training stack.
"""

from __future__ import annotations

# FLOP/s, matched against the device name. Order matters: the first substring that
# matches wins ("H100 PCIe" before "H100").
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),
    ("GH200", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("A10G", 70e12),
    ("A10", 125e12),
    ("L40S", 362e12),
    ("L4", 121e12),
)


def peak_for_name(device_name: str | None) -> float | None:
    """The dense bf16 peak of the GPU called `device_name` ("NVIDIA H200"), or None."""
    for key, peak in PEAK_BF16_FLOPS:
        if device_name and key in device_name:
            return peak
    return None
