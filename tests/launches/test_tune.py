"""launcher.tune: tuning rounds inside one torchrun launch, from planted slow starting
points to a measured, confirmed speed-up, and the winner written back as an experiment.

The launches plant big effects (several times the step time) so that the decisions hold on
a busy two-core machine: a data source with a high latency read without workers together
with accumulation far beyond need; tiny DDP buckets; and a single process with nothing to
fix. The pure logic (candidates, the keep/reject rule, tuned.yaml) is tested without
launches.
"""

from __future__ import annotations

import json
import os
import signal

import pytest
from omegaconf import OmegaConf

from launcher.config import compose
from launcher.plan.comm import step_comm
from launcher.plan.presets import LINKS, Topology

from launch import base_env, explain, finish, losses, start, summary, torchrun_cmd, wait_for
from tune_runs import SMALL, report, tune_launch
from wandb_readback import private_wandb_env, records


def test_bad_tune_key_is_one_line_exit_2_before_the_process_group(tmp_path):
    proc = tune_launch([*SMALL, f"run.root={tmp_path}", "tune.loss_tolerance=-1"], nproc=1)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert proc.returncode != 0 and len(errors) == 1, explain(proc)
    assert "tune.loss_tolerance=-1.0: must be 0 or more" in errors[0]
    assert "process group created" not in proc.stderr and not list(tmp_path.iterdir())


@pytest.fixture(scope="module")
def slow_start(tmp_path_factory):
    """Slow storage read without workers, and 4 micro-batches of 1 per rank and step."""
    root = tmp_path_factory.mktemp("tune")
    args = [*SMALL, f"run.root={root}", "run.id=slow", "tune.max_rounds=2"]
    args += ["trainer.global_batch_size=8", "trainer.micro_batch_size=1"]
    args += ["data.num_workers=0", "data.persistent_workers=false"]
    args += ["fault.kind=slow_data", "fault.seconds=0.06"]
    args += ["tune.skip=[strategy.bucket_cap_mb,strategy.comm_hook]"]
    args += ["logger=wandb", "logger.mode=offline"]
    proc = tune_launch(args, env=base_env(**private_wandb_env(root)))
    assert proc.returncode == 0, explain(proc)
    return root / "slow", args, proc


def test_rounds_find_the_planted_changes_and_confirm_the_speedup(slow_start):
    run_dir, _, proc = slow_start
    assert proc.stderr.count("process group created") == 1, explain(proc)
    rep = report(run_dir)
    first = rep["rounds"][0]
    assert {a["kind"] for a in first["evidence"]} >= {"data_wait", "accumulation"}
    assert rep["kept"]["trainer.micro_batch_size"] > 1
    assert rep["kept"]["data.num_workers"] >= 2
    for r in rep["rounds"]:
        inc = r["incumbent"]
        assert inc["step_time_p50_spread_s"] is not None and len(inc["trials"]) == 2
        kept = [c for c in r["candidates"] if c["verdict"] == "kept"]
        assert len(kept) == 1 and kept[0]["name"] == r["kept"]
        assert kept[0]["tokens_per_s"] > inc["tokens_per_s"]  # the figure of merit
    (first_kept,) = [c for c in first["candidates"] if c["verdict"] == "kept"]
    assert rep["rounds"][1]["incumbent_changes"] == first_kept["changes"]
    confirm = rep["confirmation"]
    assert confirm["steps"] == 12 and confirm["speedup"] > 2.0, confirm
    md = (run_dir / "tune" / "report.md").read_text()
    assert f"**{confirm['speedup']:.2f}x the tokens/s**" in md and "| 2 |" in md
    assert (run_dir / "tune" / "tokens_per_s.png").read_bytes()[:4] == b"\x89PNG"
    # Every trial started from the same weights and data: the losses of the first step agree.
    trials = run_dir / "tune" / "trials"
    firsts = {
        round(min(losses(d).items())[1], 4)
        for d in trials.iterdir()
        if (d / "metrics.jsonl").exists()
    }
    assert len(firsts) == 1


def test_tune_report_goes_to_wandb(slow_start):
    run_dir, _, _ = slow_start
    found = [
        p
        for p in (run_dir / "wandb").glob("offline-run-*")
        if any(r.get("run", {}).get("job_type") == "tune_report" for r in records(p, run_dir))
    ]
    assert len(found) == 1
    (hist,) = [r["history"] for r in records(found[0], run_dir) if r["type"] == "history"]
    assert hist["item"]["tune_report._type"] == "table-file"
    assert hist["item"]["tune_plot._type"] == "image-file"
    table = json.loads((found[0] / "files" / hist["item"]["tune_report.path"]).read_text())
    assert [row[0] for row in table["data"]] == [1, 2]


