"""launcher.plan.measured: a run directory read as the calibration reads it (its shape from
config.yaml and its checkpoint's vocabulary, what it measured, each collective's calls and
full buffers, its largest writer's bytes), a sweep as its points, and every damaged figure
refused in one line naming the file and the key."""

from __future__ import annotations

import functools
import json

import pytest
from omegaconf import OmegaConf

from launcher.config import compose
from launcher.config.model_shape import param_count
from launcher.plan.measured import FIGURES, engine_label, read_run, read_runs, writes_of

FSDP2 = ["strategy=fsdp2", "trainer.global_batch_size=8", "trainer.micro_batch_size=2"]


@functools.cache
def config_yaml(overrides: tuple[str, ...]) -> str:
    return OmegaConf.to_yaml(compose(list(overrides)))


def run_dir(root, name, overrides, summary, collectives=None, files=None, write_s=0.5):
    """A run directory as the launcher leaves one: config.yaml, env.json, summary.json,
    comm_collectives.json and a sealed checkpoint of `files` (name -> bytes)."""
    run = root / name
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(config_yaml(tuple(overrides)))
    (run / "env.json").write_text(json.dumps({"cpu_count": 2, "devices": []}))
    (run / "summary.json").write_text(json.dumps({"world_size": 2, **summary}))
    if collectives:
        (run / "comm_collectives.json").write_text(json.dumps({"per_kind": collectives}))
    step = run / "checkpoints" / "step_00000010"
    step.mkdir(parents=True)
    files = files or {"model.pt": 1000}
    for name_, size in files.items():
        (step / name_).write_bytes(b"x" * size)
    meta = {"step": 10, "files": files, "model": {"vocab_size": 512}, "write_s": write_s}
    (step / "meta.json").write_text(json.dumps(meta))
    return run


def test_a_ddp_run_is_its_shape_its_compute_and_its_buckets(tmp_path):
    run = run_dir(tmp_path, "ddp", [], {"step_time_s/p50": 0.1, "comm/exposed_s": 0.02,
                  "data_wait_s": 0.01, "comm/allreduce_s": 0.02, "comm/bytes": 8e5,
                  "comm/buckets": 2})  # fmt: skip
    record = read_run(run)
    assert record.shape.vocab.size == 512  # as the run's checkpoint records it
    assert record.shape.params == param_count(compose(["model.vocab_size=512"]).model)
    assert (record.engine, record.world_size, record.per_node, record.cores) == ("ddp", 2, 2, 2)
    assert record.compute_s == pytest.approx(0.07)
    assert record.overlap == 0.0
    (sample,) = record.samples
    assert (sample.op, sample.size, sample.seconds, sample.calls) == ("all_reduce", 4e5, 0.01, 2)
    assert (record.written, record.write_s) == (1000, 0.5)  # DDP: rank 0 writes it all


def test_a_sharded_run_counts_full_buffers_and_its_largest_writer(tmp_path):
    """The collective timer counts an all-gather of S bytes as S/2 (nccl-tests' bus
    bytes); a checkpoint's files are split over the ranks as the engine declares."""
    figures = {"all_gather": {"calls_per_step": 10, "bytes_per_step": 3e6,
                              "inflight_s_per_step": 0.04},
               "broadcast": {"calls_per_step": 1, "bytes_per_step": 8,
                             "inflight_s_per_step": 0.001}}  # fmt: skip
    files = {".metadata": 500, "__0_0.distcp": 4000, "__1_0.distcp": 4500, "rng_rank0.pt": 99}
    run = run_dir(tmp_path, "fsdp2", FSDP2, {"step_time_s/p50": 0.2}, figures, files)
    record = read_run(run)
    (sample,) = record.samples  # broadcasts are not what the plan models
    assert (sample.op, sample.size, sample.seconds) == ("all_gather", 6e5, 0.004)
    writes = writes_of(record.shape, 2)
    assert record.written == round(9000 * max(writes) / sum(writes))
    assert engine_label(compose(["strategy=zero2"])) == "deepspeed zero_stage=2"


def test_a_sweep_is_its_points_and_a_run_without_steps_is_skipped(tmp_path):
    sweep = tmp_path / "sweep"
    run_dir(sweep, "a", [], {"step_time_s/p50": 0.1})
    run_dir(sweep, "b", FSDP2, {"step_time_s/p50": 0.2})
    run_dir(sweep, "c", [], {"status": "failed: crash"})
    assert [r.engine for r in read_runs([sweep])] == ["ddp", "fsdp2"]
    with pytest.raises(ValueError, match="no summary.json there nor in its folders"):
        read_runs([tmp_path / "nowhere"])


SUMMARY_FIGURES = ["world_size", "step_time_s/p50", "comm/exposed_s", "comm/allreduce_s",
                   "data_wait_s", "comm/bytes", "comm/buckets"]  # fmt: skip


@pytest.mark.parametrize("bad", ["fast", float("nan"), 1e308, -1, True])
def test_a_damaged_figure_is_one_line_naming_the_file_and_key(tmp_path, bad):
    assert set(SUMMARY_FIGURES) < set(FIGURES)
    for key in SUMMARY_FIGURES:
        summary = {"step_time_s/p50": 0.1, "comm/buckets": 1, "comm/bytes": 1e5,
                   "comm/allreduce_s": 0.01, key: bad}  # fmt: skip
        run = run_dir(tmp_path, key.replace("/", "-"), [], summary)
        with pytest.raises(ValueError) as refused:
            read_run(run)
        line = str(refused.value)
        assert line.startswith(f"{run / 'summary.json'}: {key}=") and "\n" not in line
        assert "give --from another run" in line


@pytest.mark.parametrize("bad", ["fast", float("nan"), 1e308, -1])
def test_damaged_collectives_and_write_times_are_refused_too(tmp_path, bad):
    figures = {"all_gather": {"calls_per_step": bad, "bytes_per_step": 3e6,
                              "inflight_s_per_step": 0.04}}  # fmt: skip
    run = run_dir(tmp_path, "c", FSDP2, {"step_time_s/p50": 0.2}, figures)
    with pytest.raises(ValueError, match="comm_collectives.json: calls_per_step="):
        read_run(run)
    run = run_dir(tmp_path, "w", [], {"step_time_s/p50": 0.2}, write_s=bad)
    with pytest.raises(ValueError, match="meta.json: write_s="):
        read_run(run)
