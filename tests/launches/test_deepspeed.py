"""strategy=deepspeed on 2 gloo ranks: ZeRO-1/2/3 against DDP, resume, offload, bad configs.

The session's shared `strategy_sweep` (tests/reference_runs.py: DDP, ZeRO-1/2/3 and FSDP2 in
one launch, 20 steps each, the same seed and data) is the reference for most tests; a ZeRO-3
run resumed from the sweep's step-10 checkpoint and a short ZeRO-3 run with optimizer and
parameter offload are compared with it, and the sweep's ZeRO-2/ZeRO-3 checkpoints are
resumed at another world size, stage and engine through DeepSpeed's universal conversion
(and refused, in one line, by ZeRO-3).
No test needs a compiler: the launcher keeps DeepSpeed from building its ops.
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys

import pytest

from launcher.checkpoint.protocol import is_complete as checkpoint_complete

from launch import (
    FAST,
    FAST_USER_LOADER,
    base_env,
    explain,
    losses,
    metrics,
    python_train,
    stop_once_checkpointed,
    summary,
    torchrun,
)
from reference import launch_log
from reference_runs import STRATEGY_STEPS
from run_dir_tools import digest

STEPS = STRATEGY_STEPS


# The sweep's schedule but for lr_decay_steps, which defaults to max_steps (= 20 here too).
RUN = [
    *FAST,
    f"trainer.max_steps={STEPS}",
    "trainer.eval_interval=10",
    "trainer.checkpoint_interval=10",
]


POINTS = ("strategy=ddp", "strategy=zero1", "strategy=zero2", "strategy=zero3")


def test_zero1_and_zero2_match_ddp_losses(strategy_sweep):
    sweep_dir = strategy_sweep
    ddp = losses(sweep_dir / "strategy=ddp")
    assert sorted(ddp) == list(range(1, STEPS + 1))
    for point in ("strategy=zero1", "strategy=zero2"):
        zero = losses(sweep_dir / point)
        assert zero.keys() == ddp.keys()
        for step in ddp:
            assert zero[step] == pytest.approx(ddp[step], rel=1e-4), (point, step)


def test_zero3_trains_and_replicas_agree(strategy_sweep):
    sweep_dir = strategy_sweep
    zero3 = losses(sweep_dir / "strategy=zero3")
    assert sorted(zero3) == list(range(1, STEPS + 1))
    assert zero3[STEPS] < zero3[1] - 0.2  # it learns
    for point in POINTS:
        s = summary(sweep_dir / point)
        assert s["status"] == "completed" and s["steps"] == STEPS, point
        # float64 fingerprints of the parameters (gathered under ZeRO-3) equal on both ranks
        assert s["replicas_in_sync"] is True, point


def test_run_directory_config_and_comm_figures(strategy_sweep, shared_root):
    sweep_dir, log = strategy_sweep, launch_log(shared_root, "strategy_sweep")
    assert log.count("process group created") == 1, log[-4000:]
    assert "FutureWarning" not in log
    for point, stage in zip(POINTS[1:], (1, 2, 3), strict=True):
        run_dir = sweep_dir / point
        used = json.loads((run_dir / "ds_config.json").read_text())
        assert used["zero_optimization"]["stage"] == stage
        assert used["train_batch_size"] == 8 and used["train_micro_batch_size_per_gpu"] == 2
        assert used["gradient_accumulation_steps"] == 2 and used["gradient_clipping"] == 1.0
        assert not used["bf16"]["enabled"] and not used["fp16"]["enabled"]
        kinds = json.loads((run_dir / "comm_collectives.json").read_text())["per_kind"]
        assert kinds["all_reduce"]["calls_per_step"] >= 1  # at least the gradient norm
        if stage == 3:  # parameters gathered for forward and backward, gradients scattered
            assert kinds["all_gather"]["calls_per_step"] > 2
            assert kinds["reduce_scatter"]["calls_per_step"] >= 2  # one per micro-step
        records = [r for r in metrics(run_dir) if "loss" in r]
        for r in records:
            assert 0 < r["comm/exposed_s"] <= r["comm/allreduce_s"]
            assert r["comm/allreduce_s/max"] <= r["step_time_s/max"]
            assert 0 < r["comm/overhead_frac"] < 1 and r["comm/bytes"] > 0
            algbw = r["comm/bytes"] / r["comm/allreduce_s"] / 1e9
            assert r["comm/busbw_gbps"] == pytest.approx(algbw)  # 2(n-1)/n = 1 at n = 2
        assert [r["step"] for r in metrics(run_dir) if "eval/loss" in r] == [10, 20]
    with open(sweep_dir / "sweep_summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    rows = [r for r in rows if r["point"] in POINTS]  # test_fsdp2.py reads the rest
    assert [r["point"] for r in rows] == list(POINTS)
    assert [r["strategy.zero_stage"] for r in rows] == ["", "1", "2", "3"]  # DDP has none
    for r in rows:
        assert float(r["host_peak_gb"]) > 0.05 and r["peak_mem_gb"] == ""  # a CPU
        assert float(r["exposed_s"]) <= float(r["allreduce_s"]) < float(r["step_time_p90_s"])


def test_checkpoints_are_deepspeeds_own_and_atomic(strategy_sweep):
    sweep_dir = strategy_sweep
    ckpts = sweep_dir / "strategy=zero3" / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == "step_00000020"
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_00000010", "step_00000020"]
    step = ckpts / "step_00000020"
    meta = json.loads((step / "meta.json").read_text())
    for rank in (0, 1):  # ZeRO-3: every rank writes its parameter and optimizer shards
        assert f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt" in meta["files"]
        assert f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt" in meta["files"]
    assert {"strategy.json", "zero_to_fp32.py", "rng_rank0.pt"} <= meta["files"].keys()
    for name, size in meta["files"].items():
        assert (step / name).stat().st_size == size


def test_zero3_resume_auto_continues_exactly(strategy_sweep, tmp_path):
    """A ZeRO-3 run cut after step 10, resumed by a new launch: the same losses as the
    uninterrupted sweep point at steps 11-20, to the last bit (fp32 on CPU: the same
    operations on the same numbers, in the same order)."""
    sweep_dir = strategy_sweep
    reference = sweep_dir / "strategy=zero3"
    cut = tmp_path / "cut" / "checkpoints"
    shutil.copytree(reference / "checkpoints" / "step_00000010", cut / "step_00000010")
    (cut / "latest").write_text("step_00000010\n")
    proc = torchrun([*RUN, "strategy=zero3", f"run.root={tmp_path}", "run.id=cut"])
    assert proc.returncode == 0, explain(proc)
    assert "resumed from step 10" in proc.stderr
    resumed, straight = losses(tmp_path / "cut"), losses(reference)
    assert sorted(resumed) == list(range(11, STEPS + 1))
    assert resumed == {step: straight[step] for step in resumed}
    assert summary(tmp_path / "cut")["resumed_from_step"] == 10


def test_sigterm_with_loader_workers_stops_and_resumes_exactly(strategy_sweep, tmp_path):
    """ZeRO-2 with the default DataLoader workers: SIGTERM to the launcher -> every rank
    writes DeepSpeed's checkpoint of one step, exit 143; the relaunch resumes to the
    sweep's ZeRO-2 losses exactly (the data order does not depend on the workers)."""
    sweep_dir = strategy_sweep
    args = [
        *FAST_USER_LOADER,
        f"trainer.max_steps={STEPS}",
        "trainer.eval_interval=10",
        "trainer.checkpoint_interval=10",
        "strategy=zero2",
        f"run.root={tmp_path}",
        "run.id=stopped",
    ]
    output = tmp_path / "out.txt"
    code, out = stop_once_checkpointed(args, tmp_path, 10, output)
    assert code == 143, out
    s = summary(tmp_path / "stopped")
    assert s["status"] == "stopped" and 10 <= s["steps"] < STEPS, out
    again = torchrun(args, runner="launcher.torchrun")
    assert again.returncode == 0, explain(again)
    assert f"resumed from step {s['steps']}" in again.stderr
    assert losses(tmp_path / "stopped") == losses(sweep_dir / "strategy=zero2")


