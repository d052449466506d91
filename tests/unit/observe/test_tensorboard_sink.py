"""logger=tensorboard without its writer package is one line and exit code 2; a resumed
attempt's events replace the earlier attempt's from the resumed step on, every tag's."""

from __future__ import annotations

import sys
import time

import pytest

from launcher.observe.tensorboard_sink import TensorBoardSink
from launcher.train.front_door import main

from tb_readback import read_runs

pytest.importorskip("tensorboardX", reason="in the test extra: pip install -e '.[test]'")


pytest.importorskip("tensorboard", reason="in the test extra: pip install -e '.[test]'")


def test_missing_writer_is_one_line_exit_2(monkeypatch, capsys):
    """As if tensorboardX were not installed (an import of it fails)."""
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    monkeypatch.setattr(sys, "argv", ["launcher.train", "logger=tensorboard"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.strip() == (
        "error: logger.tensorboard=true (logger=tensorboard) needs the tensorboardX package, "
        "which is not installed: pip install 'launcher[tensorboard]', or logger=none"
    )


def attempt(run_dir, start_step: int, steps: range, straggler_from: int | None) -> None:
    sink = TensorBoardSink(run_dir, start_step=start_step, texts={})
    for step in steps:
        named = straggler_from is not None and step >= straggler_from
        sink.log({"step": step, "loss": 10.0 - step / 10, "straggler/rank": 1 if named else None})
    sink.writer.close()


def test_a_resumed_attempt_leaves_no_point_of_the_earlier_one_past_its_start(tmp_path):
    """The first attempt (24 steps) named a straggler from step 20; the second resumed at 12
    and named none. Its purge removes the first one's points from step 13 on, of every tag,
    the straggler's included: TensorBoard shows steps 1-26 once, and no straggler at all (as
    metrics.jsonl, cut back to step 12, then holds none)."""
    attempt(tmp_path, 0, range(1, 25), straggler_from=20)
    time.sleep(1.1)  # an event file is named by the second it was opened in
    attempt(tmp_path, 12, range(13, 27), straggler_from=None)
    scalars = read_runs(tmp_path / "tb")["."]["scalars"]
    assert set(scalars) == {"loss"}
    assert [step for step, _ in scalars["loss"]] == list(range(1, 27))
