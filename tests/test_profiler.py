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
