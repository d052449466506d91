"""The plan's goodput forecast (launcher.plan.goodput, docs/plan.md): the time lost to
checkpoints and to failures, from the MTBF, the measured (or assumed) restart and the write
costs, with `auto` intervals at Young's; what the run measured (summary.json's startup_s)
replaces the assumed restart. benchmarks/goodput.py measures the same figures under faults."""

from __future__ import annotations

import datetime as dt
import importlib.util
import math
import sys

import pytest

from launcher.checkpoint import cadence
from launcher.config import compose
from launcher.plan import forecast, goodput
from launcher.plan.calibrate import Calibration
from launcher.plan.shape import checked, shape_of

from paths import REPO

XL_2x8 = ["model=gpt2-xl", "cluster.nodes=2", "cluster.gpus_per_node=8",
          "trainer.global_batch_size=64"]  # fmt: skip


def plan_of(overrides: list[str], cal: Calibration | None = None, restarts: int = 3) -> dict:
    cfg = compose(overrides)
    target = forecast.target_of(cfg)
    shape = shape_of(checked(cfg, target.world_size), target.world_size)
    return forecast.build(shape, target, cal, restarts=restarts)


def test_the_forecast_is_the_time_left_after_saves_and_failures():
    plan = plan_of([*XL_2x8, "trainer.mtbf_h=2", "trainer.memory_checkpoint_interval=5",
                    "trainer.checkpoint_interval=5000"])  # fmt: skip
    g, step_s = plan["goodput"], plan["step"]["time_s"]
    durable, tier = g["tiers"]["durable"], g["tiers"]["memory"]
    assert durable["every_s"] == pytest.approx(5000 * step_s)
    assert durable["cost_s"] == plan["checkpoint"]["write_s"]
    assert tier["every_s"] == pytest.approx(5 * step_s)
    assert g["mtbf_s"] == 7200.0 and g["restart_s"] == goodput.RESTART_S + goodput.DETECT_S
    lost = durable["cost_s"] / durable["every_s"] + tier["cost_s"] / tier["every_s"]
    lost += (g["restart_s"] + tier["every_s"] / 2) / g["mtbf_s"]  # redo half a memory interval
    # and, where a failure lost the memory tier too (null: every one), the rest of a durable one
    assert g["memory_loss_mtbf_s"] == 7200.0
    lost += (durable["every_s"] - tier["every_s"]) / 2 / g["memory_loss_mtbf_s"]
    assert g["expected"] == pytest.approx(1 - lost)
    assert 0.5 < g["expected"] < 1
    assert plan["totals"]["time_s"] == pytest.approx(
        plan["totals"]["steps"] * step_s + goodput.saves(g, 200) * durable["cost_s"]  # none
    )


def test_auto_intervals_are_youngs_and_lose_less_than_the_default():
    fixed = plan_of([*XL_2x8, "trainer.mtbf_h=2", "trainer.checkpoint_interval=5000"])["goodput"]
    auto = plan_of([*XL_2x8, "trainer.mtbf_h=2", "trainer.checkpoint_interval=auto"])["goodput"]
    durable = auto["tiers"]["durable"]
    assert durable["every_s"] == pytest.approx(math.sqrt(2 * durable["cost_s"] * 7200))
    assert auto["expected"] > fixed["expected"]
    text = "\n".join(goodput.lines(auto))
    assert "durable checkpoints: every" in text and "Young's sqrt(2 x cost x 2 h between" in text


