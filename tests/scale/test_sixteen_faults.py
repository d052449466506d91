"""The faults that are one rank among many, at 16 ranks (docs/scale.md): a rank frozen by
SIGSTOP is named by the hang protocol within its allowance and by `launcher.analyze`, and the
burn-in gate refuses the job naming its one slow rank. Each is one `launcher.torchrun
--standalone --nproc_per_node=16` of the default job (DataLoader workers on), ending on its
fault.
"""

from __future__ import annotations

import json
import socket
import time

from launcher.resilience import bad_hosts, exit_codes

from launch import FAST_USER_LOADER, analyze_cli, explain, summary, torchrun

RANKS = 16
JOB = [*FAST_USER_LOADER, "trainer.global_batch_size=16", "trainer.micro_batch_size=1"]
FROZEN = 9
# The allowance: 10 s without a step (the default, 60 s, holds the serial part a minute
# longer and proves nothing more; tests/launches/test_faults.py keeps it at 2 ranks).
WATCHDOG = ["watchdog.min_s=10", "watchdog.step_multiple=10"]
SLOW = 11
# 0.2 s more per matmul against a few ms (tests/launches/test_burnin.py's plant).
SLOW_RANK = ["fault.kind=slow_device", f"fault.rank={SLOW}", "fault.seconds=0.2"]
GATE = ["burnin.enabled=true", "burnin.tolerance=3", "burnin.action=refuse"]


def test_a_rank_frozen_among_16_is_named_by_its_silence(tmp_path):
    """Rank 9 stops (SIGSTOP) as step 4 starts. The 15 ranks that can run detect the hang
    within the allowance, each writes its stacks and hang record and exits 5; the front
    door ends the frozen rank; the analyser names rank 9 as the one that could not run."""
    fault = ["fault.kind=sigstop", f"fault.rank={FROZEN}", "fault.step=4"]
    run = [*JOB, f"run.root={tmp_path}", "run.id=frozen", *fault, *WATCHDOG]
    proc = torchrun(run, nproc=RANKS, runner="launcher.torchrun")
    ended = time.time()
    assert proc.returncode == exit_codes.HANG, explain(proc)
    logs = tmp_path / "frozen" / "logs"
    stacks = sorted(int(p.name.split(".rank")[1][:-4]) for p in logs.glob("stacks.rank*.txt"))
    assert stacks == [r for r in range(RANKS) if r != FROZEN]
    records = [json.loads(p.read_text()) for p in logs.glob("hang.rank*.json")]
    assert sorted(r["rank"] for r in records) == stacks
    declared = [r for r in records if r["idle_s"] >= r["limit_s"]]
    assert declared and all(r["limit_s"] == 10.0 and r["step"] == 3 for r in declared), records
    # written before anyone ended it: each names the frozen rank stopped, so no rank waits
    # out the deadline for its record
    assert all(r["stopped_peers"] == [FROZEN] for r in declared), records
    last_step = min(r["time"] - r["idle_s"] for r in declared)
    assert ended - last_step < 10.0 + 30, (ended - last_step, explain(proc))
    # Ended by whoever saw it first: the front door, or a peer's watchdog (15 of them race
    # to it at 16 ranks, and a SIGKILLed process is still listed as stopped for an instant).
    killed = [ln for ln in proc.stderr.splitlines() if "is stopped (SIGSTOP)" in ln]
    assert killed and all(f"rank {FROZEN} (pid " in ln for ln in killed), explain(proc)
    assert summary(tmp_path / "frozen")["status"] == "failed: hang detected"
    cli = analyze_cli(tmp_path / "frozen")
    assert cli.returncode == 0, cli.stderr
    assert f"Culprit: rank {FROZEN}" in cli.stdout and "could not run" in cli.stdout
    report = json.loads((tmp_path / "frozen" / "analysis" / "hang.json").read_text())
    assert report["culprits"] == [FROZEN] and report["step"] == 3
    # The culprit's host is kept off the next attempt (exclude.hang), with the verdict's why.
    host = socket.gethostname()
    assert bad_hosts.reasons(tmp_path / "frozen") == {
        host: f"hang: rank {FROZEN} wrote no stacks: the process could not run at all (stopped, "
        "swapped out, or stuck in the kernel or a driver) (after step 3)"
    }


def test_the_burnin_gate_refuses_naming_the_slow_rank_among_16(tmp_path):
    run = [*JOB, f"run.root={tmp_path}", "run.id=gate", *GATE, *SLOW_RANK]
    proc = torchrun(run, nproc=RANKS, runner="launcher.torchrun")
    assert proc.returncode == exit_codes.BAD_NODE, explain(proc)
    run_dir, host = tmp_path / "gate", socket.gethostname()
    report = json.loads((run_dir / "burnin.json").read_text())
    assert report["verdict"] == "refused"
    assert [(s["rank"], s["host"]) for s in report["slow_ranks"]] == [(SLOW, host)]
    assert [r["rank"] for r in report["ranks"]] == list(range(RANKS))
    assert report["seconds"] < report["budget_s"]
    log = (run_dir / "logs" / "rank0.log").read_text()
    (line,) = [ln for ln in log.splitlines() if "burn-in: slower than the others" in ln]
    assert f"rank {SLOW} on {host}:" in line and "refused: exit 6 (bad node)" in line
    assert not (run_dir / "metrics.jsonl").exists()  # no step ran
    assert bad_hosts.read(run_dir) == [host]
    assert bad_hosts.reasons(run_dir)[host].startswith(f"burn-in: rank {SLOW}: matmul")
