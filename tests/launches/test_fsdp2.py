"""strategy=fsdp2 on 2 gloo ranks, and resume at another world size.

One `+exp=strategy_sweep` launch (DDP, ZeRO-1/2/3, FSDP2 with and without resharding after
forward; 20 steps each, the same seed and data, checkpoints at 10 and 20) is the reference:
FSDP2 against DDP's losses, its comm figures and DCP checkpoints, the sweep table. Then a
few launches that resume the sweep's step-10 checkpoints: FSDP2 at the same world size
(bit-exact), DDP 2 -> 1 rank then into FSDP2 on 2, FSDP2 into DDP on 1 rank; FSDP2 under
torchrun's elastic membership, the sweep's 2 ranks -> 1 -> 2; an asynchronous checkpoint
cut by SIGTERM; and one 4-rank launch with strategy.reshard_after_forward=2. Resume
launches use the default DataLoader. The sweep is the session's shared `strategy_sweep` reference
(tests/reference_runs.py), also read by test_deepspeed.py.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.checkpoint.protocol import scan
from launcher.config import compose
from launcher.model.build import build_model

from launch import (
    FAST,
    FAST_USER_LOADER,
    LAUNCH_TIMEOUT,
    base_env,
    explain,
    free_port,
    losses,
    metrics,
    python_train,
    stop_once_checkpointed,
    summary,
    torchrun,
)
from reference import REORDERED, cut_at
from reference_runs import STRATEGY_POINTS, STRATEGY_SCHEDULE, STRATEGY_STEPS

STEPS = STRATEGY_STEPS


RUN = [*FAST, *STRATEGY_SCHEDULE]


RESUME = [*FAST_USER_LOADER, *STRATEGY_SCHEDULE]


POINTS = STRATEGY_POINTS


def cut_at_10(sweep: Path, point: str, dest: Path) -> Path:
    """A run directory holding only the sweep point's step-10 checkpoint."""
    return cut_at(sweep / f"strategy={point}", 10, dest)


def close(a: dict, b: dict, rel: float) -> bool:
    return a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], rel=rel) for k in a)


