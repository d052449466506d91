"""The burn-in gate in a real launch (docs/burnin.md): 2 CPU ranks, the default DataLoader,
rank 1 made the outlier by `fault.kind=slow_device`. One torchrun runs both actions as the
two points of a sweep: `warn` names the rank (rank, host, figure) in burnin.json, env.json
and one line of rank 0's log, and trains; `refuse` names it the same way and exits 6 (bad
node) before any step: no step record, no checkpoint, the host in bad_hosts. The sbatch
script's bad-node block, run by bash with a stand-in `scontrol`, requeues once with the
hosts excluded; the requeue on another node is shown on the real Slurm cluster
(tests/cluster/test_slurm.py).
"""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

from launcher.resilience import bad_hosts, exit_codes

from launch import FAST_USER_LOADER, explain, metrics, summary, torchrun
from submit_render import render, slurm_stand_ins

# 0.2 s more per matmul against a few ms: far above any tolerance noise could reach.
SLOW_RANK_1 = ["fault.kind=slow_device", "fault.rank=1", "fault.seconds=0.2"]
GATE = ["burnin.enabled=true", "burnin.tolerance=3"]


def gate_lines(run_dir) -> list[str]:
    log = (run_dir / "logs" / "rank0.log").read_text()
    return [ln for ln in log.splitlines() if "burn-in: slower than the others" in ln]


def test_the_gate_names_the_slow_rank_then_warns_or_refuses(tmp_path):
    proc = torchrun(
        [
            "-m",
            *FAST_USER_LOADER,
            "trainer.max_steps=4",
            "trainer.checkpoint_interval=2",
            f"run.root={tmp_path}",
            "run.id=gate",
            *GATE,
            *SLOW_RANK_1,
            "burnin.action=warn,refuse",
        ],
        runner="launcher.torchrun",
    )
    assert proc.returncode == exit_codes.BAD_NODE, explain(proc)
    assert "launcher.torchrun: exit code 6 (bad node refused by the burn-in gate)" in proc.stderr
    host = socket.gethostname()
    points = {p.name.split("=")[-1]: p for p in (tmp_path / "gate").iterdir() if "=" in p.name}
    for action, run_dir in points.items():
        report = json.loads((run_dir / "burnin.json").read_text())
        assert report["verdict"] == {"warn": "warned", "refuse": "refused"}[action]
        assert [(s["rank"], s["host"]) for s in report["slow_ranks"]] == [(1, host)]
        slow = report["slow_ranks"][0]
        assert slow["matmul_s"] > 0.2 and slow["excess_frac"] > 3
        assert [r["rank"] for r in report["ranks"]] == [0, 1]
        assert report["seconds"] < report["budget_s"]  # the gate kept to its budget
        lines = gate_lines(run_dir)
        assert len(lines) == 1, lines  # one line, on rank 0's log
        assert f"rank 1 on {host}: {slow['figure']}" in lines[0]
        assert summary(run_dir)["burnin/seconds"] == report["seconds"]

    warned = points["warn"]
    assert summary(warned)["status"] == "completed"
    assert [r["step"] for r in metrics(warned) if "loss" in r] == [1, 2, 3, 4]
    env = json.loads((warned / "env.json").read_text())
    assert env["burnin"]["verdict"] == "warned" and env["burnin"]["slow_ranks"][0]["rank"] == 1
    assert "training goes on" in gate_lines(warned)[0]
    assert not (warned / "bad_hosts").exists()

    refused = points["refuse"]
    assert summary(refused)["status"] == "refused: bad node"
    assert not (refused / "metrics.jsonl").exists()  # no step ran
    assert not list(refused.glob("checkpoints/step_*"))
    (reason,) = bad_hosts.reasons(refused).values()
    assert bad_hosts.read(refused) == [host] and reason.startswith("burn-in: rank 1: matmul")
    assert "refused: exit 6 (bad node)" in gate_lines(refused)[0]


def bad_node_block(script: str) -> str:
    """The requeue function (launcher.submit.slurm.exclude) and the block of exit 6."""
    start = script.index("# Requeue this job, the run's bad hosts")
    return script[start : script.index("# Requeue after a preemption")]


# The partition's four nodes (one is left once n1, n2 and n9 are excluded).
SCONTROL = slurm_stand_ins(["n1", "n2", "n3", "n9"])


def run_block(block: str, run_dir: Path, excluded: str) -> str:
    script = f'{SCONTROL}\ncode=6\nrun_dir={run_dir}\nSLURM_JOB_ID=7\nEXCLUDED="{excluded}"\n'
    proc = subprocess.run(["bash", "-c", script + block], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_the_sbatch_script_requeues_once_excluding_the_refused_hosts(tmp_path):
    block = bad_node_block(render("slurm", tmp_path)["job.sbatch"])
    run_dir = tmp_path / "r"
    out = run_block(block, run_dir, "(null)")
    assert out == f"launcher: not requeued: exit 6 but no {run_dir}/bad_hosts names a host\n"
    bad_hosts.record(run_dir, {"n2": "burn-in: rank 3: matmul 9 ms", "n1": "burn-in: rank 0"})
    out = run_block(block, run_dir, "n9")
    assert out.strip().endswith(f"without the node(s) in {run_dir}/bad_hosts: --exclude=n1,n2,n9")
    assert (run_dir / "calls").read_text().splitlines() == [
        "requeuehold 7",
        "update JobId=7 ExcNodeList=n1,n2,n9",
        "release 7",
    ]
    again = run_block(block, run_dir, "n1,n2,n9")  # refused again after the requeue
    assert again.startswith("launcher: not requeued: the burn-in gate refused a node again")
    assert len((run_dir / "calls").read_text().splitlines()) == 3
