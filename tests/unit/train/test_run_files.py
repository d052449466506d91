"""The run's files on rank 0: config.yaml and env.json written whole, a continued run says
which settings changed since the launch before, and summary.json."""

from __future__ import annotations

import json
import logging

from launcher.config import compose, typed, validate
from launcher.runtime.process import Runtime
from launcher.train.run_files import changed_settings, write_run_files, write_summary_if_room

from in_process import CPU


def test_changed_settings_name_each_difference_and_an_unset_key():
    before = {"trainer": {"max_steps": 10, "lr": 0.1}, "gone": 1}
    now = {"trainer": {"max_steps": 20, "lr": 0.1}}
    assert changed_settings(before, now) == ["gone: 1 -> (unset)", "trainer.max_steps: 10 -> 20"]


def test_a_continued_run_logs_what_changed_before_config_yaml_is_replaced(tmp_path, caplog):
    rt = Runtime(0, 0, 1, CPU, None, run_id="r", run_dir=tmp_path)
    first = compose(["trainer.max_steps=10"])
    validate(first, 1)
    write_run_files(typed(first), rt, 0)
    assert json.loads((tmp_path / "env.json").read_text())["run_id"] == "r"
    again = compose(["trainer.max_steps=20"])
    validate(again, 1)
    with caplog.at_level(logging.INFO, logger="launcher"):
        write_run_files(typed(again), rt, 10)
    assert "trainer.max_steps: 10 -> 20" in caplog.text
    assert "max_steps: 20" in (tmp_path / "config.yaml").read_text()
    write_summary_if_room(tmp_path, {"status": "completed"})
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "completed"
