"""tests/cpu_accounting.py in a pytest run of its own: a test's CPU seconds in the JUnit
report include the processes it started, and tests/durations.py reads them."""

from __future__ import annotations

import subprocess
import sys

import durations

from launch import base_env
from paths import TESTS

BURN = "import time; end = time.process_time() + {s}\\nwhile time.process_time() < end: pass"
TEST_FILE = f'''
import subprocess, sys, time

def test_burns_in_a_child():
    subprocess.run([sys.executable, "-c", "{BURN.format(s=1.5)}"], check=True)

def test_waits():
    time.sleep(1.5)
'''


def test_a_tests_cpu_seconds_count_its_children_and_not_its_waits(tmp_path):
    (tmp_path / "test_costs.py").write_text(TEST_FILE)
    report = tmp_path / "run.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "cpu_accounting", "-p", "no:cacheprovider",
         "-o", "addopts=", f"--junitxml={report}", str(tmp_path / "test_costs.py")],
        cwd=tmp_path, env=base_env(PYTHONPATH=str(TESTS)), capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cases = {case.name: case for case in durations.read(str(report))}
    assert 1.5 <= cases["test_burns_in_a_child"].cpu_s < 3.0, cases
    assert cases["test_waits"].cpu_s < 0.5 <= 1.5 <= cases["test_waits"].wall_s, cases
