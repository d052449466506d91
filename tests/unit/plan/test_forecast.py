"""launcher.plan's arithmetic, in process (docs/plan.md): the issue's gpt2-xl check, the
alpha-beta collectives, each engine's declared state and collectives, the stop budget,
and `python -m launcher.plan` writing plan.json with its contract keys."""

from __future__ import annotations

import json

import pytest

from launcher.config import compose
from launcher.config.model_shape import param_count, param_sizes
from launcher.plan import comm, forecast, memory
from launcher.plan.__main__ import main as plan_main
from launcher.plan.presets import LINKS, Link

XL_8x8 = ["model=gpt2-xl", "cluster.nodes=8", "cluster.gpus_per_node=8",
          "trainer.global_batch_size=512"]  # fmt: skip


def plan_of(overrides: list[str], measured=None) -> dict:
    cfg = compose(overrides)
    return forecast.build(cfg, forecast.target_of(cfg), measured)


def test_gpt2_xl_on_8_nodes_of_8_gpus():
    """DDP's state per rank: 1.558e9 parameters x (12 bytes of weights and AdamW moments +
    4 of gradients); FSDP2's at 64 ranks a 64th of it (and the tied embedding's second
    name, 0.3%)."""
    plan = plan_of(XL_8x8)
    params = plan["job"]["parameters"]
    assert params == pytest.approx(1.558e9, rel=0.01)
    by = plan["memory"]["by_engine"]
    assert by["ddp"]["state_bytes"] == pytest.approx(params * 16, rel=0.05)
    assert by["fsdp2"]["state_bytes"] == pytest.approx(params * 16 / 64, rel=0.05)
    assert by["zero3"]["state_bytes"] == pytest.approx(params * 16 / 64, rel=0.05)
    assert plan["memory"]["gpu_per_rank_bytes"] == plan["memory"]["gpu_per_rank"]["total"]
    assert plan["memory"]["fits"] is True  # 29 GiB of an H100's 80 GB
    assert plan["checkpoint"]["bytes_per_rank"] == params * 12
    assert plan["step"]["time_s"] > plan["step"]["compute_s"] > 0
    assert plan["totals"]["gpu_hours"] == pytest.approx(plan["totals"]["time_s"] * 64 / 3600)


@pytest.mark.parametrize(
    ("op", "ranks", "want"),
    [
        # ring: 2(n-1) alphas + 2(n-1)/n x B / busbw; tree: 2 log2(n) alphas, same bytes
        ("all_reduce", 8, min(14 * 1e-5, 6 * 1e-5) + 2 * 7 / 8 * 1e9 / 100e9),
        ("reduce_scatter", 8, 7 * 1e-5 + 7 / 8 * 1e9 / 100e9),
        ("all_gather", 2, 1e-5 + 1 / 2 * 1e9 / 100e9),
        ("all_reduce", 1, 0.0),
    ],
)
def test_collectives_follow_the_alpha_beta_model(op, ranks, want):
    link = Link("test", 100e9, 1e-5, "a test link")
    assert comm.collective_s(op, 10**9, ranks, link) == pytest.approx(want)


def test_ddp_all_reduces_a_bucket_at_a_time():
    cfg = compose(["model=gpt2", "strategy.bucket_cap_mb=25"])
    params = param_count(cfg.model)
    rows = comm.step_comm(cfg, 8, LINKS["nvlink"])["collectives"]
    assert sum(r["bytes"] * r["times"] for r in rows) == params * 4
    cap, largest = 25 * 2**20, max(param_sizes(cfg.model)) * 4
    assert all(r["op"] == "all_reduce" and r["times"] == 1 for r in rows)
    assert all(cap <= r["bytes"] < cap + largest for r in rows[:-1])  # whole tensors
    half = comm.step_comm(compose(["model=gpt2", "strategy.comm_hook=bf16"]), 8, LINKS["nvlink"])
    assert half["bytes"] == params * 2
    bigger = compose(["model=gpt2", "strategy.bucket_cap_mb=100"])
    fewer = comm.step_comm(bigger, 64, LINKS["infiniband"])
    many = comm.step_comm(cfg, 64, LINKS["infiniband"])
    assert fewer["time_s"] < many["time_s"]  # fewer latencies for the same bytes