def test_zero3_offload_to_cpu_without_a_compiler(strategy_sweep, tmp_path):
    """Optimizer and parameter offload run torch's AdamW on the CPU copies: no DeepSpeed op
    is built (no compiler on PATH), and the arithmetic is ZeRO-3's."""
    sweep_dir = strategy_sweep
    env = base_env(PATH=f"{tmp_path / 'nocc'}:{base_env()['PATH']}", CC="false", CXX="false")
    (tmp_path / "nocc").mkdir()
    for compiler in ("gcc", "g++", "cc", "c++"):  # any compiler on PATH fails
        (tmp_path / "nocc" / compiler).write_text("#!/bin/sh\nexit 1\n")
        (tmp_path / "nocc" / compiler).chmod(0o755)
    overrides = [*RUN, "strategy=zero3", "trainer.max_steps=6", f"trainer.lr_decay_steps={STEPS}"]
    overrides += ["trainer.eval_interval=0"]
    overrides += ["strategy.offload_optimizer=cpu", "strategy.offload_param=cpu"]
    proc = torchrun([*overrides, f"run.root={tmp_path}", "run.id=off"], env=env)
    assert proc.returncode == 0, explain(proc)
    used = json.loads((tmp_path / "off" / "ds_config.json").read_text())["zero_optimization"]
    assert used["offload_optimizer"]["device"] == used["offload_param"]["device"] == "cpu"
    offloaded, reference = losses(tmp_path / "off"), losses(sweep_dir / "strategy=zero3")
    assert sorted(offloaded) == list(range(1, 7))
    for step in offloaded:
        assert offloaded[step] == pytest.approx(reference[step], rel=1e-4), step
    assert summary(tmp_path / "off")["replicas_in_sync"] is True


