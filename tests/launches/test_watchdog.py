"""The hang watchdog on a real launch: a stalled rank has every rank's stacks dumped and the
job exits with the hang code (the watchdog's pure limits: tests/unit/resilience/)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from launcher.resilience import exit_codes

WATCHDOG_SCRIPT = """
import time
from omegaconf import OmegaConf
from launcher.config import WatchdogConfig
from launcher.resilience.watchdog import HangWatchdog
cfg = OmegaConf.structured(WatchdogConfig(min_s=0.5, first_step_s=0.5))
HangWatchdog(cfg, rank=3, run_dir=__import__("pathlib").Path({run_dir!r}), start_step=7,
             on_hang=lambda step: open({marker!r}, "w").write(str(step)))
def stuck_in_user_code():
    time.sleep(60)
stuck_in_user_code()
"""


def test_watchdog_dumps_stacks_and_exits_with_the_hang_code(tmp_path):
    (tmp_path / "logs").mkdir()
    marker = tmp_path / "on_hang"
    script = WATCHDOG_SCRIPT.format(run_dir=str(tmp_path), marker=str(marker))
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == exit_codes.HANG, proc.stderr
    assert "stuck_in_user_code" in (tmp_path / "logs" / "stacks.rank3.txt").read_text()
    record = json.loads((tmp_path / "logs" / "hang.rank3.json").read_text())
    assert record["step"] == 7 and record["phase"] == "first step"
    assert record["main_stack"][-1]["function"] == "stuck_in_user_code"
    assert marker.read_text() == "7"