def test_tuned_yaml_reproduces_the_winner_in_a_fresh_launch(slow_start, tmp_path):
    import subprocess

    run_dir, args, _ = slow_start
    base = [a for a in args if not a.startswith(("tune.", "run.", "logger", "fault."))]
    fresh = [f"hydra.searchpath=[file://{run_dir}]", "+tune=tuned", f"run.root={tmp_path}"]
    fresh += ["run.id=fresh", "trainer.max_steps=8", "trainer.log_interval=1"]
    fresh += ["trainer.eval_interval=0", "trainer.checkpoint_interval=0"]
    cmd = torchrun_cmd(fresh, nproc=2)
    proc = subprocess.run(cmd, env=base_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, explain(proc)
    used = OmegaConf.load(tmp_path / "fresh" / "config.yaml")
    winner = OmegaConf.load(run_dir / "tune" / "trials" / "confirm-winner" / "config.yaml")
    for key in [*report(run_dir)["kept"], *(a.split("=")[0] for a in base)]:
        assert OmegaConf.select(used, key) == OmegaConf.select(winner, key), key
    baseline = summary(run_dir / "tune" / "trials" / "confirm-baseline")["step_time_s/p50"]
    assert summary(tmp_path / "fresh")["step_time_s/p50"] < baseline / 2


def test_tiny_buckets_kept_bigger_and_compression_rejected_for_its_loss(tmp_path):
    """18 buckets of gpt2-tiny's 0.3M parameters: 18 all-reduces per step where one does,
    around a small step (one sequence of 32 tokens per rank)."""
    args = [a for a in SMALL if not a.startswith(("trainer.seq_len", "tune.trial_steps"))]
    args += [f"run.root={tmp_path}", "run.id=buckets", "tune.max_rounds=1"]
    args += ["trainer.seq_len=32", "trainer.global_batch_size=2", "trainer.micro_batch_size=1"]
    args += ["strategy.bucket_cap_mb=0.0005", "tune.loss_tolerance=0"]
    # Steps of a few ms: the median of 10 timed steps, not 4, so that one late wake-up on a
    # busy machine does not widen the measured noise past a 2.8x gain (a CI run kept nothing).
    args += ["tune.skip=[data.num_workers]", "tune.trial_steps=13"]
    proc = tune_launch(args)
    assert proc.returncode == 0, explain(proc)
    rep = report(tmp_path / "buckets")
    (r,) = rep["rounds"]
    assert "exposed_comm" in {a["kind"] for a in r["evidence"]}
    sized = [c for c in r["candidates"] if "bucket_cap_mb" in c["name"]]
    assert sized[0]["name"] == "strategy.bucket_cap_mb=25"  # the plan's best: one bucket
    assert all(c["predicted_exposed_s"] for c in sized)
    for cand in sized:  # the plan cuts the buckets as DDP did
        trial = summary(tmp_path / "buckets" / "tune" / "trials" / f"r1-{cand['name']}-1")
        # the vocabulary: SMALL's data.bpe_vocab_size
        cfg = compose([f"{k}={v}" for k, v in cand["changes"].items()] + ["model.vocab_size=512"])
        rows = step_comm(cfg, 2, Topology(1, 2, LINKS["gloo"]))["collectives"]
        assert trial["comm/buckets"] == len(rows)
    # which of the plan's two sizes (one bucket or two, against the incumbent's 18) wins is
    # the timed trials' call, within a few percent of each other here
    (kept,) = rep["kept"].values()
    assert set(rep["kept"]) == {"strategy.bucket_cap_mb"}
    assert kept in {c["changes"]["strategy.bucket_cap_mb"] for c in sized}
    hook = next(c for c in r["candidates"] if c["name"] == "strategy.comm_hook=bf16")
    assert hook["verdict"] == "rejected" and "tune.loss_tolerance=0" in hook["reason"]
    # 18 all-reduces a step down to one or two: measured 1.4-2.9x in the 12-step confirmation
    # on this 2-core machine (1.7-1.9x in the trials); well past the noise of either
    assert rep["confirmation"]["speedup"] > 1.25


def test_nothing_to_fix_ends_after_one_round_saying_so(tmp_path):
    args = [*SMALL, f"run.root={tmp_path}", "run.id=fine"]
    # Steps of 50-100 ms: a worker-fed batch costs 1.5-2 ms to hand over, 2-3% of such a
    # step; at 4 sequences (15 ms steps) it was 9%, over advice.SHARE, so the tuner tried
    # more workers and kept them when noise beat tune.min_gain (a CI run).
    args += ["trainer.global_batch_size=32", "trainer.micro_batch_size=32"]
    proc = tune_launch(args, nproc=1)
    assert proc.returncode == 0, explain(proc)
    rep = report(tmp_path / "fine")
    assert len(rep["rounds"]) == 1 and rep["kept"] == {} and rep["confirmation"] is None
    assert rep["ended_because"].startswith(("nothing to fix", "no candidate beat"))
    assert "No change kept" in (tmp_path / "fine" / "tune" / "report.md").read_text()
    tuned = OmegaConf.load(tmp_path / "fine" / "tune" / "tuned.yaml")
    assert tuned.trainer.micro_batch_size == 32 and "strategy" not in tuned


def test_stop_during_tuning_writes_the_report_so_far_and_exits_143(tmp_path):
    args = [*SMALL, f"run.root={tmp_path}", "run.id=stop", "tune.trial_steps=30"]
    args += ["trainer.global_batch_size=16", "trainer.micro_batch_size=1"]
    # With the default loader workers: every trial starts new ones, and a SIGTERM while one
    # starts must not kill it (launcher.data.loader.stop_signals_held).
    cmd = torchrun_cmd(args, module="launcher.tune", runner="launcher.torchrun")
    output = tmp_path / "out.txt"
    proc = start(cmd, output)
    trials = tmp_path / "stop" / "tune" / "trials"
    wait_for(lambda: (trials / "r1-profile" / "metrics.jsonl").exists(), proc)  # it steps
    os.kill(proc.pid, signal.SIGTERM)
    out = finish(proc, output)
    assert proc.returncode == 143, out
    rep = report(tmp_path / "stop")
    assert rep["stopped"] and rep["ended_because"] == "stopped on request" and not rep["kept"]
    assert rep["confirmation"] is None and len(rep["rounds"]) == 1
    assert summary(trials / "r1-profile")["status"] == "stopped"  # at a step boundary
