"""The memory tier's decisions in process (launcher.checkpoint.memory, docs/checkpoints.md):
which memory checkpoints a launch may load (never another run's, world size's, lineage's or
launch's), the default interval under torchrun's restarts, what it adds to the shared-memory
need (a sharded engine's per rank share), and the one-line refusal of an engine that cannot
write it. The launches are in
tests/launches/test_memory_tier.py.
"""

from __future__ import annotations

import math
import shutil
from collections import namedtuple
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from launcher.checkpoint import memory
from launcher.checkpoint.resume import identity
from launcher.config import ConfigError, compose
from launcher.config.model_shape import param_count, param_sizes
from launcher.config.registry import engines
from launcher.config.saved_bytes import ENTRY_BYTES
from launcher.plan.memory import shm_need
from launcher.preflight import check_config
from launcher.runtime.process import Runtime
from launcher.strategy.base import host_copy

IDENTITY = {"model": {"name": "m"}, "strategy": {"name": "ddp"}, "world_size": 1}


def runtime(run_dir: Path, run_id: str = "r", world_size: int = 1) -> Runtime:
    return Runtime(0, 0, world_size, torch.device("cpu"), None, run_id=run_id, run_dir=run_dir)


def tier(root: Path, rt: Runtime, lineage: str = "line-a") -> memory.MemoryTier:
    made = memory.MemoryTier(str(root), 2, rt, {**IDENTITY, "world_size": rt.world_size})
    made.follow(lineage)
    return made


def vote(t: memory.MemoryTier) -> None:
    """A stop vote's ride at one rank: the thread's work done, its numbers back."""
    t.drain()
    t.arrived([t.payload()])
    t.drain()  # the older step goes from the writing thread, once the ranks agreed


def write_step(t: memory.MemoryTier, step: int) -> None:
    t.save(step, lambda folder: (folder / "model.pt").write_bytes(b"x"), {"data_step": step})
    vote(t)


def test_a_launch_loads_only_its_own_runs_memory_checkpoints(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    root, run = tmp_path / "shm", tmp_path / "runs" / "r"
    writer = tier(root, runtime(run))
    write_step(writer, 4)
    write_step(writer, 6)  # keeps the newest one only
    assert sorted(p.name for p in writer.folder.glob("step_*")) == ["step_00000006"]
    assert writer.newest_common("line-a", after=2) == writer.folder / "step_00000006"
    assert writer.newest_common("line-a", after=6) is None  # not newer than the durable one
    assert writer.newest_common("line-b", after=0) is None  # another lineage
    assert tier(root, runtime(run, run_id="other")).usable("line-a") == {}  # another run id
    assert tier(root, runtime(run, world_size=2)).usable("line-a") == {}  # another world size
    elsewhere = tier(root, runtime(tmp_path / "runs" / "r2"))  # another run directory
    assert elsewhere.folder != writer.folder and elsewhere.usable("line-a") == {}
    # Before the first durable checkpoint, only the same launch's (none here: no launch id).
    assert writer.usable(None) == {}
    writer.close(remove=True)
    assert not writer.folder.exists() and not writer.folder.parent.exists()


def test_before_a_durable_checkpoint_only_the_same_launch_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "launch-1")
    root, run = tmp_path / "shm", tmp_path / "runs" / "r"
    write_step(tier(root, runtime(run)), 4)
    assert sorted(tier(root, runtime(run)).usable(None)) == [4]  # a restart of the launch
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "launch-2")
    assert tier(root, runtime(run)).usable(None) == {}  # a later launch of the run directory


def test_a_memory_checkpoint_the_resume_check_refuses_is_skipped(tmp_path):
    """Written by another model shape (a changed config between two launches of the run)."""
    root, run = tmp_path / "shm", tmp_path / "runs" / "r"
    written = tier(root, runtime(run))
    written.writer.meta.update(identity(compose([]), None, 1))
    write_step(written, 4)
    same = tier(root, runtime(run))
    same.identity = identity(compose([]), None, 1)
    assert sorted(same.usable("line-a")) == [4]
    deeper = tier(root, runtime(run))
    deeper.identity = identity(compose(["model.n_layer=4"]), None, 1)
    assert deeper.usable("line-a") == {}


def test_a_write_that_fails_turns_the_tier_off_and_keeps_the_step_before(tmp_path, caplog):
    """The thread writes and seals alone; the next vote carries the failure: the failed
    step goes (sealed or not), the one before stays, one warning, and later saves write
    nothing."""
    t = tier(tmp_path / "shm", runtime(tmp_path / "runs" / "r"))
    write_step(t, 4)

    def full(folder: Path) -> None:
        (folder / "model.pt").write_bytes(b"x")
        raise OSError(28, "No space left on device")

    t.save(6, full, {"data_step": 6})
    with caplog.at_level("WARNING", logger="launcher"):
        vote(t)
    assert not t.on and [p.name for p in t.folder.iterdir() if "step" in p.name] == [
        "step_00000004"
    ]
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.startswith("memory checkpoint tier off for the rest of this run (")
    assert "checkpoint step_00000006" in warning and "step_00000004, is kept" in warning
    write_step(t, 8)  # off: nothing written
    assert not (t.folder / "step_00000008").exists()
    t.close(remove=True)


