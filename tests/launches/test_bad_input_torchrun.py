"""Bad input under torchrun: rank 0's one line, exit code 2, nothing started, and every other
rank gone within 2 s of it (no 20 s linger)."""

from __future__ import annotations

import os
import subprocess
import threading
import time

from launch import FAST, base_env, torchrun_cmd

# Every rank has exited within this long of rank 0's line (issue 26): the others no longer
# sit out BAD_INPUT_LINGER_S, they end on the SIGTERM torchrun sends once rank 0 has gone.
BAD_INPUT_EXIT_S = 2.0


def stderr_lines_timed(cmd: list[str], timeout: float) -> tuple[int, list[tuple[float, str]]]:
    """Run `cmd`: its exit code, and each line of its stderr with the time it arrived."""
    proc = subprocess.Popen(
        cmd, env=base_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    try:
        lines = [(time.monotonic(), line.rstrip("\n")) for line in proc.stderr]
    finally:
        killer.cancel()
    return proc.wait(), lines


def test_bad_input_under_torchrun_starts_nothing(tmp_path):
    """World size 2 makes a global batch of 6 with micro-batch 2 impossible: rank 0 says
    so once, no process group is created and no run directory either, and every rank exits
    2 within BAD_INPUT_EXIT_S of that line (torchrun logs the first failure once it has
    reaped every worker)."""
    overrides = [*FAST, f"run.root={tmp_path}", "trainer.global_batch_size=6"]
    code, lines = stderr_lines_timed(torchrun_cmd(overrides, runner="launcher.torchrun"), 120)
    text = "\n".join(line for _, line in lines)
    assert code == 2, text
    assert "launcher.torchrun: exit code 2 (bad input); ranks' codes: 0: 2, 1: 2" in text
    assert "process group created" not in text
    ours = [(t, line) for t, line in lines if line.startswith("error: ")]
    assert [line for _, line in ours] == [
        "error: trainer.global_batch_size=6 is not divisible by trainer.micro_batch_size=2 x "
        "world size 2 = 4; choose a global batch that is a multiple of 4"
    ]
    reaped = [t for t, line in lines if "failed (exitcode: 2) local_rank: 0" in line]
    assert reaped, text
    took = reaped[0] - ours[0][0]
    assert took < BAD_INPUT_EXIT_S, f"every rank gone {took:.2f} s after rank 0's line\n{text}"
    assert not os.listdir(tmp_path)
