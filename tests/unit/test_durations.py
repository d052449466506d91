"""tests/durations.py: a run's costliest files and tests, in wall and CPU seconds."""

from __future__ import annotations

import sys

import durations

REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.launches.test_a" name="test_waits" time="90.0">
  <properties>
    <property name="tier" value="launch"/><property name="cpu_s" value="2.5"/>
  </properties>
</testcase>
<testcase classname="tests.launches.test_a" name="test_burns" time="30.0">
  <properties><property name="cpu_s" value="55.0"/></properties>
</testcase>
<testcase classname="tests.unit.test_b" name="test_old_run" time="1.5"/>
</testsuite></testsuites>
"""


def test_each_case_has_its_wall_and_cpu_seconds(tmp_path):
    path = tmp_path / "run.xml"
    path.write_text(REPORT)
    assert durations.read(str(path)) == [
        ("test_a.py", "test_waits", 90.0, 2.5),
        ("test_a.py", "test_burns", 30.0, 55.0),
        ("test_b.py", "test_old_run", 1.5, 0.0),  # a report without the property
    ]


def test_tables_are_ordered_by_cpu_seconds(tmp_path, capsys, monkeypatch):
    path = tmp_path / "run.xml"
    path.write_text(REPORT)
    monkeypatch.setattr(sys, "argv", ["durations.py", str(path), "--top", "2"])
    durations.main()
    out = capsys.readouterr().out
    assert "3 tests, 122 s of test time, 58 CPU seconds" in out
    assert "| test_a.py | 120 | 58 |" in out
    tests = [line for line in out.splitlines() if "::" in line]
    assert tests == ["| test_a.py::test_burns | 30 | 55 |", "| test_a.py::test_waits | 90 | 2 |"]
