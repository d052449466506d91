"""The memory tier launched (launcher.checkpoint.memory, docs/checkpoints.md): a rank killed
between two durable checkpoints costs at most `trainer.memory_checkpoint_interval` steps after
torchrun's restart, with the uninterrupted run's losses (DDP against the long run; FSDP2's
shards and DeepSpeed ZeRO-2's partitions against the strategy sweep's points); a rewind
restores its newer step. Each launch resumes a copy of its reference's durable checkpoint
(the step before the tier's) rather than training up to it again.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import signal
import sys
from pathlib import Path

import pytest

from launcher.checkpoint import memory

from launch import (
    FAST_USER_LOADER,
    LAUNCH_TIMEOUT,
    explain,
    finish,
    free_port,
    losses,
    metrics,
    none_left,
    processes_of,
    run_dir_of,
    start,
    start_torchrun,
    summary,
    torchrun,
    wait_for,
    worker_pid,
)
from reference import cut_at
from reference_runs import LONG, STRATEGY_SCHEDULE, STRATEGY_STEPS


def kill_rank_1_when(args: list[str], root: Path, output: Path, ready) -> tuple[Path, str]:
    """`args` under torchrun --max-restarts=1 with rank 1 SIGKILLed once `ready(run_dir)`
    holds; the run directory and rank 0's log, after the restarted job ended with 0."""
    proc = start_torchrun(args, output, "--max-restarts=1", runner="torch.distributed.run")
    wait_for(lambda: run_dir_of(root) is not None, proc)
    run_dir = run_dir_of(root)
    wait_for(lambda: ready(run_dir), proc)
    os.kill(worker_pid(run_dir, 1), signal.SIGKILL)
    out = finish(proc, output)
    assert proc.returncode == 0, out
    return run_dir, (run_dir / "logs" / "rank0.log").read_text()


def test_killed_rank_resumes_from_the_memory_tier(long_run, tmp_path):
    """The long run (durable checkpoints at 20, 40, 60) resumed from its step-40 checkpoint
    under torchrun --max-restarts=1, the tier at its default (every 10 steps under restarts,
    in /dev/shm): rank 1 is SIGKILLed as soon as both ranks sealed step 50's memory
    checkpoint (each its own, before they agree on it at the next step). The restart resumes
    from step 50, not the durable 40, and ends with the uninterrupted run's losses, bit for
    bit."""
    output, root = tmp_path / "out.txt", tmp_path / "runs"
    cut_at(long_run, 40, root / "k")
    args = [*LONG, f"run.root={root}", "run.id=k"]

    def sealed(run_dir: Path) -> bool:  # step 50's memory checkpoint, sealed by every rank
        folders = (memory.rank_folder("/dev/shm", run_dir, r) for r in (0, 1))
        return all((f / "step_00000050" / "meta.json").exists() for f in folders)

    run_dir, log = kill_rank_1_when(args, root, output, sealed)
    first, again = log.split("memory tier: step 50 is newer than the durable step_00000040")
    assert "resumed from step 40" in first and "resumed from step 50" in again
    reached = max(int(s) for s in re.findall(r"step (\d+)/60", first))
    assert 50 <= reached <= 50 + memory.DEFAULT_INTERVAL  # the steps the kill lost
    assert losses(run_dir) == {s: v for s, v in losses(long_run).items() if s > 40}
    assert summary(run_dir)["steps"] == 60
    kept = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
    assert kept == ["step_00000040", "step_00000060"]
    assert not memory.rank_folder("/dev/shm", run_dir, 0).parent.exists()  # freed at the end


@pytest.mark.parametrize("point", ["fsdp2", "zero2"])
def test_a_sharded_engines_killed_rank_resumes_its_shards(point, strategy_sweep, tmp_path):
    """The sweep point's run (durable checkpoints at 10 and 20), resumed from its step-10
    checkpoint under torchrun --max-restarts=1 with the default DataLoader and the tier every
    5 steps: rank 1 stalls as step 17 starts (step 15's memory checkpoint, every rank's own
    shard, sealed at 16) and is SIGKILLed there. The restart resumes from step 15, not the
    durable 10, and ends with the uninterrupted sweep point's losses, bit for bit."""
    output, root = tmp_path / "out.txt", tmp_path / "runs"
    every = 5
    reference = strategy_sweep / f"strategy={point}"
    cut_at(reference, 10, root / "s")
    stall = ["fault.kind=stall", "fault.rank=1", "fault.step=17"]
    run = [*FAST_USER_LOADER, *STRATEGY_SCHEDULE, f"strategy={point}", f"run.root={root}"]
    run += ["run.id=s"]
    tier = [f"trainer.memory_checkpoint_interval={every}", *stall]
    run_dir, log = kill_rank_1_when(  # fault.rank1 is written as the stall starts
        [*run, *tier], root, output, lambda d: (d / "logs" / "fault.rank1").exists()
    )
    first, again = log.split("memory tier: step 15 is newer than the durable step_00000010")
    assert "resumed from step 10" in first and "resumed from step 15" in again
    reached = max(int(s) for s in re.findall(rf"step (\d+)/{STRATEGY_STEPS}", first))
    assert reached - 15 <= every  # the steps the kill lost
    assert losses(run_dir) == {s: v for s, v in losses(reference).items() if s > 10}
    assert summary(run_dir)["steps"] == STRATEGY_STEPS
    assert not memory.rank_folder("/dev/shm", run_dir, 0).parent.exists()  # freed at the end


