"""GPU paths (NCCL, CUDA-event timing, pinned memory, fused AdamW, MFU): run where a GPU is."""

from __future__ import annotations

import pytest
import torch

from launch import FAST, explain, metrics, python_train, summary, torchrun

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@needs_gpu
def test_single_gpu_run_reports_memory_and_bf16(tmp_path):
    proc = python_train(
        [
            *FAST,
            f"run.root={tmp_path}",
            "run.id=gpu",
            "trainer.precision=bf16",
            "data.num_workers=2",
            "data.persistent_workers=true",
        ]
    )
    assert proc.returncode == 0, explain(proc)
    records = [r for r in metrics(tmp_path / "gpu") if "loss" in r]
    assert all(r["mem/peak_gb"] > 0 for r in records)
    name = torch.cuda.get_device_name(0)
    known = any(k in name for k in ("H100", "H200", "A100", "L4", "A10", "B200"))
    assert (summary(tmp_path / "gpu")["mfu"] is not None) == known


@needs_gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a CUDA GPU pair (2 devices)")
def test_two_gpus_over_nccl(tmp_path):
    proc = torchrun([*FAST, f"run.root={tmp_path}", "run.id=nccl"])
    assert proc.returncode == 0, explain(proc)
    assert "backend nccl" in proc.stderr
