"""launcher.rehearse launched: the default experiment rehearsed on 2 CPU ranks with every
row passing, and the same under torchrun with one defect planted per case
(tests/rehearse_planted.py) and every row failing for its own reason. The pure parts are
tested in process in tests/unit/rehearse/."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from launcher.config import compose
from launcher.plan.forecast import checkpoint_bytes
from launcher.rehearse import report
from launcher.rehearse.cases import NAMES

from launch import base_env, none_left, refuse_in_unit_tier
from paths import TESTS

PLANTED = TESTS / "rehearse_planted.py"
LOCAL_CASES = [n for n in NAMES if n != "cluster"]
TIMEOUT = 600


def run_rehearsal(cmd: list[str]) -> subprocess.CompletedProcess:
    refuse_in_unit_tier()
    return subprocess.run(cmd, env=base_env(), capture_output=True, text=True, timeout=TIMEOUT)


def read_report(run_dir: Path) -> dict:
    return json.loads((run_dir / "rehearse" / "report.json").read_text())


def test_default_experiment_passes_every_row(tmp_path):
    run_dir = tmp_path / "exp"
    proc = run_rehearsal(
        [sys.executable, "-m", "launcher.rehearse", f"run.root={tmp_path}", "run.id=exp"]
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    got = read_report(run_dir)
    assert [r["case"] for r in got["rows"]] == LOCAL_CASES  # cluster=local: no job to render
    assert all(r["verdict"] == "pass" for r in got["rows"]), got["rows"]
    assert got["passed"] is True and got["nproc"] == 2
    for row in got["rows"]:
        assert (run_dir / row["evidence"]).exists(), row
    rows = {r["case"]: r for r in got["rows"]}
    assert "all 30 losses equal the uninterrupted run's" in rows["stop"]["observed"]
    assert "launcher.analyze: culprit rank 1" in rows["hung_rank"]["observed"]
    assert "straggler/rank=1" in rows["slow_rank"]["observed"]
    hang = json.loads((run_dir / "rehearse" / "hung_rank" / "analysis" / "hang.json").read_text())
    assert hang["culprits"] == [1]
    ckpt = got["stop_checkpoint"]
    assert ckpt["measured_s"] > 0 and ckpt["shrunk_bytes"] > 0
    # gpt2-tiny as launcher.submit sizes it: the run's vocabulary, 12 bytes a parameter
    assert ckpt["real_bytes"] == checkpoint_bytes(compose([]), 1)["total"]  # launcher.plan's
    assert ckpt["extrapolated_s"] == round(
        report.extrapolate(ckpt["measured_s"], ckpt["shrunk_bytes"], ckpt["real_bytes"]), 3
    )
    md = (run_dir / "rehearse" / "report.md").read_text()
    assert "| fault | expected | observed | verdict | evidence path |" in md
    assert "| fault | expected | observed | verdict | evidence path |" in proc.stdout
    assert "Stop checkpoint:" in md


def test_each_planted_defect_fails_its_row_under_torchrun(tmp_path):
    """One defect per case, in that case's launches only: every row fails, each saying
    what went wrong, and the rehearsal exits 1. Started as `torchrun ... rehearse` is: rank
    0 rehearses with the world size as the cases' rank count, each case's launch a job of
    its own (not a member of the enclosing one)."""
    run_dir = tmp_path / "bad"
    front_door = [sys.executable, "-m", "launcher.torchrun", "--standalone", "--nproc_per_node=2"]
    proc = run_rehearsal([*front_door, str(PLANTED), f"run.root={tmp_path}", "run.id=bad"])
    assert proc.returncode == 1, proc.stderr[-6000:]
    got = read_report(run_dir)
    assert got["nproc"] == 2
    rows = {r["case"]: r for r in got["rows"]}
    assert list(rows) == LOCAL_CASES
    assert all(r["verdict"] == "FAIL" for r in rows.values()), rows
    observed = {case: r["observed"] for case, r in rows.items()}
    assert "exit 7" in observed["stop"]
    assert "with --max-restarts=1: exit 2 (bad input)" in observed["killed_rank"]
    assert "no hang detected within" in observed["hung_rank"]
    assert "resumed on 1 rank(s), but step" in observed["world_size"]
    assert "no straggler/rank named" in observed["slow_rank"]
    assert "trainer.max_steps=3: exit 0 (done), not 2" in observed["bad_input"]
    for row in rows.values():
        assert (run_dir / row["evidence"]).exists(), row
    # the hung rank the planted defect never detects was killed with its launch (torchrun
    # starts each rank in a session of its own: killing torchrun's group left it running)
    assert none_left(tmp_path, within_s=5) == []
