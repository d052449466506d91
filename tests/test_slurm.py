"""`python -m launcher.submit slurm`: rendering, bad input, and real jobs on a real Slurm
cluster (one slurmctld and two slurmd on this machine, see slurm_cluster.py).

One uninterrupted 2-node x 1-process job (profiler on) is checked for completeness and is
the reference for a second, identical job that is sent Slurm's warning signal mid-run: it
must checkpoint, requeue itself (same job id, same run directory), resume and end with the
same loss at every step.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_cluster import CRED_EXPIRE_S, ClusterUnavailable, SlurmCluster

from launcher.submit.__main__ import main as submit_main
from launcher.submit.slurm import EXAMPLE_OVERRIDES, render_example

from launch import FAST, explain, losses, metrics, summary

REPO = Path(__file__).resolve().parents[1]
JOB_TIMEOUT = 420
# 100 quick steps: long enough to send the signal mid-run, short enough for 2 cores.
RUN = [
    *FAST,
    "trainer.max_steps=100",
    "trainer.checkpoint_interval=50",
    "trainer.eval_interval=50",
    "profiler=steps",
    "profiler.skip_first=2",
]
# One process per node: with two ranks a gradient sum does not depend on the order gloo adds
# in, so a resumed run can equal the uninterrupted one bit for bit. (With more ranks, DDP's
# bucket layout, rebuilt after each process's first step, changes that order: losses then
# agree only to about 1e-7 after a resume, measured at 2 x 2.)
SHAPE = ["cluster.nodes=2", "cluster.procs_per_node=1"]


@pytest.fixture(scope="module")
def cluster():
    c = SlurmCluster()
    try:
        c.start()
    except ClusterUnavailable as exc:
        c.stop()
        pytest.skip(f"no Slurm cluster: {exc}")
    yield c
    c.stop()


def submit(cluster: SlurmCluster, root: Path, run_id: str, *extra: str):
    """The user's command, for real; returns (job id, run dir)."""
    from launch import free_port

    venv = [f"cluster.slurm.venv={sys.prefix}"] if sys.prefix != sys.base_prefix else []
    cmd = [
        sys.executable,
        "-m",
        "launcher.submit",
        "slurm",
        *SHAPE,
        *RUN,
        *venv,
        f"cluster.workdir={REPO}",
        f"cluster.rdzv_port={free_port()}",
        f"run.root={root}",
        f"run.id={run_id}",
        *extra,
    ]
    proc = subprocess.run(cmd, env=cluster.env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, explain(proc)
    found = re.search(r"submitted Slurm job (\d+); run dir (\S+);", proc.stdout)
    assert found, proc.stdout
    assert proc.stdout.splitlines()[0] == str(root / run_id / "submit" / "job.sbatch")
    return found.group(1), Path(found.group(2))


def job_state(cluster: SlurmCluster, job_id: str) -> dict[str, str]:
    out = subprocess.run(
        ["scontrol", "-o", "show", "job", job_id],
        env=cluster.env(),
        capture_output=True,
        text=True,
    ).stdout
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def wait_until_done(cluster: SlurmCluster, job_id: str, run_dir: Path, timeout=JOB_TIMEOUT):
    """Poll until the job has ended. A requeued job waits (BeginTime) until its previous
    start's credential has expired; once that has (`cred_expire` in the test slurm.conf),
    it is let start at once rather than at Slurm's next scheduling pass. Earlier, Slurm
    would kill it ("Job credential revoked")."""
    deadline = time.monotonic() + timeout
    pending_since = None
    while time.monotonic() < deadline:
        state = job_state(cluster, job_id)
        if state.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            return state
        if state.get("JobState") == "PENDING" and state.get("Reason") == "BeginTime":
            pending_since = pending_since or time.monotonic()
            if time.monotonic() - pending_since > CRED_EXPIRE_S + 2:
                subprocess.run(
                    ["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env=cluster.env()
                )
        time.sleep(0.5)
    output = "\n".join(p.read_text()[-3000:] for p in (run_dir / "submit").glob("slurm-*.out"))
    raise AssertionError(f"job {job_id} did not end in {timeout} s:\n{output}")


@pytest.fixture(scope="module")
def reference(cluster, tmp_path_factory):
    """The uninterrupted job: (job id, run dir, scontrol's view of it at the end)."""
    root = tmp_path_factory.mktemp("slurm-runs")
    job_id, run_dir = submit(cluster, root, "whole")
    state = wait_until_done(cluster, job_id, run_dir)
    return job_id, run_dir, state


def slurm_output(run_dir: Path, job_id: str) -> str:
    return (run_dir / "submit" / f"slurm-{job_id}.out").read_text()


def test_two_node_job_completes_into_one_run_directory(reference):
    job_id, run_dir, state = reference
    out = slurm_output(run_dir, job_id)
    assert state["JobState"] == "COMPLETED" and state["ExitCode"] == "0:0", out[-3000:]
    assert "nodes n[1-2]" in out and "launcher: training finished" in out
    s = summary(run_dir)
    assert (s["status"], s["steps"], s["world_size"]) == ("completed", 100, 2)
    assert {r["step"] for r in metrics(run_dir) if "loss" in r} == set(range(1, 101))
    for rank in range(2):
        log = (run_dir / "logs" / f"rank{rank}.log").read_text()
        assert f"rank {rank}/2 (local 0," in log  # one process on each of the two nodes
        traces = list((run_dir / "traces" / f"rank{rank}").glob("*.pt.trace.json*"))
        assert traces, f"no profiler trace for rank {rank}"
    assert (run_dir / "submit" / "job.sbatch").is_file()


def test_warned_job_checkpoints_requeues_and_resumes(cluster, reference, tmp_path):
    """Slurm's warning (USR1 to the batch shell, as --signal=B:USR1@lead sends it before the
    time limit or on preemption): every rank checkpoints, the job requeues itself under the
    same id, resumes from that checkpoint and ends with the reference's losses."""
    job_id, run_dir = submit(cluster, tmp_path, "warned")
    deadline = time.monotonic() + JOB_TIMEOUT
    while not (
        (run_dir / "metrics.jsonl").exists()
        and any(r.get("step", 0) >= 5 for r in metrics(run_dir))
    ):
        assert time.monotonic() < deadline, "the job never reached step 5"
        assert job_state(cluster, job_id).get("JobState") in ("PENDING", "RUNNING")
        time.sleep(0.2)
    signalled = time.monotonic()
    subprocess.run(["scancel", "--batch", "--signal=USR1", job_id], env=cluster.env(), check=True)
    state = wait_until_done(cluster, job_id, run_dir)
    out = slurm_output(run_dir, job_id)
    assert state["JobState"] == "COMPLETED" and state["Restarts"] == "1", out[-4000:]
    assert "launcher: USR1" in out and "launcher: requeueing job" in out
    assert f"launcher: job {job_id}, start 1" in out
    stopped = re.search(r"checkpoint saved: .*step_(\d+)\n.*status=stopped", out)
    assert stopped, out[-4000:]
    stop_step = int(stopped.group(1))
    assert 5 <= stop_step < 100
    assert f"resumed from step {stop_step}" in (run_dir / "logs" / "rank0.log").read_text()
    assert summary(run_dir)["status"] == "completed"
    steps = [r["step"] for r in metrics(run_dir) if "loss" in r]
    assert steps == list(range(1, 101))  # every step once: none lost, none repeated
    assert losses(run_dir) == losses(reference[1])
    print(f"signal to completion: {time.monotonic() - signalled:.1f} s, stopped at {stop_step}")


def test_missing_partition_is_slurms_rejection_in_one_line(cluster, tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))  # submit runs in this process
    before = subprocess.run(
        ["squeue", "-h", "-o", "%i"], env=cluster.env(), capture_output=True, text=True
    ).stdout
    code = submit_main(
        [
            "slurm",
            *SHAPE,
            *FAST,
            f"run.root={tmp_path}",
            "run.id=nopart",
            "cluster.slurm.partition=nosuchpartition",
        ]
    )
    err = capfd.readouterr().err.strip()
    assert code == 2
    assert err.startswith("error: sbatch rejected the job:") and "partition" in err.lower(), err
    assert len(err.splitlines()) == 1
    after = subprocess.run(
        ["squeue", "-h", "-o", "%i"], env=cluster.env(), capture_output=True, text=True
    ).stdout
    assert before == after  # nothing submitted
    assert sorted(p.name for p in (tmp_path / "nopart" / "submit").iterdir()) == ["job.sbatch"]


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["cluster.nodes=3", "cluster.gpus_per_node=2"], "trainer.global_batch_size=8"),
        (["cluster.nodes=2", "cluster.procs_per_node=3"], "world size 6"),
        (["cluster.time_limit=00:05:00"], "cluster.time_limit=00:05:00 (300 s) leaves no time"),
        (
            [
                "cluster.time_limit=01:00:00",
                "cluster.slurm.step_time_s=20",
                "trainer.checkpoint_interval=200",
            ],
            "shorter than one checkpoint interval",
        ),
        (["cluster.time_limit=soon"], "not a Slurm time"),
        (["run.root=/proc/launcher-runs"], "is not a writable directory"),
        (["cluster.slurm.partition=a b"], "cluster.slurm.partition='a b'"),
        (["cluster.slurm.extra_sbatch=[exclusive]"], "is not an sbatch option"),
        (["dist.backend=nccl"], "dist.backend=nccl needs GPUs"),
        (["cluster.slurm.partiton=gpu"], "cluster.slurm.partiton: unknown key"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(overrides, words, tmp_path, capfd):
    root = tmp_path / "runs"
    args = [*FAST, f"run.root={root}", "run.id=bad", *overrides]
    code = submit_main(["slurm", "--dry-run", *args])
    out, err = capfd.readouterr()
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and words in err, err
    assert not (root / "bad").exists()


def test_dry_run_writes_the_script_and_submits_nothing(tmp_path, capfd):
    args = [*FAST, "cluster.nodes=2", "cluster.procs_per_node=2", f"run.root={tmp_path}"]
    args += ["run.id=dry", "cluster.slurm.qos=high"]
    assert submit_main(["slurm", "--dry-run", *args]) == 0
    out = capfd.readouterr().out.splitlines()
    script = tmp_path / "dry" / "submit" / "job.sbatch"
    assert out == [str(script)]
    text = script.read_text()
    assert "#SBATCH --nodes=2" in text and "#SBATCH --qos=high" in text
    assert "--nproc-per-node=2" in text and "#SBATCH --gpus-per-node" not in text
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0  # valid shell


def test_checked_in_example_is_what_the_renderer_writes():
    example = REPO / "slurm" / "job.sbatch"
    assert example.read_text() == render_example(), (
        "slurm/job.sbatch is stale: python -m launcher.submit.slurm --example > slurm/job.sbatch"
    )
    readme = (REPO / "slurm" / "README.md").read_text()
    assert all(o in readme for o in EXAMPLE_OVERRIDES)  # the README shows the command