def unit_bytes(world: int) -> tuple[int, int]:
    """fp32 bytes FSDP2 gathers for one transformer block and for the root of the tiny
    GPT-2 of these tests: every parameter padded along dim 0 to a multiple of `world`."""
    model = build_model(compose([]).model, 512, eot_id=0)  # data.bpe_vocab_size=512 (FAST)

    def padded(params) -> int:
        return sum(-(-p.shape[0] // world) * world * (p.numel() // p.shape[0]) * 4 for p in params)

    blocks = list(model.transformer.h)
    in_blocks = {id(p) for b in blocks for p in b.parameters()}
    (block,) = {padded(b.parameters()) for b in blocks}
    return block, padded(p for p in model.parameters() if id(p) not in in_blocks)


def test_fsdp2_matches_ddp_with_comm_figures_dcp_checkpoints_and_the_table(strategy_sweep):
    ddp = losses(strategy_sweep / "strategy=ddp")
    block, root = unit_bytes(2)
    assert sorted(ddp) == list(range(1, STEPS + 1))
    for point in ("fsdp2", "fsdp2_noreshard"):
        run_dir = strategy_sweep / f"strategy={point}"
        fsdp = losses(run_dir)
        assert close(fsdp, ddp, 1e-5), (point, fsdp, ddp)
        # Communication: all-gathers per micro-step (3 units forward; the 2 blocks again in
        # backward when resharded), one reduce-scatter per unit on the last micro-step only.
        kinds = json.loads((run_dir / "comm_collectives.json").read_text())["per_kind"]
        assert kinds["all_gather"]["calls_per_step"] == (10 if point == "fsdp2" else 6)
        assert kinds["reduce_scatter"]["calls_per_step"] == 3
        # Counted bytes (all-reduce-equivalent: half the full tensor for these two kinds),
        # exactly: per micro-step (2) the root and each block gathered, the blocks again in
        # backward when resharded; one reduce-scatter of every unit's gradients per step.
        gathers = 2 if point == "fsdp2" else 1
        gathered = 2 * (root + 2 * gathers * block) // 2
        scattered = (root + 2 * block) // 2
        s = summary(run_dir)
        for r in [*(r for r in metrics(run_dir) if "loss" in r), s]:
            assert 0 < r["comm/exposed_s"] <= r["comm/allreduce_s"] <= r["step_time_s/max"]
            assert 0 < r["comm/overhead_frac"] < 1
            assert r["comm/bytes"] == gathered + scattered
            assert r["comm/allgather_bytes"] == gathered
            assert r["comm/reducescatter_bytes"] == scattered
            for stem in ("comm/allgather", "comm/reducescatter"):
                assert 0 < r[f"{stem}_exposed_s"] <= r[f"{stem}_s"] <= r["comm/allreduce_s"]
                algbw = r[f"{stem}_bytes"] / r[f"{stem}_s"] / 1e9
                assert r[f"{stem}_busbw_gbps"] == pytest.approx(algbw)  # 2(n-1)/n = 1 at n = 2
            algbw = r["comm/bytes"] / r["comm/allreduce_s"] / 1e9
            assert r["comm/busbw_gbps"] == pytest.approx(algbw)
        step = run_dir / "checkpoints" / "step_00000020"
        files = json.loads((step / "meta.json").read_text())["files"]
        assert {".metadata", "__0_0.distcp", "__1_0.distcp", "rng_rank1.pt"} <= files.keys()
        assert s["status"] == "completed"
    with open(strategy_sweep / "sweep_summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["point"] for r in rows] == [f"strategy={p}" for p in POINTS]
    for r in rows:
        assert r["status"] == "completed" and float(r["final_loss"]) > 0
        assert float(r["tokens_per_s"]) > 0 and float(r["host_peak_gb"]) > 0.05
        assert float(r["exposed_s"]) <= float(r["allreduce_s"])
    assert (strategy_sweep / "sweep_summary.png").stat().st_size > 0


def test_fsdp2_resumes_exactly_at_the_same_world_size(strategy_sweep, tmp_path):
    straight = losses(strategy_sweep / "strategy=fsdp2")
    same = cut_at_10(strategy_sweep, "fsdp2", tmp_path / "same")
    proc = torchrun([*RESUME, "strategy=fsdp2", f"run.root={tmp_path}", "run.id=same"])
    assert proc.returncode == 0, explain(proc)
    assert "world size changed" not in proc.stderr
    assert losses(same) == {s: straight[s] for s in range(11, STEPS + 1)}


def elastic(agents: int, args: list[str]) -> list[subprocess.CompletedProcess]:
    """`agents` torchrun agents of one elastic job (--nnodes=1:2, one rank each), as one
    node each would start them; the group forms with however many joined within 10 s of
    the first (the rendezvous' last call)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1:2", "--nproc_per_node=1",
           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--rdzv-id=el",
           "--rdzv-conf=last_call_timeout=10,join_timeout=120", "--max-restarts=0",
           "-m", "launcher.train", *args]  # fmt: skip
    procs = [
        subprocess.Popen(
            cmd, env=base_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )  # fmt: skip
        for _ in range(agents)
    ]
    outs = [p.communicate(timeout=LAUNCH_TIMEOUT)[0] for p in procs]
    return [
        subprocess.CompletedProcess(cmd, p.returncode, "", out)
        for p, out in zip(procs, outs, strict=True)
    ]


def test_elastic_membership_2_then_1_then_2_ranks(strategy_sweep, tmp_path):
    """torchrun --nnodes=1:2 on the sweep's FSDP2 checkpoint of 2 ranks at step 10: one
    agent alone resumes to 15, two agents (a group of 2 formed by the rendezvous) to 20;
    DCP reshards, accumulation is re-derived (2 -> 4 -> 2), the change is logged once per
    resume, and the curve is the uninterrupted run's within reduction-order rounding."""
    straight = losses(strategy_sweep / "strategy=fsdp2")
    el = cut_at_10(strategy_sweep, "fsdp2", tmp_path / "el")
    args = [*RESUME, "strategy=fsdp2", f"run.root={tmp_path}", "run.id=el"]
    for agents, steps, change in ((1, 15, "2 to 1"), (2, STEPS, "1 to 2")):
        procs = elastic(agents, [*args, f"trainer.max_steps={steps}"])
        for proc in procs:
            assert proc.returncode == 0, explain(proc)
        out = "".join(p.stderr for p in procs)
        assert f"process group created: gloo, {agents} ranks" in out, out
        changed = [ln for ln in out.splitlines() if "world size changed from" in ln]
        assert len(changed) == 1 and f"from {change} rank(s)" in changed[0], out
        accum = "2 -> 4" if agents == 1 else "4 -> 2"
        assert f"accumulation {accum} micro-steps" in changed[0]
    assert close(losses(el), {s: straight[s] for s in range(11, STEPS + 1)}, REORDERED)


def test_ddp_resumes_at_one_rank_and_converts_both_ways(strategy_sweep, tmp_path):
    """A DDP checkpoint of 2 ranks resumed by 1 rank (to step 15), whose checkpoint FSDP2
    resumes on 2 ranks (each rank keeps its shard of the whole state DDP saved); and an
    FSDP2 checkpoint resumed by DDP on 1 rank (the shards gathered whole, to step 13),
    whose checkpoint DDP resumes on 2 ranks (to 15)."""
    straight = losses(strategy_sweep / "strategy=ddp")
    chain = cut_at_10(strategy_sweep, "ddp", tmp_path / "chain")
    args = [*RESUME, f"run.root={tmp_path}", "run.id=chain"]
    one = python_train([*args, "strategy=ddp", "trainer.max_steps=15"])
    assert one.returncode == 0, explain(one)
    assert "accumulation 2 -> 4 micro-steps" in one.stderr
    two = torchrun([*args, "strategy=fsdp2"])
    assert two.returncode == 0, explain(two)
    assert "resumed from step 15" in two.stderr and "accumulation 4 -> 2" in two.stderr
    assert close(losses(chain), {s: straight[s] for s in range(11, STEPS + 1)}, REORDERED)

    back = cut_at_10(strategy_sweep, "fsdp2", tmp_path / "back")
    args = [*RESUME, "strategy=ddp", f"run.root={tmp_path}", "run.id=back"]
    proc = python_train([*args, "trainer.max_steps=13"])
    assert proc.returncode == 0, explain(proc)
    assert "resumed from step 10" in proc.stderr
    grown = torchrun([*args, "trainer.max_steps=15"])  # and DDP itself from 1 rank to 2
    assert grown.returncode == 0, explain(grown)
    assert "resumed from step 13" in grown.stderr and "accumulation 4 -> 2" in grown.stderr
    assert close(losses(back), {s: straight[s] for s in range(11, 16)}, REORDERED)


def test_reshard_after_forward_to_2_of_4_ranks(strategy_sweep, tmp_path):
    """strategy.reshard_after_forward=2 on 4 ranks: after forward each block keeps a copy
    sharded over 2 ranks, and backward gathers it within those 2; the arithmetic is the
    same, so the losses are those of resharding fully and of not resharding (2 ranks,
    another reduction order) within fp32 rounding. Six steps: accumulation 1 here."""
    proc = torchrun([*RUN, "trainer.max_steps=6", "trainer.eval_interval=0",
                     "trainer.checkpoint_interval=0", "strategy=fsdp2",
                     "strategy.reshard_after_forward=2", f"run.root={tmp_path}", "run.id=r2"],
                    nproc=4)  # fmt: skip
    assert proc.returncode == 0, explain(proc)
    assert "sharded over 4 ranks, reshard_after_forward=2" in proc.stderr
    run_dir = tmp_path / "r2"
    got = losses(run_dir)
    assert sorted(got) == list(range(1, 7))
    for point in ("fsdp2", "fsdp2_noreshard"):
        reference = losses(strategy_sweep / f"strategy={point}")
        assert close(got, {s: reference[s] for s in got}, REORDERED), (point, got)
    # Forward gathers the 3 units from 4 shards, backward the 2 blocks from 2-rank copies.
    kinds = json.loads((run_dir / "comm_collectives.json").read_text())["per_kind"]
    assert kinds["all_gather"]["calls_per_step"] == 5
    block, root = unit_bytes(4)
    half_block, _ = unit_bytes(2)  # the 2-rank copy: padded to a multiple of 2
    assert kinds["all_gather"]["bytes_per_step"] == (root + 2 * block + 2 * half_block) // 2


def test_async_checkpoint_sigterm_leaves_a_complete_one_and_resumes_exactly(
    strategy_sweep, tmp_path
):
    """trainer.async_checkpoint=true, a checkpoint every 2 steps, SIGTERM once one exists:
    the stop waits for the last write, every checkpoint left is complete (none half-written
    under a step_<n> name), and the relaunch continues to the sweep's losses exactly (the
    state was copied when the save started, not read later while training changed it)."""
    args = [*RESUME, "strategy=fsdp2", "trainer.async_checkpoint=true",
            "trainer.checkpoint_interval=2", f"run.root={tmp_path}", "run.id=a"]  # fmt: skip
    output = tmp_path / "out.txt"
    code, out = stop_once_checkpointed(args, tmp_path, 4, output)
    assert code == 143, out
    stopped = summary(tmp_path / "a")
    assert stopped["status"] == "stopped" and 4 <= stopped["steps"] < STEPS, out
    found = scan(tmp_path / "a" / "checkpoints")
    assert not found.incomplete and not found.leftovers, found
    assert found.complete[0].name == f"step_{stopped['steps']:08d}"
    again = torchrun(args, runner="launcher.torchrun")
    assert again.returncode == 0, explain(again)
    assert f"resumed from step {stopped['steps']}" in again.stderr
    assert losses(tmp_path / "a") == losses(strategy_sweep / "strategy=fsdp2")