def test_the_older_steps_go_only_once_every_peer_holds_the_newer(tmp_path):
    """With peer copies a rank keeps its older step, and its ward's older copy, until every
    rank's peer holds a copy of the newer one, as each says at a vote (the third number of
    its payload, the ward's newest copy it holds, NaN for none): a node lost while one copy
    is on its way still finds the older step whole, on the other nodes and in its own
    ranks' peer copies. (The copies themselves are a launch's: test_memory_tier.py.)"""
    t = tier(tmp_path / "shm", runtime(tmp_path / "runs" / "r"))
    t.writer.keep, t.ward = 2, 0  # as with peers: the older step kept for the copies
    for step in (4, 6):
        write_step(t, step)
        name = f"step_{step:08d}"
        shutil.copytree(t.folder / name, t.ward_folder / name)  # as a copy arrives
    both = ["step_00000004", "step_00000006"]
    for held in ([6.0, math.nan], [6.0, 4.0]):  # one peer holds no copy yet, or the older
        t._copied_everywhere(held)
        t.drain()
        for folder in (t.folder, t.ward_folder):
            assert [p.name for p in sorted(folder.glob("step_*"))] == both, (held, folder)
    t._copied_everywhere([6.0, 6.0])
    t.drain()
    for folder in (t.folder, t.ward_folder):
        assert [p.name for p in folder.glob("step_*")] == ["step_00000006"], folder
    assert math.isnan(t.payload()[2])  # this rank received no copy of its ward's


def test_the_interval_default_follows_torchruns_restarts():
    cfg = compose([])
    assert memory.interval(cfg, restarts=0) == 0
    assert memory.interval(cfg, restarts=3) == memory.DEFAULT_INTERVAL == 10
    assert memory.interval(compose(["strategy=fsdp2"]), restarts=3) == 10  # every engine can
    assert memory.interval(compose(["trainer.memory_checkpoint_interval=0"]), restarts=3) == 0
    # /dev/shm holds the kept checkpoint and the one being written, on top of the loaders':
    # DDP's state once per node, however many ranks it has.
    for ranks in (1, 8):
        tiered = shm_need(cfg, ranks, restarts=3) - shm_need(cfg, ranks, restarts=0)
        assert tiered == 2 * memory.state_bytes(cfg) > 0
    elsewhere = compose(["trainer.memory_checkpoint_dir=/tmp/ram"])
    assert shm_need(elsewhere, 8, restarts=3) == shm_need(cfg, 8, restarts=0)


def test_a_sharded_engine_needs_its_ranks_share_of_the_state():
    """Per rank: DDP the whole state (12 bytes a parameter), FSDP2 its 1/world_size shard,
    DeepSpeed its ZeRO partition plus (but under ZeRO-3) the whole module in its precision;
    what /dev/shm must hold is twice that (kept + being written) for each rank of a node, on
    top of the loaders' (DDP's: once per node, tests/unit/checkpoint/test_node_share.py)."""
    params = param_count(compose([]).model)
    whole = params * 12

    def share(overrides, world):
        return memory.state_bytes(compose(overrides), world)

    assert share([], 4) == share([], 1) == whole
    # the tied embedding once (as host_copy keeps it), each tensor's torch.save entry
    entries = 4 * len(param_sizes(compose([]).model)) * ENTRY_BYTES
    assert share(["strategy=fsdp2"], 4) == -(-whole // 4) + entries
    assert share(["strategy=zero2"], 4) == params * 4 + -(-whole // 4)
    assert share(["strategy=zero2", "trainer.precision=bf16"], 4) == params * 2 + -(-whole // 4)
    assert share(["strategy=zero3"], 4) == -(-whole // 4)
    assert share(["strategy=deepspeed", "strategy.zero_stage=0"], 4) == whole
    cfg = compose(["strategy=fsdp2"])  # each of a node's 2 ranks holds its own shard
    tiered = shm_need(cfg, 2, 4, restarts=3) - shm_need(cfg, 2, 4, restarts=0)
    assert tiered == 2 * 2 * share(["strategy=fsdp2"], 4)


def test_an_engine_without_the_tier_is_refused_in_one_line(monkeypatch):
    """An added engine (the `launcher.engines` entry points) that declares no snapshot."""
    monkeypatch.setitem(engines(), "fsdp2", replace(engines()["fsdp2"], memory_checkpoint=None))
    cfg = compose(["strategy=fsdp2", "trainer.memory_checkpoint_interval=5"])
    assert memory.interval(cfg, restarts=3) == 5
    assert memory.interval(compose(["strategy=fsdp2"]), restarts=3) == 0  # its default: off
    with pytest.raises(ConfigError) as refused:
        check_config(cfg, 2)
    assert str(refused.value) == (
        "trainer.memory_checkpoint_interval=5 needs strategy=ddp or deepspeed; strategy=fsdp2 "
        "cannot write the memory tier yet: set trainer.memory_checkpoint_interval=0 (its "
        "durable checkpoints are kept as before)"
    )


def test_a_snapshot_shares_nothing_the_next_step_changes():
    """host_copy (what every engine's snapshot copies): tensors (a tied one once),
    containers, namedtuples (DeepSpeed's parameter slices) and other objects (its loss
    scaler) all new."""

    class Scaler:
        cur_scale = 1.0

    Slice = namedtuple("Slice", "numel start")
    w = torch.ones(3)
    live = {"w": w, "tied": w.detach(), "groups": [{"slice": Slice(3, 0)}], "scaler": Scaler()}
    snap = host_copy(live)
    assert snap["tied"] is snap["w"]  # copied once, as torch.save keeps a tied weight once
    live["w"].add_(1)
    live["groups"][0]["lr"] = 0.5
    live["scaler"].cur_scale = 2.0
    assert snap["w"].tolist() == [1.0, 1.0, 1.0]
    assert snap["groups"] == [{"slice": Slice(3, 0)}]
    assert snap["scaler"].cur_scale == 1.0