def test_bad_config_is_one_line_before_anything_starts(tmp_path):
    proc = python_train(
        [
            *FAST,
            f"run.root={tmp_path}",
            "strategy=zero2",
            "+strategy.extra.train_micro_batch_size_per_gpu=3",
        ]
    )
    assert proc.returncode == 2, explain(proc)
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: strategy.extra."), explain(proc)
    assert "trainer.micro_batch_size" in errors[0]
    assert not any(tmp_path.iterdir())  # no run directory, no process group


def test_a_ddp_run_does_not_import_deepspeed():
    code = """
import sys, torch
from launcher.config import compose, validate
from launcher.model.build import build_model
from launcher.runtime.process import Runtime
from launcher.config.registry import build_strategy
from launcher import train  # every module a DDP run imports
from launcher.train import job
from launcher.train import loop
cfg = compose(["strategy=ddp"])
validate(cfg, 1)
model = build_model(cfg.model, 512, eot_id=0, grad_checkpointing=False)
rt = Runtime(0, 0, 1, torch.device("cpu"), None)
strategy = build_strategy(cfg.strategy, cfg.trainer, rt, model)
assert "deepspeed" not in sys.modules, "deepspeed was imported"
print("ok")
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=base_env()
    )
    assert proc.returncode == 0 and "ok" in proc.stdout, explain(proc)


def written(run_dir) -> dict[str, str]:
    """Every file's hash under `run_dir` but the per-rank logs (each launch appends)."""
    return {k: v for k, v in digest(run_dir).items() if not k.startswith("logs/")}


