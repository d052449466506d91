"""trainer.on_nonfinite's verdicts on one rank: stop asks nothing per step, skip drops a
step and stops at one too many within the window, rewind goes back to the newest complete
checkpoint past the bad data window (and stops when there is none)."""

from __future__ import annotations

import pytest
import torch

from launcher.checkpoint.manager import CheckpointManager
from launcher.observe.metrics import Interval
from launcher.observe.recorder import Recorder
from launcher.runtime.process import Runtime
from launcher.train.nonfinite import NonFinite, NonFiniteLoss

from in_process import CPU, trainer

NAN, ONE = torch.tensor(float("nan")), torch.tensor(1.0)


def policy(tmp_path, **overrides) -> NonFinite:
    t = trainer(**overrides)
    rt = Runtime(0, 0, 1, CPU, None, run_dir=tmp_path)
    recorder = Recorder(rt, t, [], 64, 6.0, lambda tokens_per_s: None, 2)
    checkpoints = CheckpointManager(rt, None, t, {"lineage": "L"})
    return NonFinite(t, rt, checkpoints, recorder)


def test_stop_checks_no_step_and_stops_at_a_log_or_checkpoint(tmp_path):
    stop = policy(tmp_path)
    assert stop.bad_ranks([NAN]) == []
    interval = Interval()
    interval.add_loss(NAN)
    with pytest.raises(NonFiniteLoss, match="non-finite loss by step 4 on rank"):
        stop.check(4, interval)


def test_skip_drops_steps_until_one_too_many_within_the_window(tmp_path):
    skip = policy(tmp_path, on_nonfinite="skip", max_bad_steps=1, bad_step_window=10)
    assert skip.bad_ranks([ONE, ONE]) == []
    assert skip.bad_ranks([ONE, NAN]) == [0]
    interval = Interval()
    skip.skip(3, [0], interval)
    assert (interval.dropped, skip.recorder.bad_step_counts()) == (1, {"bad_steps/skipped": 1})
    with pytest.raises(NonFiniteLoss, match="2 bad steps within 10, more than"):
        skip.skip(5, [0], interval)


def test_rewind_without_a_checkpoint_stops(tmp_path):
    rewind = policy(tmp_path, on_nonfinite="rewind")
    rewind.checkpoints.data_step = 3
    with pytest.raises(NonFiniteLoss, match="trainer.on_nonfinite=rewind: no checkpoint yet"):
        rewind.rewind_target(3, [0])