def test_a_rewind_restores_the_memory_tiers_newer_step(long_run, tmp_path):
    """trainer.on_nonfinite=rewind with the tier every 2 steps: rank 1's NaN in step 45
    rewinds to step 44's memory checkpoint (sealed first), not the durable step 40, and
    skips only step 45's data window: no step is redone. From the long run's step-40
    checkpoint to step 50, on its schedule (lr_decay_steps=60)."""
    cut_at(long_run, 40, tmp_path / "rw")
    run = [*LONG, "trainer.max_steps=50", "trainer.lr_decay_steps=60"]
    run += [f"run.root={tmp_path}", "run.id=rw", "trainer.memory_checkpoint_interval=2"]
    bad = ["trainer.on_nonfinite=rewind", "fault.kind=nonfinite", "fault.rank=1", "fault.step=45"]
    proc = torchrun([*run, *bad], runner="launcher.torchrun")
    assert proc.returncode == 0, explain(proc)
    assert (
        "rewound to step 44 (step_00000044) after the non-finite step 45; data window 44 is "
        "skipped" in proc.stderr
    )
    reference = losses(long_run)
    got = [r for r in metrics(tmp_path / "rw") if "loss" in r]
    assert [r["step"] for r in got] == [*range(41, 45), *range(45, 51)]  # nothing redone
    assert {r["step"]: r["loss"] for r in got[:4]} == {s: reference[s] for s in range(41, 45)}
    assert all(math.isfinite(r["loss"]) for r in got)
    s = summary(tmp_path / "rw")
    assert (s["status"], s["steps"], s["bad_steps/rewinds"]) == ("completed", 50, 1)


def two_nodes(args: list[str], root: Path, tmp_path: Path, port: int, node: int):
    """Torchrun agent `node` of a 2-node job of 2 ranks each on this machine (a c10d
    rendezvous on localhost), its tier in a memory folder of its own: the nodes' tier
    folders are not siblings, as on two machines."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=2",
           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=peer",
           "--max-restarts=1", "-m", "launcher.train", *args,
           f"trainer.memory_checkpoint_dir={tmp_path / f'shm{node}'}"]  # fmt: skip
    return start(cmd, tmp_path / f"node{node}.txt")


def test_a_node_lost_whole_restores_from_its_peers_copies(tmp_path):
    """trainer.memory_checkpoint_peer on 2 nodes x 2 ranks (two torchrun agents, each with
    its own memory folder), the tier every 4 steps, no durable checkpoint before the end:
    rank 3 stalls as step 11 starts (step 8's checkpoint sealed and copied to the peers);
    the job is SIGKILLed whole, node 1's memory deleted, and the job started again under the
    same launch id (as a requeue does). The restart restores step 8 on ranks 2-3 from their
    peers' copies (ranks 0-1): step 9's loss is the first attempt's, bit for bit."""
    root = tmp_path / "runs"
    port = free_port()
    args = [*FAST_USER_LOADER, "trainer.max_steps=14", "trainer.checkpoint_interval=0",
            "trainer.memory_checkpoint_interval=4", "trainer.memory_checkpoint_peer=true",
            "fault.kind=stall", "fault.rank=3", "fault.step=11", f"run.root={root}",
            "run.id=p"]  # fmt: skip
    nodes = [two_nodes(args, root, tmp_path, port, n) for n in (0, 1)]
    run_dir = root / "p"
    # the copies the restore reads: a rank seals its own folder before the ranks agree, and
    # its copy travels after, each in its own time
    peer = memory.node_folder(str(tmp_path / "shm0"), run_dir) / "peer"
    copies = [peer / f"rank{r}" / "step_00000008" / "meta.json" for r in (2, 3)]
    wait_for(lambda: (run_dir / "logs" / "fault.rank3").exists()
             and all(c.exists() for c in copies), nodes[1])  # fmt: skip
    for pid in processes_of(root):  # node 1 is gone, and the job with it (agents, ranks)
        os.kill(pid, signal.SIGKILL)
    assert none_left(root, within_s=30) == []
    before = losses(run_dir)  # the steps logged before the loss of node 1
    assert max(before) >= 9  # step 10's record may not have reached the file
    shutil.rmtree(tmp_path / "shm1")  # node 1's memory is lost, node 0's is kept
    # The job starts again (a requeue: the same launch id) on node 0 and a new node 1.
    nodes = [two_nodes(args, root, tmp_path, port, n) for n in (0, 1)]
    for node in nodes:
        assert node.wait(timeout=LAUNCH_TIMEOUT) == 0, (tmp_path / "node0.txt").read_text()
    log = (run_dir / "logs" / "rank0.log").read_text()
    # Whichever order the rendezvous gave the two agents this time, step 8 is whole again:
    # ranks 2-3's folders come from the peer copies on node 0 (moved to node 1 if it runs
    # them, or made theirs on node 0 if the new node 1 came first and runs ranks 0-1).
    (line,) = [ln for ln in log.splitlines() if "memory tier: step 8 restored for" in ln]
    assert "rank(s) 2-3 from their peers' copies" in line, line
    assert "resumed from step 8" in log
    after = losses(run_dir)
    # Step 9's loss is a function of step 8's parameters and data position alone: restored
    # exactly. Later steps add over 4 ranks in another order (DDP's first step of a launch
    # runs before its buckets are rebuilt): fp32 rounding apart.
    assert after[9] == before[9]
    assert {s: after[s] for s in before} == pytest.approx(before, rel=2e-6)
    assert sorted(after) == list(range(1, 15)) and summary(run_dir)["steps"] == 14
