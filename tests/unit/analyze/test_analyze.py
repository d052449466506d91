"""What the analyser reads in profiler traces, on hand-written traces with known answers:
kernel classes, FLOPs from shapes, SDPA kernels, data-wait and all-reduce attribution, advice."""

from __future__ import annotations

import json

import pytest
import torch

from launcher.analyze.advice import advise
from launcher.analyze.breakdown import breakdown, run_breakdown
from launcher.analyze.kernels import SDPA_OP, classify, op_flops
from launcher.analyze.trace import LOOP_READ, Step

# Kernel and operator names as the profiler records them (H100/H200 cuBLAS, flash, cuDNN,
# Triton, ATen's CUDA kernels; CPU top-level operators), and the class each belongs to.
NAMED_KERNELS = {
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1": "matmul",
    "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT": "matmul",
    "ampere_sgemm_128x64_tn": "matmul",
    "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn>": "matmul",
    "triton_tem_fused_addmm_0": "matmul",
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, cutlass::bfloat16_t>>": (
        "attention"
    ),
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128": "attention",
    "fmha_cutlassB_bf16_aligned_64x64_k64_sm80(PyTorchMemEffAttention::AttentionBackwardKernel)": (
        "attention"
    ),
    "void at::native::vectorized_layer_norm_kernel<c10::BFloat16, float>": "normalization",
    "triton_per_fused_add_native_layer_norm_0": "normalization",
    "void at::native::cunn_SoftMaxForward<4, float, float, LogSoftMaxForwardEpilogue>": (
        "softmax and loss"
    ),
    "void at::native::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>": (
        "softmax and loss"
    ),
    "void at::native::multi_tensor_apply_kernel<TensorListMetadata<4>, FusedAdamMathFunctor>": (
        "optimizer"
    ),
    "void at::native::reduce_kernel<512, 1, ReduceOp<float, func_wrapper_t<float, sum>>>": (
        "reduction"
    ),
    "triton_red_fused_sum_3": "reduction",
    "void at::native::vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>": "elementwise",
    "triton_poi_fused_gelu_1": "elementwise",
    "void at::native::indexSelectLargeIndex<float, long>": "elementwise",
    "aten::linear": "matmul",
    "autograd::engine::evaluate_function: AddmmBackward0": "matmul",
    "aten::scaled_dot_product_attention": "attention",
    "autograd::engine::evaluate_function: ScaledDotProductFlashAttentionForCpuBackward0": (
        "attention"
    ),
    "autograd::engine::evaluate_function: NativeLayerNormBackward0": "normalization",
    "aten::cross_entropy_loss": "softmax and loss",
    "aten::_fused_adamw_": "optimizer",
    "aten::_foreach_norm": "optimizer",
    "aten::sum": "reduction",
    "autograd::engine::evaluate_function: GeluBackward0": "elementwise",
    "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad": "elementwise",
    "aten::gelu": "elementwise",
    "my_custom_kernel": "other",
}


@pytest.mark.parametrize("name", NAMED_KERNELS)
def test_kernel_classes_of_named_kernels(name):
    assert classify(name).name == NAMED_KERNELS[name]


def test_flops_of_matrix_products_from_their_shapes():
    mm = {"Input Dims": [[64, 128], [128, 256]]}
    assert op_flops("aten::mm", mm) == 2 * 64 * 128 * 256
    assert op_flops("aten::addmm", {"Input Dims": [[256], [64, 128], [128, 256]]}) == (
        2 * 64 * 128 * 256
    )
    assert op_flops("aten::bmm", {"Input Dims": [[4, 64, 32], [4, 32, 16]]}) == 2 * 4 * 64 * 32 * 16
    assert op_flops("aten::baddbmm", {"Input Dims": [[4, 64, 16], [4, 64, 32], [4, 32, 16]]}) == (
        2 * 4 * 64 * 32 * 16
    )
    assert op_flops("aten::linear", mm) == 0  # counted once, by the aten::mm it calls
    assert op_flops("aten::mm", {}) == 0  # no shapes recorded: no figure, not a guess


def sdpa_schemas() -> list:
    """Every SDPA kernel of the installed torch, forward and backward, every overload."""
    return [s for s in torch._C._jit_get_all_schemas() if SDPA_OP.match(s.name)]


@pytest.mark.parametrize("schema", sdpa_schemas(), ids=lambda s: f"{s.name}.{s.overload_name}")
def test_attention_flops_of_every_sdpa_kernel(schema):
    """Query, key and is_causal are found in each kernel's own argument list (they sit at
    different positions), and the FLOPs are attention's two products: 4·b·h·t·s·d forward,
    twice that backward, half when causal."""
    names = [a.name for a in schema.arguments]
    dims: list = [[] for _ in names]
    dims[names.index("query")] = [2, 4, 64, 32]
    dims[names.index("key")] = [2, 4, 128, 32]
    concrete = [""] * len(names)
    forward = 4 * 2 * 4 * 64 * 128 * 32
    expected = 2 * forward if schema.name.endswith("_backward") else forward
    assert op_flops(schema.name, {"Input Dims": dims, "Concrete Inputs": concrete}) == expected
    if "is_causal" in names:
        concrete[names.index("is_causal")] = "True"
        causal = op_flops(schema.name, {"Input Dims": dims, "Concrete Inputs": concrete})
        assert causal == expected / 2


def test_sdpa_kernels_are_found_in_this_torch():
    found = {s.name for s in sdpa_schemas()}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in found
    assert "aten::_scaled_dot_product_flash_attention_for_cpu_backward" in found
    assert "aten::_scaled_dot_product_cudnn_attention_backward" in found
    assert not any(name.startswith("aten::scaled_dot") for name in found)  # the wrapper