def test_resume_at_another_world_size_and_stage_through_universal_checkpoints(
    strategy_sweep, tmp_path
):
    """The sweep's ZeRO-2 checkpoint of 2 ranks at step 10: refused by ZeRO-3 (one line that
    says to keep stage 2, at any world size; nothing written); resumed by 1 rank (to 13), whose
    checkpoint ZeRO-1 resumes on 2 ranks (to 16): each time the launcher converts it with
    DeepSpeed's universal checkpoint into checkpoints/universal/ (the original's bytes
    untouched; what an interrupted conversion left is replaced, never loaded), says so and
    logs the world-size change once, and the losses continue the uninterrupted ZeRO-2
    run's within fp32 reduction-order rounding."""
    sweep_dir = strategy_sweep
    straight = losses(sweep_dir / "strategy=zero2")
    cut = tmp_path / "uc" / "checkpoints"
    shutil.copytree(sweep_dir / "strategy=zero2" / "checkpoints" / "step_00000010",
                    cut / "step_00000010")  # fmt: skip
    (cut / "latest").write_text("step_00000010\n")
    args = [*FAST_USER_LOADER, *RUN[len(FAST) :], f"trainer.lr_decay_steps={STEPS}",
            f"run.root={tmp_path}", "run.id=uc"]  # fmt: skip
    # ZeRO-3 cannot load it, whatever the world size (DeepSpeed 0.19.8): one line, exit 2,
    # nothing written, not even a conversion.
    untouched = written(tmp_path / "uc")
    refused = python_train([*args, "strategy=zero3", "trainer.max_steps=13"])
    assert refused.returncode == 2, explain(refused)
    (line,) = [ln for ln in refused.stderr.splitlines() if "ERROR launcher: error: " in ln]
    assert "strategy.zero_stage is 2 there, 3 now" in line
    assert "To resume it, run with strategy.zero_stage=2 (at any world size)" in line
    assert written(tmp_path / "uc") == untouched
    before = {p.name: p.read_bytes() for p in (cut / "step_00000010").iterdir()}
    # What conversions cut short would leave: a temporary folder, and one never sealed.
    for leftover in (".tmp-step_00000010", "step_00000010"):
        (cut / "universal" / leftover / "zero").mkdir(parents=True)
        (cut / "universal" / leftover / "mp_rank_00_model_states.pt").write_bytes(b"half")
    one = python_train([*args, "strategy=zero2", "trainer.max_steps=13"])
    assert one.returncode == 0, explain(one)
    assert {p.name: p.read_bytes() for p in (cut / "step_00000010").iterdir()} == before
    converting = [ln for ln in one.stderr.splitlines() if "converting it with DeepSpeed" in ln]
    assert len(converting) == 1 and "2 rank(s), ZeRO-2, this launch is 1 rank(s)" in converting[0]
    (changed,) = [ln for ln in one.stderr.splitlines() if "world size changed" in ln]
    assert "from 2 to 1 rank(s)" in changed and "accumulation 2 -> 4" in changed
    assert checkpoint_complete(cut / "universal" / "step_00000010")
    assert sorted(p.name for p in (cut / "universal").iterdir()) == ["step_00000010"]
    two = torchrun([*args, "strategy=zero1", "trainer.max_steps=16"])
    assert two.returncode == 0, explain(two)
    assert "1 rank(s), ZeRO-2, this launch is 2 rank(s), ZeRO-1" in two.stderr
    assert "resumed from step 13" in two.stderr and "accumulation 4 -> 2" in two.stderr
    resumed = losses(tmp_path / "uc")
    assert sorted(resumed) == list(range(11, 17))
    for step in resumed:
        assert resumed[step] == pytest.approx(straight[step], rel=2e-5), step
    assert summary(tmp_path / "uc")["replicas_in_sync"] is True


def test_deepspeed_checkpoints_resume_as_fsdp2_and_ddp(strategy_sweep, tmp_path):
    """DeepSpeed -> the other engines, through the universal conversion, optimizer state
    included: the sweep's ZeRO-3 checkpoint of step 10 resumed by FSDP2 on 2 ranks, and its
    ZeRO-2 one by DDP on 1 rank, continue the uninterrupted runs' losses (steps 11-12)."""
    sweep_dir = strategy_sweep
    straight = losses(sweep_dir / "strategy=ddp")  # = ZeRO-1/2/3's, within 1e-4 (above)
    runs = (("zero3", "strategy=fsdp2", torchrun), ("zero2", "strategy=ddp", python_train))
    for point, engine, launch in runs:
        cut = tmp_path / point / "checkpoints"
        shutil.copytree(sweep_dir / f"strategy={point}" / "checkpoints" / "step_00000010",
                        cut / "step_00000010")  # fmt: skip
        (cut / "latest").write_text("step_00000010\n")
        proc = launch([*FAST_USER_LOADER, *RUN[len(FAST) :], "trainer.max_steps=12",
                       f"trainer.lr_decay_steps={STEPS}", engine, f"run.root={tmp_path}",
                       f"run.id={point}"])  # fmt: skip
        assert proc.returncode == 0, explain(proc)
        assert f"this launch is {2 if launch is torchrun else 1} rank(s), {engine[9:]}" in (
            proc.stderr
        )
        assert "resumed from step 10" in proc.stderr
        resumed = losses(tmp_path / point)
        assert sorted(resumed) == [11, 12]
        for step in resumed:
            assert resumed[step] == pytest.approx(straight[step], rel=2e-5), (point, step)
