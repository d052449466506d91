"""Per-rank profiler traces from a real 2-rank gloo run, and what the analyser reads in them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from launcher.analyze.advice import advise
from launcher.analyze.breakdown import run_breakdown
from launcher.analyze.trace import LOOP_READ, load, rank_trace_files

from launch import FAST, base_env, explain, losses, metrics, summary, torchrun

PROFILED = [5, 6, 7, 8, 9]  # five steps: the comparison averages over them


RUN = [
    *FAST,
    "trainer.max_steps=10",
    "trainer.eval_interval=0",
    "trainer.checkpoint_interval=0",
    "strategy.bucket_cap_mb=0.05",
]
PROFILE = ["profiler=steps", "profiler.skip_first=3", "profiler.warmup=1", "profiler.active=5"]


@pytest.fixture(scope="module")
def profiled_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("prof")
    proc = torchrun([*RUN, *PROFILE, f"run.root={root}", "run.id=p"])
    assert proc.returncode == 0, explain(proc)
    return root / "p"


def test_profiling_changes_no_result(profiled_run, tmp_path):
    proc = torchrun([*RUN, f"run.root={tmp_path}", "run.id=plain"])
    assert proc.returncode == 0, explain(proc)
    assert losses(profiled_run) == losses(tmp_path / "plain")  # every step, exactly
    assert not (tmp_path / "plain" / "traces").exists()


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
    for row in run_breakdown(profiled_run):
        assert row.collectives["all_reduce"][0] == buckets, row


def test_live_exposed_comm_agrees_with_the_trace(profiled_run):
    """The trainer's comm/exposed_s (timed around the hook) and the trace's communication
    not overlapped by computation, over the same steps, within 20%."""
    live = {r["step"]: r for r in metrics(profiled_run) if "loss" in r}
    rows = run_breakdown(profiled_run)
    traced = sum(r.exposed_comm_s for r in rows) / 2  # mean over the 2 ranks, summed over steps
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
    (row,) = run_breakdown(run)
    assert (row.rank, row.step, row.gpu) == (0, 3, True)
    assert row.collectives == {"AllReduce": (1, pytest.approx(200e-6))}
    assert row.comm_s == pytest.approx(200e-6) and row.compute_s == pytest.approx(250e-6)
    assert row.exposed_comm_s == pytest.approx(100e-6)
    assert row.idle_s == 0.0  # 100-450 always ran a kernel (the NCCL one covers 300-350)
    (exposed,) = advise([row])
    assert "strategy.bucket_cap_mb" in exposed.knobs and "waited for" not in exposed.evidence
    (exposed,) = advise([row], waited_for={0: 1, 1: 9})  # 9 of 10 all-reduces: a straggler
    assert "9 of 10 all-reduces waited for rank 1" in exposed.evidence
    assert row.overlap_ratio == pytest.approx(0.5)


def test_cuda_trace_counts_gpu_work_launched_by_nccl_as_communication(tmp_path):
    run = cuda_trace(tmp_path, [("gemm", 0.0, 10.0), ("memcpy-from-nccl", 20.0, 30.0)])
    (row,) = run_breakdown(run)
    assert row.comm_s == pytest.approx(10e-6) and row.exposed_comm_s == pytest.approx(10e-6)


def test_analyze_writes_report_and_merged_trace(profiled_run):
    cmd = [sys.executable, "-m", "launcher.analyze", str(profiled_run)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=base_env())
    assert proc.returncode == 0, explain(proc)
    report = json.loads((profiled_run / "analysis" / "report.json").read_text())
    buckets = summary(profiled_run)["comm/buckets"]
    assert (report["device"], report["ranks"], report["steps"]) == ("cpu", [0, 1], PROFILED)
    assert len(report["per_step"]) == 2 * len(PROFILED)
    for row in report["per_step"]:
        assert row["collectives"]["all_reduce"][0] == buckets
        assert row["exposed_comm_s"] <= row["comm_s"] < row["step_s"]
        parts = row["compute_s"] + row["data_wait_s"] + row["idle_s"]
        assert parts <= row["step_s"] * 1.0001 and row["idle_s"] >= 0
    assert [s["step"] for s in report["stragglers"]] == PROFILED
    for s in report["stragglers"]:
        assert sum(s["waited_for"].values()) == buckets  # one verdict per all-reduce
    assert "## Advice" in (profiled_run / "analysis" / "report.md").read_text()
    merged = json.loads((profiled_run / "analysis" / "merged_trace.json").read_text())
    lanes = {e["pid"] for e in merged["traceEvents"] if e.get("ph") == "X"}
    assert lanes == {0, 1}


def test_analyze_refuses_a_directory_without_traces(tmp_path):
    cmd = [sys.executable, "-m", "launcher.analyze", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=base_env())
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "profiler=steps" in proc.stderr


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
