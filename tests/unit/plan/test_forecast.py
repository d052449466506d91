"""launcher.plan's arithmetic, in process (docs/plan.md): the gpt2-xl check, each structural
figure by its formula (FSDP2's and DDP's checkpoint bytes, the per-writer write time,
compile's activations, a resumed run's steps left, the presets against their sources), and
`python -m launcher.plan`: the job's config check, its own flags' ranges, where it writes."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from launcher.checkpoint.memory import state_bytes
from launcher.config import compose
from launcher.config.model_shape import param_count, param_sizes, shape_flops_per_token
from launcher.config.saved_bytes import DCP_CHUNK_BYTES, DCP_KEY_BYTES, ENTRY_BYTES, RECORD_BYTES
from launcher.plan import forecast, memory
from launcher.plan.__main__ import main as plan_main
from launcher.plan.calibrate import Calibration, ComputeFit, features_of
from launcher.plan.presets import DEVICES
from launcher.plan.shape import checked, shape_of
from launcher.strategy.fsdp2 import PARAM_GROUP_ITEMS

# GPT-2's vocabulary, stated: the plan reads the data's otherwise (the default run's BPE).
GPT2_DATA = ["data=synthetic", "data.vocab_size=50257"]
XL_8x8 = ["model=gpt2-xl", "cluster.nodes=8", "cluster.gpus_per_node=8",
          "trainer.global_batch_size=512", *GPT2_DATA]  # fmt: skip


def plan_of(overrides: list[str], cal=None, start_step: int = 0) -> dict:
    cfg = compose(overrides)
    target = forecast.target_of(cfg)
    cfg = checked(cfg, target.world_size)
    return forecast.build(shape_of(cfg, target.world_size), target, cal, start_step=start_step)


def test_gpt2_xl_on_8_nodes_of_8_gpus():
    """DDP's state per rank: 1.558e9 parameters x (12 bytes of weights and AdamW moments +
    4 of gradients); FSDP2's and ZeRO-3's at 64 ranks a 64th of it."""
    plan = plan_of(XL_8x8)
    params = plan["job"]["parameters"]
    assert params == pytest.approx(1.558e9, rel=0.01)
    by = plan["memory"]["by_engine"]
    assert by["ddp"]["state_bytes"] == params * 16
    assert by["fsdp2"]["state_bytes"] == -(-params // 64) * 16
    assert by["zero3"]["state_bytes"] == -(-params // 64) * 16
    assert plan["memory"]["fits"] is True  # 29 GiB of an H100's 80 GB
    tensors = len(param_sizes(compose(XL_8x8).model))
    assert plan["checkpoint"]["bytes_per_rank"] == params * 12 + 4 * tensors + (
        4 * tensors + 1) * ENTRY_BYTES  # fmt: skip
    assert plan["step"]["time_s"] > plan["step"]["compute_s"] > 0
    assert plan["totals"]["gpu_hours"] == pytest.approx(plan["totals"]["time_s"] * 64 / 3600)


def test_the_vocabulary_is_the_runs():
    """The default run trains a BPE of data.bpe_vocab_size ids, not GPT-2's 50,257: the
    parameters (so the checkpoint and the tier) are counted with it."""
    bpe = plan_of(["model=gpt2", "data.tokenizer=bpe", "data.bpe_vocab_size=512"])
    cfg = compose(["model=gpt2", "model.vocab_size=512"])
    assert bpe["job"]["parameters"] == param_count(cfg.model) == 86_235_648  # not 124.4M
    assert bpe["job"]["vocabulary"] == 512 and bpe["basis"]["vocabulary"]["measured"]
    hub = plan_of(["model=gpt2", "data.tokenizer=someone/tokenizer"])
    assert hub["job"]["vocabulary"] == 50257
    assert not hub["basis"]["vocabulary"]["measured"]
    assert "assumed" in hub["basis"]["vocabulary"]["why"]


def test_fsdp2_writes_its_shards_as_dcp_records_the_tied_embedding_under_both_names():
    """Each rank: its shard of 4(P + E) + 8P bytes (the model's state dict names the LM head
    too; the optimizer keys the parameter once), a DCP record for each of its 3T + 1
    items; the last rank the T step counts and the parameter groups' settings; rank 0 the
    .metadata, an entry per stored chunk."""
    cfg = compose(["strategy=fsdp2", "model.vocab_size=512"])
    p, t = param_count(cfg.model), len(param_sizes(cfg.model))
    e = 512 * 64  # the token embedding, tied
    for world in (1, 2, 4, 1024):
        writes = forecast.checkpoint_bytes(cfg, world, shape_of(cfg, world))
        shard = -(-(4 * (p + e) + 8 * p) // world) + (3 * t + 1) * RECORD_BYTES
        keys, chunks = 4 * t + 1 + PARAM_GROUP_ITEMS, world * (3 * t + 1) + t + PARAM_GROUP_ITEMS
        metadata = keys * DCP_KEY_BYTES + chunks * DCP_CHUNK_BYTES
        last = t * (4 + RECORD_BYTES) + PARAM_GROUP_ITEMS * RECORD_BYTES
        assert writes["total"] == world * shard + metadata + last
        assert writes["writers"] == world
    # the memory tier's snapshot keeps the tied weight once (host_copy), one torch.save
    assert state_bytes(cfg, 4) == -(-p * 12 // 4) + 4 * t * ENTRY_BYTES


def test_a_checkpoint_takes_as_long_as_its_largest_writer():
    """write_s = the largest rank's bytes / the per-writer rate: DDP's rank 0 writes it all,
    FSDP2's 1,024 ranks a 1,024th each at once (rank 0 DCP's .metadata too, which grows
    with the ranks: 0.33 GB of it at 1,024)."""
    rate = ["cluster.slurm.checkpoint_write_mb_s=100"]
    ddp = plan_of([*XL_8x8, *rate])
    fsdp = plan_of(
        [*XL_8x8, *rate, "strategy=fsdp2", "cluster.nodes=128", "trainer.global_batch_size=4096"]
    )
    assert ddp["checkpoint"]["writers"] == 1
    assert ddp["checkpoint"]["write_s"] == ddp["checkpoint"]["bytes_per_rank"] / 100e6
    assert fsdp["checkpoint"]["writers"] == 1024
    assert fsdp["checkpoint"]["write_s"] == fsdp["checkpoint"]["bytes_per_rank"] / 100e6
    assert fsdp["checkpoint"]["write_s"] < ddp["checkpoint"]["write_s"] / 40


@pytest.mark.parametrize(("precision", "compiled", "per_layer", "per_logit"), [
    ("bf16", "off", 34, 12), ("fp32", "off", 68, 8), ("bf16", "default", 24, 4),
    ("fp32", "default", 48, 8),
])  # fmt: skip
def test_activations_per_layer_and_logits(precision, compiled, per_layer, per_logit):
    """Bytes per token: each layer per_layer x width, the logits per_logit x the padded
    vocabulary (eager: the logits, their fp32 copy and both gradients; compiled with the
    loss inside the compiled region: the logits and their gradient)."""
    cfg = compose(["model=gpt2", "model.vocab_size=50257", "trainer.seq_len=1024",
                   f"trainer.precision={precision}", f"trainer.compile={compiled}"])  # fmt: skip
    tokens = 1024 * 8
    want = tokens * (12 * per_layer * 768 + per_logit * 50304)
    assert memory.activation_bytes(cfg, 8) == want


def test_the_h200_run_and_llm_c_350m_on_an_a100():
    """The project's H200 run (gpt2, bf16, compiled, micro-batch 64): 30.6 GB peak, against
    the plan's state + activations; llm.c's 350M at micro-batch 64 fits an 80 GB A100 when
    compiled, not eager."""
    h200 = ["model=gpt2", *GPT2_DATA, "trainer.seq_len=1024", "trainer.precision=bf16",
            "cluster.gpus_per_node=1", "cluster.gpu_type=H200", "trainer.global_batch_size=64",
            "trainer.micro_batch_size=64", "trainer.compile=default"]  # fmt: skip
    used = plan_of(h200)["memory"]["gpu_per_rank"]
    allocated = sum(used[k] for k in ("weights", "grads", "optimizer", "activations"))
    assert 30.59e9 / allocated == pytest.approx(1.0, abs=0.05)
    medium = ["model=gpt2-medium", *GPT2_DATA, "trainer.seq_len=1024", "trainer.precision=bf16",
              "cluster.gpus_per_node=8", "cluster.gpu_type=A100", "trainer.global_batch_size=512",
              "trainer.micro_batch_size=64"]  # fmt: skip
    assert plan_of([*medium, "trainer.compile=default"])["memory"]["fits"] is True
    assert plan_of([*medium, "trainer.compile=off"])["memory"]["fits"] is False


@pytest.mark.parametrize(("device", "step_s", "tokens_per_s"), [
    ("H100", 0.140, 524288 / 0.140), ("A100", 0.300, 524288 / 0.300), ("H200", None, 528741.29),
])  # fmt: skip
def test_each_device_preset_is_its_sources_figure_by_the_plans_formula(device, step_s,
                                                                       tokens_per_s):  # fmt: skip
    """MFU = tokens/s a GPU x FLOPs a token (nanoGPT's, gpt2 at 1024) / the peak: llm.c's
    140 ms (8xH100) and 300 ms (8xA100) a 524,288-token step, the H200 run's 528.7K tok/s."""
    cfg = compose(["model=gpt2", "model.vocab_size=50257"])
    per_gpu = tokens_per_s / (1 if step_s is None else 8)
    mfu = per_gpu * shape_flops_per_token(cfg.model, 1024) / DEVICES[device].peak_flops
    assert DEVICES[device].mfu == pytest.approx(mfu, abs=0.0005)
    assert f"{mfu:.1%}" in DEVICES[device].source


def test_a_resumed_run_is_planned_over_the_steps_left():
    """From step 120 of 200: 80 steps and the checkpoints at 200 (every 100: one left)."""
    whole, resumed = plan_of(XL_8x8), plan_of(XL_8x8, start_step=120)
    assert resumed["totals"]["steps"] == 80 and resumed["totals"]["start_step"] == 120
    step, write = whole["step"]["time_s"], whole["checkpoint"]["write_s"]
    assert whole["totals"]["time_s"] == pytest.approx(200 * step + 2 * write)
    assert resumed["totals"]["time_s"] == pytest.approx(80 * step + 1 * write)


def test_grad_checkpointing_trades_activations_for_compute():
    plain = plan_of(XL_8x8)
    saved = plan_of([*XL_8x8, "trainer.grad_checkpointing=true"])
    acts = plain["memory"]["gpu_per_rank"]
    assert saved["memory"]["gpu_per_rank"]["activations"] < acts["activations"]
    assert (acts["activations_if_grad_checkpointing_flipped"]
            == saved["memory"]["gpu_per_rank"]["activations"])  # fmt: skip
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
    assert "give --from a measured run" in plan["basis"]["step.compute_s"]["why"]


def test_cost_follows_the_gpu_hour_price():
    plan = plan_of([*XL_8x8, "cluster.gpu_hour_cost=2.5", "cluster.gpu_type=H200"])
    assert plan["totals"]["cost"] == pytest.approx(plan["totals"]["gpu_hours"] * 2.5)
    assert plan["basis"]["device"] == {"measured": False, "why": "cluster.gpu_type=H200"}


def test_auto_micro_batch_plans_at_the_per_rank_batch(tmp_path, capsys):
    """BatchPlan's rule (the search's upper bound, what preflight sizes), and the run-start
    forecast is made, not dropped; an engine the job refuses auto for is refused here in
    the job's own line."""
    args = [*XL_8x8, "trainer.micro_batch_size=auto"]
    assert plan_main([*args, f"run.root={tmp_path}", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert (plan["job"]["micro_batch"], plan["job"]["accum"]) == (8, 1)
    cfg = checked(compose(args), 64)
    made = forecast.at_start(cfg, 64, 8, "NVIDIA H100 80GB HBM3", 50257, tmp_path / "run")
    assert made["step_time_s"] == pytest.approx(plan["step"]["time_s"])
    assert plan_main([*args, "strategy=fsdp2", f"run.root={tmp_path}"]) == 2
    assert capsys.readouterr().err.startswith(
        "error: trainer.micro_batch_size=auto is not supported with strategy=fsdp2"
    )


def test_the_plan_says_which_sequence_length_it_used_first(tmp_path, capsys):
    assert plan_main([*XL_8x8, f"run.root={tmp_path}"]) == 0
    first = capsys.readouterr().out.splitlines()[:2]
    assert "global batch 512 x 128 tokens" in first[0]
    assert first[1] == ("  note: sequence 128 tokens (trainer.seq_len=128); gpt2-xl's context "
                        "is 1024: trainer.seq_len=1024 plans (and trains) at it")  # fmt: skip


def test_plans_go_to_one_plans_folder_or_where_asked(tmp_path, capsys):
    """No run directory is made: <run.root>/plans/<run.id>.json, or --out's path (a run
    directory: its plan/)."""
    assert plan_main([*XL_8x8, f"run.root={tmp_path}", "run.id=xl"]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["plans"]
    plan = json.loads((tmp_path / "plans" / "xl.json").read_text())
    for section, key in [("memory", "gpu_per_rank_bytes"), ("memory", "shm_per_node_bytes"),
                         ("checkpoint", "bytes_per_rank"), ("step", "time_s"),
                         ("step", "tokens_per_s"), ("step", "comm_s"), ("totals", "time_s"),
                         ("totals", "gpu_hours")]:  # fmt: skip
        assert plan[section][key] is not None, (section, key)
    out = capsys.readouterr().out
    assert "| ddp |" in out and "basis (measured or assumed):" in out
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("{}")
    assert plan_main([*XL_8x8, "--out", str(run)]) == 0
    assert (run / "plan" / "plan.json").is_file()
    assert plan_main([*XL_8x8, "--out", str(tmp_path / "xl.json")]) == 0
    assert (tmp_path / "xl.json").is_file()


def summary_with(tmp_path, step):
    """A run directory whose summary.json holds `step` as its median step time."""
    run = tmp_path / "bad"
    run.mkdir(exist_ok=True)
    (run / "config.yaml").write_text(json.dumps({}))
    (run / "summary.json").write_text(f'{{"world_size": 2, "step_time_s/p50": {step}}}')
    return str(run)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["cluster.nodes=0"], "cluster.nodes=0"),
        (["cluster.nodes=-2"], "cluster.nodes=-2"),
        (["cluster.gpus_per_node=-1"], "cluster.gpus_per_node=-1"),
        (["trainer.micro_batch_size=0"], "trainer.micro_batch_size=0"),
        (["trainer.global_batch_size=-16"], "trainer.global_batch_size=-16"),
        (["trainer.seq_len=-1"], "trainer.seq_len=-1"),
        (["trainer.max_steps=-3"], "trainer.max_steps=-3"),
        (["model.n_layer=-1"], "model.n_layer=-1"),
        (["trainer.global_batch_size=10"], "trainer.global_batch_size=10 is not divisible"),
        (["cluster.gpus_per_node=8", "cluster.gpu_type=V100"], "cluster.gpu_type=V100: the plan"),
        (["--overlap", "2"], "--overlap 2: give the fraction"),
        (["--overlap", "-0.5"], "--overlap -0.5: give"),
        (["--mfu", "5"], "--mfu 5: give a fraction of the peak"),
        (["--mfu", "0"], "--mfu 0: give"),
        (["--busbw-gbps", "nan"], "--busbw-gbps nan: give"),
        (["--busbw-gbps", "1e308"], "--busbw-gbps 1e308: give"),
        (["--from"], "--from needs a run directory"),
        (["--from", "/nonexistent/run"], "/nonexistent/run: no summary.json there"),
    ],
)
def test_bad_input_is_one_line(tmp_path, capsys, args, line):
    assert plan_main([f"run.root={tmp_path}", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and line in err and "\n" not in err, err
    assert not (tmp_path / "plans").exists()


@pytest.mark.parametrize("step", ['"fast"', "NaN", "1e308", "-1", "true"])
def test_a_damaged_summary_is_one_line(tmp_path, capsys, step):
    assert plan_main([f"run.root={tmp_path}", "--from", summary_with(tmp_path, step)]) == 2
    err = capsys.readouterr().err.strip()
    assert "summary.json: step_time_s/p50=" in err and "\n" not in err, err
    assert "is not seconds a step (within (0, 86400])" in err


def test_ranks_that_outnumber_the_cores_compute_and_communicate_on_their_share():
    """4 ranks on a 2-core node: each computes on half a core and its collectives' steps
    wait for both ends, so both take twice what the fitted model gives a rank a core."""
    cfg = checked(compose(["cluster.procs_per_node=4", "model.vocab_size=512"]), 4)
    shape, target = shape_of(cfg, 4), forecast.target_of(cfg)
    fit = ComputeFit({"rate:fp32": 1e9, "step:ddp": 2e-3}, [features_of(shape, 4)], ["r"])
    cal = Calibration([], fit, None, {}, None, None, [])
    own = forecast.build(shape, replace(target, cores=4), cal, engines=False)["step"]
    shared = forecast.build(shape, replace(target, cores=2), cal, engines=False)["step"]
    assert own["compute_s"] == pytest.approx(shape.flops_per_rank_step / 1e9 + 2e-3)
    assert shared["compute_s"] == pytest.approx(2 * own["compute_s"])
    assert shared["comm_s"] == pytest.approx(2 * own["comm_s"]) and own["comm_s"] > 0
