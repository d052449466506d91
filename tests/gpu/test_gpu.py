"""GPU paths (NCCL, CUDA-event timing, pinned memory, fused AdamW, MFU): run where a GPU is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from launcher.config import compose
from launcher.model.build import build_model

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


@needs_gpu
def test_nccl_debug_records_the_transport(tmp_path):
    """nccl=debug on NCCL: each rank's NCCL log lands in logs/ and env.json says what NCCL
    used. One GPU: its one rank has no peer, hence no channel; two: P2P, NVLS or SHM."""
    nproc = min(torch.cuda.device_count(), 2)
    overrides = [*FAST, "trainer.max_steps=2", "nccl=debug", f"run.root={tmp_path}", "run.id=n"]
    proc = torchrun(overrides, nproc=nproc)
    assert proc.returncode == 0, explain(proc)
    env = json.loads((tmp_path / "n" / "env.json").read_text())
    record = env["nccl_transport"]
    assert [e["rank"] for e in record["ranks"]] == list(range(nproc))
    for entry in record["ranks"]:
        assert (tmp_path / "n" / entry["log"]).is_file()
        assert entry["nranks"] == nproc and entry["communicators"] >= 1
    assert record["ranks"][0]["version"].startswith(env["versions"]["nccl"])
    assert env["nccl_env"]["NCCL_DEBUG_FILE"].startswith(str(tmp_path / "n" / "logs"))
    assert not (tmp_path / ".nccl-logs").exists()
    if nproc > 1:
        assert record["job"]["kinds"] and set(record["job"]["kinds"]) <= {"P2P", "SHM", "NVLS"}


@needs_gpu
def test_comm_figures_on_nccl(tmp_path):
    """CUDA-event timing of the comm hook on NCCL: figures present and consistent, the bus
    bandwidth null with one rank, a number with two."""
    nproc = min(torch.cuda.device_count(), 2)
    overrides = [*FAST, "strategy.bucket_cap_mb=0.05", f"run.root={tmp_path}", "run.id=c"]
    proc = torchrun(overrides, nproc=nproc)
    assert proc.returncode == 0, explain(proc)
    for r in (r for r in metrics(tmp_path / "c") if "loss" in r):
        assert 0 <= r["comm/exposed_s"] <= r["comm/allreduce_s"] <= r["step_time_s/max"]
        assert r["comm/bytes"] > 0
        assert (r["comm/busbw_gbps"] is None) == (nproc == 1)


@needs_gpu
def test_profiler_full_writes_a_memory_snapshot_and_the_analyser_reads_cuda_traces(tmp_path):
    """profiler=full on a GPU: a CUDA trace the analyser breaks down into kernels, and an
    allocation-history snapshot next to it."""
    import pickle
    import subprocess
    import sys

    from launch import base_env

    overrides = [*FAST, "trainer.max_steps=8", "profiler=full", "profiler.skip_first=3"]
    proc = python_train([*overrides, f"run.root={tmp_path}", "run.id=full"])
    assert proc.returncode == 0, explain(proc)
    run = tmp_path / "full"
    (snapshot,) = (run / "traces" / "rank0").glob("memory_snapshot.step*.pickle")
    state = pickle.loads(snapshot.read_bytes())
    assert state["segments"] and any(state["device_traces"])  # allocator state + history
    cmd = [sys.executable, "-m", "launcher.analyze", str(run)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=base_env())
    assert done.returncode == 0, explain(done)
    report = json.loads((run / "analysis" / "report.json").read_text())
    assert report["device"] == "gpu" and all(r["compute_s"] > 0 for r in report["per_step"])


@needs_gpu
def test_out_of_memory_writes_a_snapshot_named_in_the_error_line(tmp_path):
    free, _ = torch.cuda.mem_get_info()
    vocab, seq = 50257, 1024
    micro = int(2 * free / (seq * vocab * 4)) + 1  # one micro-batch's fp32 logits: 2x free
    overrides = [
        *FAST,
        "data=synthetic",
        f"data.vocab_size={vocab}",
        f"trainer.seq_len={seq}",
        f"trainer.micro_batch_size={micro}",
        f"trainer.global_batch_size={micro}",
        f"run.root={tmp_path}",
        "run.id=oom",
    ]
    proc = python_train(overrides)
    assert proc.returncode == 4, explain(proc)  # EXIT_OOM
    (line,) = [ln for ln in proc.stderr.splitlines() if "CUDA out of memory on rank 0" in ln]
    path = Path(line.split("memory snapshot: ")[1].split(" (open at")[0])
    assert path.parent == tmp_path / "oom" / "traces" / "rank0" and path.stat().st_size > 0
    assert "trainer.grad_checkpointing=true" in line


@needs_gpu
@pytest.mark.parametrize("impl", ["native", "hf"])
def test_the_model_built_on_the_gpu_has_the_cpu_builds_values(impl):
    """launcher.model.materialize: every random fill drawn on the CPU in the build's order,
    so the GPU's parameters are bit for bit a CPU build's for the same seed."""
    cfg = compose([f"model.impl={impl}"]).model
    torch.manual_seed(5)
    gpu = build_model(cfg, 50257, device="cuda")
    torch.manual_seed(5)
    cpu = build_model(cfg, 50257)
    assert all(p.is_cuda for p in gpu.parameters())
    assert gpu.lm_head.weight is gpu.transformer.wte.weight
    ours, theirs = gpu.state_dict(), cpu.state_dict()
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key].cpu(), theirs[key]), key
