"""The plan held against what runs wrote (launcher.plan, docs/plan.md), all read from the
strategy sweep (DDP, ZeRO-1/2/3, FSDP2 with and without resharding, 2 ranks): the
vocabulary and checkpoint bytes it predicts from each run's config alone, the collectives
each engine declares against those the runs timed, the per-writer write time, and a sweep
given to `--from`. The step-time checks at other shapes are benchmarks/plan_check.py's
(ratios, on a noisy machine)."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from launcher.checkpoint.protocol import read_meta
from launcher.config.registry import engine
from launcher.plan import forecast
from launcher.plan.__main__ import main as plan_main
from launcher.plan.measured import read_run
from launcher.plan.shape import shape_of

from reference_runs import STRATEGY_POINTS


def point(sweep, name):
    run = sweep / f"strategy={name}"
    return (
        run,
        OmegaConf.load(run / "config.yaml"),
        read_meta(run / "checkpoints" / "step_00000020"),
    )


@pytest.mark.parametrize("name", STRATEGY_POINTS)
def test_the_vocabulary_and_checkpoint_bytes_are_the_plans(strategy_sweep, name):
    """From the run's config alone (the data's tokenizer, as the plan finds it before a
    run): its vocabulary, and its checkpoint's files within 3% (FSDP2's DCP records, the
    tied embedding under both names, its .metadata; DeepSpeed's copied scripts aside)."""
    run, cfg, meta = point(strategy_sweep, name)
    shape = shape_of(cfg, meta["world_size"])
    assert shape.vocab.size == meta["model"]["vocab_size"]
    files = {f: n for f, n in meta["files"].items() if not f.startswith("rng_")}
    written = sum(files.values())
    predicted = forecast.checkpoint_bytes(shape.cfg, meta["world_size"], shape)["total"]
    assert written == pytest.approx(predicted, rel=0.03), files


@pytest.mark.parametrize("name", ["fsdp2", "fsdp2_noreshard", "zero1", "zero2", "zero3"])
def test_each_engine_communicates_what_it_declares(strategy_sweep, name):
    """comm_collectives.json (the collective timer: calls a step, all-reduce-equivalent
    bytes, an all-gather or reduce-scatter of S counted S/2) against the engine's
    `step_collectives`: FSDP2's per-unit gathers and reductions call for call and byte for
    byte; ZeRO's gradient reductions and weight gathers byte for byte (besides a few bytes
    of scalars). ZeRO-3's gathers are DeepSpeed's per module, with the small parameters
    kept whole (stage3_param_persistence_threshold): not the plan's per-unit figure at this
    toy width, so only its reductions are held here."""
    run, cfg, meta = point(strategy_sweep, name)
    record = read_run(run)
    declared = engine(cfg.strategy.name).plan.step_collectives(
        record.shape.cfg, record.shape.params, record.world_size
    )
    timed = json.loads((run / "comm_collectives.json").read_text())["per_kind"]
    for op in {op for op, _, _ in declared}:
        if op == "all_gather" and name == "zero3":
            continue
        calls = sum(times for o, _, times in declared if o == op)
        full = sum(size * times for o, size, times in declared if o == op)
        counted = timed[op]["bytes_per_step"] * (1 if op == "all_reduce" else 2)
        assert counted == pytest.approx(full, abs=64), op
        if name.startswith("fsdp2") or op == "reduce_scatter":
            assert timed[op]["calls_per_step"] == calls, op


@pytest.mark.parametrize("name", ["ddp", "fsdp2", "zero3"])
def test_a_checkpoint_write_is_its_largest_writers(strategy_sweep, name):
    """The per-writer rate a run measured (its largest writer's declared share of the files
    over the write's time) gives back that run's write time; its plan at 1,024 ranks has
    each writer's share of the same state (DDP: rank 0's all of it)."""
    run, cfg, meta = point(strategy_sweep, name)
    record = read_run(run)
    cfg.cluster.procs_per_node = meta["world_size"]  # the launch's, not the config's
    target = forecast.target_of(cfg)
    plan = forecast.build(record.shape, target, forecast.calibration([run], target))
    # (within what the declaration leaves out: ZeRO-3's per-rank model-state file, 0.3%)
    assert plan["checkpoint"]["write_s"] == pytest.approx(meta["write_s"], rel=0.01)
    wide = forecast.checkpoint_bytes(record.shape.cfg, 1024, record.shape)
    assert wide["writers"] == (1 if name == "ddp" else 1024)


def test_a_sweep_calibrates_the_plan(strategy_sweep, tmp_path, capsys):
    """`--from` a sweep's folder: every point's run is fitted, each named in the basis."""
    args = ["--from", str(strategy_sweep), "--json", f"run.root={tmp_path}",
            "trainer.global_batch_size=8", "trainer.micro_batch_size=2", "trainer.seq_len=64",
            "cluster.procs_per_node=2", "data.max_bytes=400000",
            "data.bpe_vocab_size=512"]  # fmt: skip
    assert plan_main(args) == 0
    plan = json.loads(capsys.readouterr().out)
    compute = plan["basis"]["step.compute_s"]
    assert compute["measured"] and all(f"strategy={n}" in compute["why"] for n in STRATEGY_POINTS)
    assert plan["step"]["time_s"] > 0 and plan["basis"]["link"]["measured"]


def test_every_run_keeps_its_forecast_beside_what_it_measured(strategy_sweep):
    """On the CPU there is no peak to forecast from: the forecast says so (a resumed run
    holds the figures: tests/launches/test_resume_launch.py; one on a GPU: tests/unit/plan)."""
    summary = json.loads((strategy_sweep / "strategy=ddp" / "summary.json").read_text())
    assert summary["forecast"]["step_time_s"] is None
    assert "no known peak FLOP/s on the CPU" in summary["forecast"]["basis"]
    assert summary["step_time_s/p50"] > 0  # the measured figure beside it