def cpu_trace(tmp_path, events):
    """A hand-written CPU trace of one step (0-1000 us) on the training thread."""
    base = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "launcher/step 9",
            "pid": 1,
            "tid": 1,
            "ts": 0.0,
            "dur": 1000.0,
        },
    ]
    base += [
        {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}
        for cat, name, ts, dur in events
    ]
    folder = tmp_path / "traces" / "rank0"
    folder.mkdir(parents=True)
    (folder / "rank0.1.pt.trace.json").write_text(json.dumps({"traceEvents": base}))
    return tmp_path


def findings(run_dir):
    return {a.finding: a for a in advise(run_breakdown(run_dir))}


def test_advice_names_a_data_loading_stall(tmp_path):
    run = cpu_trace(
        tmp_path,
        [
            (
                "user_annotation",
                "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
                0.0,
                400.0,
            ),
            ("cpu_op", "aten::linear", 400.0, 600.0),
        ],
    )
    found = findings(run)
    assert list(found) == ["the step waits for data"]
    assert "data.num_workers" in found["the step waits for data"].knobs
    assert "0.4 ms per step" in found["the step waits for data"].evidence


def test_advice_names_a_per_step_item(tmp_path):
    run = cpu_trace(
        tmp_path,
        [
            ("cpu_op", "aten::linear", 0.0, 900.0),
            ("cpu_op", "aten::is_nonzero", 900.0, 10.0),  # the model's own read: not advised
            ("cpu_op", "aten::_local_scalar_dense", 901.0, 5.0),
            ("cpu_op", "aten::item", 950.0, 10.0),  # the loop's .item()
            ("cpu_op", "aten::_local_scalar_dense", 951.0, 8.0),
        ],
    )
    found = findings(run)
    assert list(found) == ["synchronisations inside the step"]
    evidence = found["synchronisations inside the step"].evidence
    assert "scalar read in the training loop (.item())` x1.0" in evidence
    assert "is_nonzero" not in evidence
    (row,) = run_breakdown(run)
    assert row.syncs == {"scalar read in aten::is_nonzero": 1, LOOP_READ: 1}


def test_no_advice_without_evidence(tmp_path):
    run = cpu_trace(tmp_path, [("cpu_op", "aten::linear", 0.0, 990.0)])
    assert findings(run) == {}


def test_an_all_reduce_closed_after_its_step_counts_only_inside_it(tmp_path):
    """gloo completes an all-reduce's future before it closes the `gloo:all_reduce` event,
    so on a busy machine the event can end after the step that waited for it (the cause of
    comm_s > step_s once in a full run): only its part inside the step is the step's."""
    run = cpu_trace(
        tmp_path,
        [
            ("cpu_op", "aten::linear", 0.0, 600.0),
            ("user_annotation", "gloo:all_reduce", 500.0, 800.0),  # closed at 1300, step ends 1000
        ],
    )
    (row,) = run_breakdown(run)
    assert row.comm_s == pytest.approx(500e-6) and row.comm_s < row.step_s
    assert row.exposed_comm_s == pytest.approx(400e-6)  # 600-1000: nothing else ran
    assert row.collectives["all_reduce"] == (1, pytest.approx(500e-6))


def test_cpu_operators_inside_the_data_wait_count_as_data_wait():
    """Without loader workers the batch is collated in the training process, inside the
    data wait: those operators are data loading, not compute, so that compute, data wait
    and idle add up to the step (they once added up to more, failing the sweep test)."""
    step = Step(number=1, start=0.0, end=100.0)
    step.data_wait = [(0.0, 20.0)]
    step.compute = [(5.0, 15.0), (20.0, 70.0)]  # aten::stack while collating, then forward
    step.comm = [(60.0, 90.0)]
    row = breakdown(step, rank=0, gpu=False)
    us = {k: getattr(row, k) * 1e6 for k in ("compute_s", "data_wait_s", "idle_s", "step_s")}
    assert us == pytest.approx({"compute_s": 50, "data_wait_s": 20, "idle_s": 10, "step_s": 100})


def test_each_table_of_the_report_names_each_column_once():
    """`analyze` printed `| rank | step | step |`: the second was the step's time."""
    from launcher.analyze.report import COLUMNS, markdown

    row = {"rank": 0, "step": 5, "overlap_ratio": None, "collectives": {}, "syncs": {}}
    row.update({key: 0.001 for key, _ in COLUMNS})
    straggler = {"step": 5, "slowest_rank": 0, "step_s": 0.1, "behind_median_s": 0.0,
                 "waited_for": {}}  # fmt: skip
    report = {"run_dir": "r", "device": "cpu", "ranks": [0, 1], "steps": [5], "advice": [],
              "per_step": [row], "stragglers": [straggler], "top_ops": [],
              "kernel_classes": [], "bound_shares": {"compute": 0, "memory": 0, "other": 0},
              "peak_flops": None, "merged_trace": "m.json"}  # fmt: skip
    headers = [
        ln for ln in markdown(report).splitlines() if ln.startswith("| ") and "---" not in ln
    ]
    tables = [h for h in headers if not h.startswith(("| 0 |", "| 5 |"))]
    assert len(tables) == 4  # per step, stragglers, operators, kernel classes
    for header in tables:
        cells = [c.strip() for c in header.strip("|").split("|")]
        assert len(cells) == len(set(cells)), header
    assert tables[0].startswith("| rank | step | step time | compute |")
