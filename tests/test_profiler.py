"""Per-rank profiler traces from a real 2-rank gloo run, and what the analyser reads in them."""

from __future__ import annotations

import json

import pytest

from launcher.analyze.comm import comm_by_step
from launcher.analyze.trace import load, rank_trace_files

from launch import FAST, explain, metrics, summary, torchrun

PROFILED = [5, 6, 7]


@pytest.fixture(scope="module")
def profiled_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("prof")
    overrides = [
        *FAST,
        "trainer.max_steps=8",
        "trainer.eval_interval=0",
        "trainer.checkpoint_interval=0",
        "strategy.bucket_cap_mb=0.05",
        "profiler=steps",
        "profiler.skip_first=3",
        "profiler.warmup=1",
        "profiler.active=3",
        f"run.root={root}",
        "run.id=p",
    ]
    proc = torchrun(overrides)
    assert proc.returncode == 0, explain(proc)
    return root / "p"


def test_each_rank_writes_only_its_own_traces(profiled_run):
    files = rank_trace_files(profiled_run)
    assert sorted(files) == [0, 1]
    for rank, paths in files.items():
        assert len(paths) == 1  # repeat=1: one recorded cycle
        trace = load(paths[0])
        assert trace.meta["distributedInfo"]["rank"] == rank
        assert [s.number for s in trace.steps()] == PROFILED


def test_trace_all_reduces_follow_buckets(profiled_run):
    buckets = summary(profiled_run)["comm/buckets"]
    assert buckets > 1
    for row in comm_by_step(profiled_run):
        assert row.collectives == buckets, row


def test_live_exposed_comm_agrees_with_the_trace(profiled_run):
    """The trainer's comm/exposed_s (timed around the hook) and the trace's communication
    not overlapped by computation, over the same steps, within 20%."""
    live = {r["step"]: r for r in metrics(profiled_run) if "loss" in r}
    rows = comm_by_step(profiled_run)
    traced = sum(r.exposed_s for r in rows) / 2  # mean over the 2 ranks, summed over steps
    measured = sum(live[s]["comm/exposed_s"] for s in PROFILED)
    assert traced == pytest.approx(measured, rel=0.2), (traced, measured)
    print(json.dumps({"exposed_s": {"trace": traced, "live": measured}}))


def cuda_trace(tmp_path, kernels):
    """A hand-written CUDA-style trace: one step region on the CPU, each kernel launched
    inside it (correlated runtime events), kernels given as (name, start, end) in us."""
    events = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "launcher/step 3",
            "pid": 1,
            "tid": 1,
            "ts": 0.0,
            "dur": 100.0,
        },
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "nccl:all_reduce",
            "pid": 1,
            "tid": 1,
            "ts": 50.0,
            "dur": 5.0,
        },
    ]
    for i, (name, start, end) in enumerate(kernels):
        launch = 51.0 if name == "memcpy-from-nccl" else 1.0 + i
        events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 1,
                "tid": 1,
                "ts": launch,
                "dur": 0.5,
                "args": {"correlation": i},
            }
        )
        cat = "gpu_memcpy" if name.startswith("memcpy") else "kernel"
        events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": 0,
                "tid": 7,
                "ts": start,
                "dur": end - start,
                "args": {"correlation": i},
            }
        )
    folder = tmp_path / "traces" / "rank0"
    folder.mkdir(parents=True)
    (folder / "rank0.1.pt.trace.json").write_text(
        json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": events})
    )
    return tmp_path


def test_cuda_trace_exposed_communication_and_overlap(tmp_path):
    # compute 100-300 and 350-400; NCCL 250-450: 100 us hidden, 100 us exposed
    run = cuda_trace(
        tmp_path,
        [
            ("ampere_sgemm", 100.0, 300.0),
            ("elementwise", 350.0, 400.0),
            ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 250.0, 450.0),
        ],
    )
    (row,) = comm_by_step(run)
    assert (row.rank, row.step, row.collectives) == (0, 3, 1)
    assert row.comm_s == pytest.approx(200e-6)
    assert row.exposed_s == pytest.approx(100e-6)
    assert row.overlap_ratio == pytest.approx(0.5)


def test_cuda_trace_counts_gpu_work_launched_by_nccl_as_communication(tmp_path):
    run = cuda_trace(tmp_path, [("gemm", 0.0, 10.0), ("memcpy-from-nccl", 20.0, 30.0)])
    (row,) = comm_by_step(run)
    assert row.comm_s == pytest.approx(10e-6) and row.exposed_s == pytest.approx(10e-6)
