"""The recorder's records and summary: each record goes to every sink, the summary's
medians leave the first (start-up) interval out, and the counts of the loop's policies
appear where their policy is on, under their documented names."""

from __future__ import annotations

import pytest

from launcher.observe.recorder import SUMMARY_COMM_KEYS, Recorder
from launcher.observe.sinks import Sink
from launcher.runtime.process import Runtime

from in_process import CPU, trainer


class Kept(Sink):
    def __init__(self):
        self.records = []

    def log(self, record: dict) -> None:
        self.records.append(record)


def recorder(sink: Sink | None = None, **trainer_overrides) -> Recorder:
    rt = Runtime(0, 0, 1, CPU, None, run_id="r1")
    t = trainer(**trainer_overrides)
    return Recorder(rt, t, [sink] if sink else [], tokens_per_step=64, flops_per_token=6.0,
                    mfu=lambda tokens_per_s: None, micro_batch=4)  # fmt: skip


def interval(step: int, tokens_per_s: float) -> dict:
    return {"step": step, "loss": 1.0 / step, "tokens_per_s": tokens_per_s, "mfu": None,
            "step_time_s/p50": 0.1, "step_time_s/p90": 0.2, "step_time_s/max": 0.3 * step,
            "data_wait_s": 0.0, "mem/peak_gb": None, "mem/host_peak_gb": 1.0,
            "comm/buckets": 2}  # fmt: skip


def test_records_reach_every_sink_and_the_summary_leaves_the_first_interval_out():
    kept = Kept()
    rec = recorder(kept)
    rec.begin(10)
    for step, speed in ((12, 1.0), (14, 100.0), (16, 300.0)):
        rec.log(interval(step, speed))
    rec.log({"step": 16, "eval/loss": 2.0, "eval/ppl": 7.4, "eval/time_s": 0.5})
    assert len(kept.records) == 4
    summary = rec.summary("completed", 16)
    assert summary["tokens_per_s"] == pytest.approx(200.0)  # 1.0, start-up, left out
    assert summary["step_time_s/max"] == pytest.approx(4.8)
    assert summary["loss"] == pytest.approx(1 / 16)
    assert summary["eval/loss"] == 2.0
    assert (summary["resumed_from_step"], summary["tokens"], summary["run_id"]) == (10, 1024, "r1")
    assert all(key in summary for key in SUMMARY_COMM_KEYS)
    assert "bad_steps/skipped" not in summary and "micro_batch" not in summary


@pytest.mark.parametrize(
    ("policy", "names"),
    [("stop", set()), ("skip", {"bad_steps/skipped"}),
     ("rewind", {"bad_steps/skipped", "bad_steps/rewinds"})],
)  # fmt: skip
def test_bad_step_counts_follow_the_policy(policy, names):
    assert set(recorder(on_nonfinite=policy).bad_step_counts()) == names


def test_the_micro_batch_figures_where_it_can_change_in_process():
    assert recorder().micro_batch_figures() == {}
    rec = recorder(on_oom="retry")
    rec.micro_batch, rec.oom_retries = 2, 1
    assert rec.micro_batch_figures() == {"micro_batch": 2, "oom/retries": 1}


def test_one_rank_agrees_with_itself_and_an_engine_without_replicas_says_nothing():
    rec = recorder()
    rec.compare_replicas(None)
    assert rec.replicas_in_sync is None
    rec.compare_replicas([1.0, 2.0])
    assert rec.replicas_in_sync is True