def test_the_durable_interval_follows_the_failures_that_lose_the_memory_tier():
    tiers = [*XL_2x8, "trainer.mtbf_h=2", "trainer.checkpoint_interval=auto",
             "trainer.memory_checkpoint_interval=auto"]  # fmt: skip
    null = plan_of(tiers)["goodput"]
    rare = plan_of([*tiers, "trainer.memory_loss_mtbf_h=200"])["goodput"]
    assert null["memory_loss_mtbf_s"] == 7200.0 and rare["memory_loss_mtbf_s"] == 720000.0
    for g, loss in ((null, 7200.0), (rare, 720000.0)):
        durable, memory = g["tiers"]["durable"], g["tiers"]["memory"]
        assert durable["every_s"] == pytest.approx(cadence.young_s(durable["cost_s"], loss))
        assert memory["every_s"] == pytest.approx(cadence.young_s(memory["cost_s"], 7200.0))
    assert rare["expected"] > null["expected"]
    text = "\n".join(goodput.lines(rare))
    assert "200 h between the failures that lose the memory tier: trainer.memory_loss" in text
    # without the tier every failure falls back to the durable checkpoints
    alone = plan_of(
        [
            *XL_2x8,
            "trainer.mtbf_h=2",
            "trainer.checkpoint_interval=auto",
            "trainer.memory_checkpoint_interval=0",
            "trainer.memory_loss_mtbf_h=200",
        ]
    )
    assert alone["goodput"]["memory_loss_mtbf_s"] == 7200.0


def test_a_measured_start_up_replaces_the_assumed_restart():
    measured = Calibration([], None, None, {}, None, None, [], startup_s=21.5)
    g = plan_of([*XL_2x8, "trainer.checkpoint_interval=auto"], measured, None)["goodput"]
    assert g["restart_s"] == 21.5 + goodput.DETECT_S
    assert g["restart_why"].startswith("measured start-up 21.5 s")


def test_without_a_step_time_only_auto_intervals_are_forecast():
    cpu = ["trainer.mtbf_h=1", "trainer.memory_checkpoint_interval=0"]  # no step time on a CPU
    g = plan_of(cpu)["goodput"]
    assert g["expected"] is None and "no step time" in g["why"]
    auto = plan_of([*cpu, "trainer.checkpoint_interval=auto"])["goodput"]
    assert auto["expected"] is not None and auto["tiers"]["durable"]["steps"] is None
    assert auto["mtbf_s"] == 3600.0
    assert auto["tiers"]["durable"]["every_s"] == pytest.approx(
        cadence.young_s(auto["tiers"]["durable"]["cost_s"], 3600.0)
    )


def goodput_benchmark():
    """benchmarks/goodput.py as a module (registered first: its dataclasses look it up)."""
    name = "goodput_benchmark"
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / "goodput.py")
    module = sys.modules.setdefault(name, importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_counts_the_first_step_after_the_resume_not_the_one_in_flight(tmp_path):
    """benchmarks/goodput.py, a frozen rank: its peers log step 41, in flight at the fault,
    0.1 s after it; the restart resumes from step 40 at 12:00:30 and completes step 41 again
    at 12:00:35. The recovery is the second record of 41 (it once read the first: 0.1 s)."""
    bench = goodput_benchmark()
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank0.log").write_text(
        "2026-12-06 12:00:00,000 [rank 0] INFO launcher: step 40/100\n"
        "2026-12-06 12:00:30,250 [rank 0] INFO launcher: resumed from step 40 (memory tier)\n"
    )
    (logs / "rank1.log").write_text(
        "2026-12-06 12:00:31,000 [rank 1] INFO launcher: resumed from step 39\n"
    )
    fault_at = dt.datetime(2026, 12, 6, 12, 0, 1).timestamp()
    resumed_at, step = bench.resume_line(tmp_path, fault_at)
    assert step == 40 and resumed_at == dt.datetime(2026, 12, 6, 12, 0, 30, 250000).timestamp()
    seen = [
        (fault_at - 0.2, 40),
        (fault_at + 0.1, 41),
        (resumed_at + 4.75, 41),
        (resumed_at + 5, 42),
    ]
    assert bench.first_record(seen, resumed_at, 41) == resumed_at + 4.75
    assert bench.first_record(seen, resumed_at, 43) is None
    assert bench.resume_line(tmp_path, resumed_at + 1) is None  # rank 1's line is not rank 0's
