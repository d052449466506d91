"""The checkpoint manager on one rank: a save and a restore carry the engine's state, the
RNG and the data position; the ranks agree on what they resume (an unreadable checkpoint
falls back to the one before); the rewind target is the newest complete checkpoint."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from launcher.checkpoint import cadence
from launcher.checkpoint.manager import CheckpointManager
from launcher.config import ConfigError
from launcher.config.batch import BatchPlan
from launcher.resilience.stop_vote import StopVote
from launcher.runtime.process import Runtime

from in_process import CPU, trainer


class Engine:
    """An engine whose state is one tensor in one file per rank."""

    def __init__(self):
        self.state = torch.zeros(3)

    def save(self, folder: Path, rank: int):
        torch.save(self.state, folder / f"model_rank{rank}.pt")

    def snapshot(self, rank: int, share):
        state = self.state.clone()
        return lambda folder: torch.save(state, folder / f"model_rank{rank}.pt")

    def load(self, folder: Path) -> None:
        self.state = torch.load(folder / "model_rank0.pt")

    def files_to_load(self, folder: Path) -> list[Path]:
        return [folder / "model_rank0.pt"]


BATCH = BatchPlan(global_batch=4, micro_batch=2, world_size=1, seq_len=8)


def manager(run_dir: Path, engine: Engine) -> CheckpointManager:
    rt = Runtime(0, 0, 1, CPU, None, run_dir=run_dir)
    return CheckpointManager(rt, engine, trainer(keep_checkpoints=3), {"lineage": "L1"})


def test_a_restore_brings_back_state_rng_and_data_position(tmp_path):
    engine = Engine()
    saving = manager(tmp_path, engine)
    saving.data_step = 5  # one window ahead of step 4: a rewind skipped one
    engine.state = torch.arange(3.0)
    random.seed(7)
    saving.save(4, BATCH, wait=True)
    expected = random.random()

    restored = Engine()
    loading = manager(tmp_path, restored)
    folder = loading.last_good()
    assert folder is not None and folder.name.endswith("4")
    assert {p.name for p in loading.files_to_load(folder)} == {"model_rank0.pt", "rng_rank0.pt"}
    random.seed(99)
    assert loading.resume([folder], auto=True, batch=BATCH) == 4
    assert torch.equal(restored.state, torch.arange(3.0))
    assert loading.data_step == 5
    assert random.random() == expected
    assert loading.rewind_target() == folder


def test_an_unreadable_checkpoint_falls_back_and_none_left_stops(tmp_path):
    engine = Engine()
    saving = manager(tmp_path, engine)
    saving.data_step = 2
    saving.save(2, BATCH, wait=True)
    good = saving.last_good()
    saving.data_step = 4
    saving.save(4, BATCH, wait=True)
    newest = saving.last_good()
    (newest / "model_rank0.pt").write_bytes(b"not a torch file")

    loading = manager(tmp_path, Engine())
    assert loading.resume([newest, good], auto=False, batch=BATCH) == 2
    with pytest.raises(ConfigError, match="could be loaded"):
        manager(tmp_path, Engine()).resume([newest], auto=False, batch=BATCH)


def test_a_fresh_start_has_nothing_to_restore_or_rewind_to(tmp_path):
    fresh = manager(tmp_path, Engine())
    assert fresh.resume([], auto=True, batch=BATCH) == 0
    assert fresh.rewind_target() is None
    assert not fresh.memory_due(10)  # no memory tier


@pytest.mark.parametrize("with_tier", [False, True])
def test_the_durable_auto_interval_follows_memory_losses_only_while_the_tier_is_on(
    tmp_path, with_tier
):
    from launcher.checkpoint import memory

    rt = Runtime(0, 0, 1, CPU, None, run_id="r", run_dir=tmp_path / "run")
    knobs = trainer(checkpoint_interval="auto", memory_checkpoint_interval="auto", mtbf_h=0.05,
                    memory_loss_mtbf_h=0.5)  # fmt: skip
    tier = memory.MemoryTier(str(tmp_path / "shm"), 2, rt, {"lineage": "L1"}) if with_tier else None
    made = CheckpointManager(rt, Engine(), knobs, {"lineage": "L1"}, tier)
    expected = 1800.0 if with_tier else 180.0  # without the tier every failure falls back
    assert made.durable_every.mtbf == expected and made.memory_every.mtbf == 180.0
    if tier is not None:
        tier.close(remove=True)


def test_an_auto_intervals_cost_rides_on_the_stop_vote(tmp_path):
    """No gather of its own, nor a ride on a writer's: the cost of the save at step 2, known
    two steps on, goes out with the vote of step 4 and sets the interval when that vote
    comes back at step 5, from the last save (step 4) on."""
    rt = Runtime(0, 0, 1, CPU, None, run_id="r", run_dir=tmp_path)
    knobs = trainer(checkpoint_interval="auto", memory_checkpoint_interval=0, mtbf_h=1e-4)
    made = CheckpointManager(rt, Engine(), knobs, {"lineage": "L1"})
    every, gathers, vote = made.durable_every, [], StopVote(riders=[made])
    rt.all_gather_objects = lambda obj: gathers.append(obj) or [obj]  # counts, changes nothing
    for step in range(1, 6):
        made.step_done(step)
        vote.poll()
        if step == 4:
            assert every.writes == []  # not yet: the vote of step 4 is on its way
        if made.durable_due(step, last=False):
            made.save(step, BATCH)
    assert gathers == []  # one rank's writer agrees with nobody: the cadence asked nothing
    assert len(every.writes) == 1 and every.note() is None
    assert every.next == 4 + every.every


def test_a_restart_recalls_the_auto_intervals_its_run_measured(tmp_path, caplog):
    """What the auto intervals agreed travels in the checkpoint's meta.json: a new process
    resuming it at the same world size saves at that interval from the start (not FIRST
    steps in), and says so; at another world size it measures afresh."""
    knobs = trainer(checkpoint_interval="auto", memory_checkpoint_interval=0, mtbf_h=1e-3)
    rt = Runtime(0, 0, 1, CPU, None, run_id="r", run_dir=tmp_path)
    made = CheckpointManager(rt, Engine(), knobs, {"lineage": "L1"})
    made.durable_every.agree([(0.2, 0.05)])  # a save of 0.2 s at 0.05 s a step: 24 steps
    measured = made.durable_every.every
    assert measured == round((2 * 0.2 * 3.6) ** 0.5 / 0.05) == 24
    made.save(30, BATCH, wait=True)
    folder = made.last_good()

    again = CheckpointManager(rt, Engine(), knobs, {"lineage": "L1"})
    with caplog.at_level("INFO", logger="launcher"):
        assert again.resume([folder], auto=True, batch=BATCH) == 30
    every = again.durable_every
    assert (every.every, every.next, every.writes, every.pace) == (measured, 54, [0.2], 0.05)
    assert (
        "trainer.checkpoint_interval=auto: every 24 steps (sqrt(2 x 200 ms a save x " in caplog.text
    )
    assert "as this run measured before the restart" in caplog.text

    wider = Runtime(0, 0, 1, CPU, None, run_id="r", run_dir=tmp_path)
    wider.world_size = 2  # the checkpoint's world size was 1: a save costs another time here
    other = CheckpointManager(wider, Engine(), knobs, {"lineage": "L1"})
    other._recall_cadence(folder)
    assert other.durable_every.every == cadence.FIRST and other.durable_every.writes == []
