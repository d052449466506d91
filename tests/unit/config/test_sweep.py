"""A sweep's plan in-process: point labels name the swept values, and a strategy sweep's
comparison leaves out keys of one engine only."""

from __future__ import annotations

from launcher.config.sweep import Point, point_label, summary_rows, varied_keys


def test_point_label_names_the_swept_values():
    job = ["+exp=bucket_sweep", "trainer.max_steps=6", "strategy.bucket_cap_mb=0.25"]
    assert point_label(job, ["strategy.bucket_cap_mb"]) == "bucket_cap_mb=0.25"
    two = ["strategy.comm_hook=bf16", "data.paths=[a/b.txt]"]
    assert point_label(two, ["strategy.comm_hook", "data.paths"]) == (
        "comm_hook=bf16,paths=[a_b.txt]"
    )


def test_keys_of_one_engine_are_not_what_a_strategy_sweep_compared():
    """ddp against zero1/zero2: DDP-only keys (and DeepSpeed keys equal in every
    DeepSpeed point) are not compared; the stage is, blank for the DDP point."""
    ddp = {"strategy.name": "ddp", "strategy.bucket_cap_mb": 25.0, "strategy.comm_hook": "none"}
    ds = {"strategy.name": "deepspeed", "strategy.reduce_bucket_size": 500}
    points = [
        Point("strategy=ddp", ddp, {"status": "completed"}),
        Point("strategy=zero1", {**ds, "strategy.zero_stage": 1}, {"status": "completed"}),
        Point("strategy=zero2", {**ds, "strategy.zero_stage": 2}, {"status": "completed"}),
    ]
    assert varied_keys(points) == ["strategy.name", "strategy.zero_stage"]
    rows = summary_rows(points)
    assert [r["strategy.zero_stage"] for r in rows] == [None, 1, 2]
    assert "loss_diff_vs_none" not in rows[0]
