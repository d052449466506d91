"""Compute by kernel class: which kind of work a step's compute time goes to, whether that
kind is bound by arithmetic or by memory bandwidth, and the FLOP/s the arithmetic achieves.

A GPU step that is slow for want of FLOP/s looks different from one that is slow for want
of memory bandwidth: matrix multiplications and attention run on the tensor cores and are
judged by the FLOP/s they reach (against the device's peak, launcher.observe.peaks); elementwise
work, normalisation, softmax and loss, reductions and the optimizer move every byte once
or twice for a few operations each, and are judged by how much of the step they take,
since fusing them (torch.compile) removes passes over memory rather than arithmetic.

Classes come from names: GPU kernel names (cuBLAS `sm90_xmma_gemm_*` and `nvjet_*`, flash
and cuDNN attention, `vectorized_elementwise_kernel`, Triton's `triton_poi_*`) and, on a CPU
trace, the top-level operators (`aten::linear`, `...: AddmmBackward0`). FLOPs come from the
operators' input shapes, which the profiler records with `profiler.with_flops` (or
`record_shapes`): 2 per multiply-add of `aten::mm`/`addmm`/`bmm`/`baddbmm`, and for SDPA
the two matrix products of attention (4·b·h·t·s·d forward, twice that backward), halved
when causal (a causal kernel computes half of the score matrix). Recomputation is not
counted: these are the FLOPs the math needs, the numerator MFU uses.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class KernelClass:
    name: str
    bound: str | None  # "compute", "memory", or None where the name says too little
    pattern: re.Pattern


# First match wins: attention before matmul (flash kernels are built on CUTLASS), the
# named memory-bound kinds before the catch-all elementwise class.
CLASSES: tuple[KernelClass, ...] = tuple(
    KernelClass(name, bound, re.compile(pattern, re.IGNORECASE))
    for name, bound, pattern in (
        ("attention", "compute", r"flash|fmha|attention|sdpa|scaled_dot_product"),
        (
            "matmul",
            "compute",
            r"gemm|matmul|xmma|cutlass|cublas|wgmma|nvjet|triton_tem_|"
            r"aten::(mm|addmm|bmm|baddbmm|linear|_scaled_mm)$|(Addmm|Mm|Bmm|Baddbmm)Backward",
        ),
        ("normalization", "memory", r"layer_?norm|rms_?norm|batch_?norm|group_?norm"),
        ("softmax and loss", "memory", r"soft_?max|cross_entropy|nll_?loss"),
        ("optimizer", "memory", r"adam|sgd|multi_tensor_apply|_foreach_|optimizer\."),
        (
            "reduction",
            "memory",
            r"reduce|triton_red_|triton_per_|aten::(sum|mean|norm|amax|max|min)$|"
            r"(Sum|Mean)Backward",
        ),
        (
            "elementwise",
            "memory",
            r"elementwise|vectorized|unrolled|triton_poi_|gelu|tanh|dropout|copy|fill|cat|"
            r"index|embedding|gather|scatter|AccumulateGrad|Backward0|^aten::",
        ),
    )
)
OTHER = KernelClass("other", None, re.compile(""))

# Matrix products: operator -> the positions of its two matrix operands.
MATMUL_OPERANDS = {
    "aten::mm": (0, 1),
    "aten::bmm": (0, 1),
    "aten::_scaled_mm": (0, 1),
    "aten::addmm": (1, 2),
    "aten::baddbmm": (1, 2),
}
# SDPA's kernels (not the public `aten::scaled_dot_product_attention`, which calls one of
# them, nor the `_flash_attention_forward` they call: each product is counted once).
SDPA_OP = re.compile(r"^aten::_scaled_dot_product_(flash|efficient|cudnn|fused)\w*attention\w*$")


def classify(name: str) -> KernelClass:
    """The class of a GPU kernel or a CPU operator, by its name."""
    for cls in CLASSES:
        if cls.pattern.search(name):
            return cls
    return OTHER


def op_flops(name: str, args: dict) -> float:
    """FLOPs of one operator call from its recorded input shapes (0 for operators without
    a formula, or when the profiler recorded no shapes)."""
    dims = args.get("Input Dims")
    if not dims:
        return 0.0
    if name in MATMUL_OPERANDS:
        a, b = (dims[i] for i in MATMUL_OPERANDS[name])
        return 2.0 * math.prod(a) * b[-1] if a and b else 0.0
    if SDPA_OP.match(name):
        return _attention_flops(name, dims, args.get("Concrete Inputs") or [])
    return 0.0


def _attention_flops(name: str, dims: list, concrete: list) -> float:
    positions = _sdpa_positions(name, len(dims))
    if positions is None:
        return 0.0
    query, key, causal = positions
    q, k = dims[query], dims[key]
    if len(q) != 4 or len(k) != 4:
        return 0.0
    b, h, t, d = q
    forward = 4.0 * b * h * t * k[2] * d  # Q·Kᵀ and P·V
    if causal is not None and causal < len(concrete) and concrete[causal] == "True":
        forward /= 2
    return 2 * forward if name.endswith("_backward") else forward


@functools.cache
def _sdpa_positions(name: str, arity: int) -> tuple[int, int, int | None] | None:
    """Where query, key and is_causal sit among the operator's arguments, from the schema
    of the overload with `arity` arguments: the positions differ between SDPA's kernels,
    their backward and torch versions, so they are read from the installed torch."""
    import torch

    try:
        schemas = torch._C._jit_get_schemas_for_operator(name)
    except RuntimeError:
        return None
    for schema in schemas:
        names = [a.name for a in schema.arguments]
        if len(names) == arity and "query" in names and "key" in names:
            causal = names.index("is_causal") if "is_causal" in names else None
            return names.index("query"), names.index("key"), causal
    return None


def class_table(
    ops: list[dict[str, list[float]]], flops: list[dict[str, float]], peak: float | None
) -> list[dict]:
    """Per class, over the profiled rank-steps: seconds and calls per step, share of the
    classified compute time, FLOPs per step, achieved TFLOP/s and share of the bf16 peak.

    `ops` holds each rank-step's durations (microseconds) by kernel or top-level operator
    name, `flops` each rank-step's FLOPs by class name.
    """
    steps = max(len(ops), 1)
    seconds: dict[str, float] = {}
    calls: dict[str, int] = {}
    for step_ops in ops:
        for name, durations in step_ops.items():
            cls = classify(name).name
            seconds[cls] = seconds.get(cls, 0.0) + sum(durations) * 1e-6
            calls[cls] = calls.get(cls, 0) + len(durations)
    counted: dict[str, float] = {}
    for step_flops in flops:
        for cls, value in step_flops.items():
            counted[cls] = counted.get(cls, 0.0) + value
    total = sum(seconds.values())
    rows = []
    for cls in (*CLASSES, OTHER):
        if cls.name not in seconds:
            continue
        spent, done = seconds[cls.name], counted.get(cls.name, 0.0)
        rate = done / spent if done and spent else None
        rows.append(
            {
                "class": cls.name,
                "bound": cls.bound,
                "seconds_per_step": spent / steps,
                "share": spent / total if total else 0.0,
                "calls_per_step": calls[cls.name] / steps,
                "flops_per_step": done / steps if done else None,
                "tflops": rate / 1e12 if rate else None,
                "peak_share": rate / peak if rate and peak else None,
            }
        )
    return sorted(rows, key=lambda r: -r["seconds_per_step"])


def bound_shares(table: list[dict]) -> dict[str, float]:
    """Share of the classified compute time that is compute-bound, memory-bound, other."""
    out = {"compute": 0.0, "memory": 0.0, "other": 0.0}
    for row in table:
        out[row["bound"] or "other"] += row["share"]
    return out