@pytest.mark.parametrize(
    ("strategy", "ops"),
    [
        ("fsdp2", {"all_gather", "reduce_scatter"}),
        ("zero2", {"all_gather", "reduce_scatter"}),
        ("zero3", {"all_gather", "reduce_scatter"}),
        ("ddp", {"all_reduce"}),
    ],
)
def test_every_engine_declares_its_collectives_and_state(strategy, ops):
    cfg = compose([f"strategy={strategy}", "model=gpt2"])
    assert {r["op"] for r in comm.step_comm(cfg, 8, LINKS["nvlink"])["collectives"]} == ops
    one, eight = memory.train_state(cfg, 1), memory.train_state(cfg, 8)
    assert sum(eight.values()) <= sum(one.values())


def test_grad_checkpointing_trades_activations_for_compute():
    plain = plan_of(XL_8x8)
    saved = plan_of([*XL_8x8, "trainer.grad_checkpointing=true"])
    acts = plain["memory"]["gpu_per_rank"]
    assert saved["memory"]["gpu_per_rank"]["activations"] < acts["activations"]
    assert (
        acts["activations_if_grad_checkpointing_flipped"]
        == (saved["memory"]["gpu_per_rank"]["activations"])
    )
    assert saved["step"]["compute_s"] == pytest.approx(plain["step"]["compute_s"] * 4 / 3)


def test_the_stop_budget_is_the_write_a_step_and_the_backends_margin():
    plan = plan_of([*XL_8x8, "cluster.slurm.checkpoint_write_mb_s=50"])
    stop = plan["checkpoint"]["stop"]
    write, step = plan["checkpoint"]["write_s"], plan["step"]["time_s"]
    assert write == pytest.approx(1.558e9 * 12 / 50e6, rel=0.01)
    slurm, k8s = stop["by_backend"]["slurm"], stop["by_backend"]["k8s"]
    assert slurm["need_s"] == pytest.approx(write + step)
    assert k8s["need_s"] == pytest.approx(write + step + 10)  # torchrun's own end in a pod
    assert (k8s["key"], k8s["window_s"], k8s["fits"]) == ("cluster.k8s.termination_grace_s",
                                                          120, False)  # fmt: skip


def test_a_cpu_plan_without_a_measured_run_says_why_it_has_no_time():
    plan = plan_of([])
    assert plan["step"]["time_s"] is None and plan["totals"]["time_s"] is None
    assert not plan["basis"]["step.compute_s"]["measured"]
    assert "give --from a measured run" in plan["basis"]["step.compute_s"]["why"]


def test_a_measured_run_replaces_the_assumptions():
    measured = forecast.Measured("runs/x", 8, flops_per_s=300e12, overlap=0.9,
                                 busbw=200e9, data_wait_s=0.001)  # fmt: skip
    plan = plan_of([*XL_8x8, "cluster.nodes=1"], measured)
    assert plan["step"]["overlap"] == 0.9
    assert plan["step"]["compute_s"] == pytest.approx(512 * 128 / 8 * plan["job"][
        "flops_per_token"] / 300e12)  # fmt: skip
    assert all(plan["basis"][k]["measured"] for k in ("step.compute_s", "step.overlap", "link"))


def test_cost_follows_the_gpu_hour_price():
    plan = plan_of([*XL_8x8, "cluster.gpu_hour_cost=2.5", "cluster.gpu_type=H200"])
    assert plan["totals"]["cost"] == pytest.approx(plan["totals"]["gpu_hours"] * 2.5)
    assert plan["basis"]["device"] == {"measured": False, "why": "cluster.gpu_type=H200"}
    assert plan["job"]["device"] == "H200"


def test_the_command_writes_plan_json_with_its_contract_keys(tmp_path, capsys):
    assert plan_main([*XL_8x8, f"run.root={tmp_path}", "run.id=p"]) == 0
    plan = json.loads((tmp_path / "p" / "plan" / "plan.json").read_text())
    for section, key in [("memory", "gpu_per_rank_bytes"), ("memory", "shm_per_node_bytes"),
                         ("checkpoint", "bytes_per_rank"), ("step", "time_s"),
                         ("step", "tokens_per_s"), ("step", "comm_s"), ("totals", "time_s"),
                         ("totals", "gpu_hours")]:  # fmt: skip
        assert plan[section][key] is not None, (section, key)
    out = capsys.readouterr().out
    assert "| ddp |" in out and "basis (measured or assumed):" in out


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["cluster.gpus_per_node=8", "cluster.gpu_type=V100"], "cluster.gpu_type=V100: the plan"),
        (["--from"], "--from needs a run directory"),
        (["--from", "/nonexistent/run"], "/nonexistent/run/summary.json: cannot be read"),
    ],
)
def test_bad_input_is_one_line(tmp_path, capsys, args, line):
    assert plan_main([f"run.root={tmp_path}", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and line in err and "\n" not in err
