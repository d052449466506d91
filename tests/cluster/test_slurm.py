"""`python -m launcher.submit slurm`: rendering, bad input, and real jobs on a real Slurm
cluster (one slurmctld and two slurmd on this machine, see slurm_cluster.py).

One uninterrupted 2-node x 1-process job (profiler on) is checked for completeness and is
the reference for a second, identical job that is sent Slurm's warning signal mid-run: it
must checkpoint, requeue itself (same job id, same run directory), resume and end with the
same loss at every step. Shorter jobs check the requeue policy (no requeue without a newer
checkpoint, none past cluster.slurm.max_requeues, none after bad input), two jobs sharing
their first node (each its own rendezvous port), and a cancelled job's output.

Tests that need the lead's `launcher.torchrun` (the contract's exit codes through torchrun)
say so in their docstrings: test_warned_job_checkpoints_requeues_and_resumes (exit 143 in
the log) and test_bad_input_fails_without_requeue (exit 2).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets as secrets_module
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from refusals import readable_by_nobody
from slurm_cluster import ClusterUnavailable, SlurmCluster, job_state
from slurm_cluster import submit as slurm_submit
from slurm_cluster import wait_until_done as slurm_wait_until_done

from launcher.resilience import bad_hosts
from launcher.submit.__main__ import main as submit_main
from launcher.submit.slurm import EXAMPLE_OVERRIDES, render_example

from launch import FAST, is_rank, launch_words, losses, metrics, summary
from paths import REPO

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
KEY = "0123456789abcdef0123456789abcdef01234567"  # 40 hex digits: a W&B key's shape


def front_door_missing() -> str | None:
    """The rendered jobs run `python -m launcher.torchrun` (the exit-code front door)."""
    if importlib.util.find_spec("launcher.torchrun") is None:
        return "launcher.torchrun (the exit-code front door the jobs run) is not installed"
    return None


@pytest.fixture(scope="module")
def cluster():
    missing = front_door_missing()
    if missing:
        pytest.skip(missing)
    c = SlurmCluster()
    try:
        c.start()
    except ClusterUnavailable as exc:
        c.stop()
        pytest.skip(f"no Slurm cluster: {exc}")
    yield c
    c.stop()


def submit(cluster: SlurmCluster, root: Path, run_id: str, *extra: str, run=RUN, env=None):
    """The user's command of SHAPE and `run`, for real (slurm_cluster.submit)."""
    return slurm_submit(cluster, root, run_id, [*SHAPE, *run], *extra, env=env)


def wait_until(cluster: SlurmCluster, job_id: str, states: tuple[str, ...], timeout=120):
    deadline = time.monotonic() + timeout
    while (state := job_state(cluster, job_id)).get("JobState") not in states:
        assert time.monotonic() < deadline, f"job {job_id} never reached {states}: {state}"
        time.sleep(0.2)
    return state


def wait_until_done(cluster: SlurmCluster, job_id: str, run_dir: Path, timeout=JOB_TIMEOUT):
    return slurm_wait_until_done(cluster, job_id, run_dir, timeout)


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
    # each node's front door left its code for the batch script to decide the job's by
    (codes,) = (run_dir / "logs" / "node_codes").iterdir()
    assert codes.name == f"job{job_id}.start0"
    assert {p.name: p.read_text() for p in codes.iterdir()} == {"n1": "0\n", "n2": "0\n"}


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
    assert "launcher: training ended with exit code 143 (stopped with a checkpoint)" in out
    stopped = re.search(r": stopped, (\d+) steps in", out)  # the closing line of the stop
    assert stopped, out[-4000:]
    stop_step = int(stopped.group(1))
    assert f"checkpoint saved: {run_dir}/checkpoints/step_{stop_step:08d}" in out
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
        (["cluster.slurm.gpu_request=gpus"], "cluster.slurm.gpu_request=gpus: not one of"),
        (["cluster.rdzv_port=65000"], "the ports 65000..65999 must lie within 1024..65535"),
        (
            ["cluster.slurm.container_image=a#b,c"],
            "a value with # must be quoted",
        ),
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


def render_text(tmp_path, *overrides: str, name="job.sbatch") -> str:
    args = [*FAST, f"run.root={tmp_path}", "run.id=r", *overrides]
    assert submit_main(["slurm", "--dry-run", *args]) == 0
    return (tmp_path / "r" / "submit" / name).read_text()


def test_rendered_policies(tmp_path, capfd):
    """The front door, the port, the job name, the requeue policy and its cap, as rendered."""
    text = render_text(tmp_path, "cluster.nodes=2", "+exp=throughput")
    assert "    python -m launcher.torchrun \\\n    --nnodes=2 \\\n" in text
    assert "torchrun --" not in text  # never plain torchrun: it exits 1 whatever happened
    assert "port=$((29500 + SLURM_JOB_ID % 1000))" in text
    assert "#SBATCH --job-name=launcher-throughput" in text
    assert "at most 20 requeues (cluster.slurm.max_requeues)" in text
    assert 'if [ "$restart" -ge 20 ]; then' in text
    mem = int(re.search(r"#SBATCH --mem=(\d+)M\n", text).group(1))  # the node's need
    assert mem > 1024 and "# --mem: 1 process(es): the plan's " in text  # CPU: 0.4 GB + model
    assert "scancel --signal=TERM" in text.split("on_term()")[0]  # only on USR1's path
    # A resubmission with the same run id keeps the earlier script.
    text2 = render_text(
        tmp_path,
        "cluster.gpus_per_node=4",
        "trainer.global_batch_size=16",
        "cluster.slurm.gpu_request=gres",
        "cluster.slurm.max_requeues=null",
        "cluster.slurm.resv_ports=true",
        "cluster.slurm.container_image=nvcr.io#nvidia/pytorch:24.05-py3",
        "cluster.job_name=mine",
        name="job-2.sbatch",
    )
    out = capfd.readouterr().out.split()
    assert out == [str(tmp_path / "r" / "submit" / n) for n in ("job.sbatch", "job-2.sbatch")]
    assert "#SBATCH --gres=gpu:4" in text2 and "--gpus-per-node" not in text2
    assert "max_requeues=" not in text2.split("# Requeue after")[1] and "no cap" in text2
    assert "--container-image=nvcr.io#nvidia/pytorch:24.05-py3" in text2
    # quoted for Hydra, in the arguments file
    assert "\"cluster.slurm.container_image='nvcr.io#nvidia/pytorch:24.05-py3'\"" in text2
    assert "#SBATCH --job-name=mine" in text2
    # a GPU job asks for its memory: 4 processes of 2.4 GB (the plan's, launcher.plan.host)
    # with 25% on top, /dev/shm's need, the 1G margin
    assert int(re.search(r"#SBATCH --mem=(\d+)M\n", text2).group(1)) >= 4 * 2861 + 1024
    assert "--resv-ports=1" in text2
    assert subprocess.run(["bash", "-n", "-c", text2]).returncode == 0


def test_checked_in_example_is_what_the_renderer_writes():
    example = REPO / "slurm" / "job.sbatch"
    assert example.read_text() == render_example(), (
        "slurm/job.sbatch is stale: python -m launcher.submit.slurm --example > slurm/job.sbatch"
    )
    readme = (REPO / "slurm" / "README.md").read_text()
    assert all(o in readme for o in EXAMPLE_OVERRIDES)  # the README shows the command


# Short jobs for the policy tests: 12 steps, checkpoints at 6 and 12.
SHORT = [*FAST, "trainer.eval_interval=1000"]


def test_two_jobs_sharing_their_first_node_both_complete(cluster, tmp_path):
    """Non-exclusive jobs on the same nodes: each rendezvouses on its own port (29500 + job
    id mod 1000), so neither joins the other's store."""
    jobs = [submit(cluster, tmp_path, f"shared{i}", run=SHORT) for i in range(2)]
    running = [wait_until(cluster, job_id, ("RUNNING",)) for job_id, _ in jobs]
    assert {s["NodeList"] for s in running} == {"n[1-2]"}  # the same first node, n1
    states = [wait_until_done(cluster, job_id, run_dir) for job_id, run_dir in jobs]
    ports = set()
    for (job_id, run_dir), state in zip(jobs, states, strict=True):
        out = slurm_output(run_dir, job_id)
        assert state["JobState"] == "COMPLETED", out[-3000:]
        assert summary(run_dir)["steps"] == 12
        port = int(re.search(r"rendezvous n1:(\d+)", out).group(1))
        assert port == 29500 + int(job_id) % 1000
        ports.add(port)
    assert len(ports) == 2
    first, second = states
    assert second["StartTime"] < first["EndTime"]  # they ran at the same time


def output_with(run_dir: Path, job_id: str, text: str, deadline: float) -> float:
    """Wait until the job's Slurm output holds `text`; returns when it was seen."""
    output = run_dir / "submit" / f"slurm-{job_id}.out"
    while not (output.exists() and text in output.read_text()):
        assert time.monotonic() < deadline, f"job {job_id}: no {text!r} in its output"
        time.sleep(0.1)
    return time.monotonic()


def setup_line_pid(job_id: str) -> int:
    """The pid of job `job_id`'s setup line (`sleep 120`), as root reads /proc."""
    deadline = time.monotonic() + 60
    while not (found := ranks("sleep 120", job_id)):
        assert time.monotonic() < deadline, f"job {job_id}: its setup line never ran"
        time.sleep(0.1)
    return min(found)


def test_a_stop_in_setup_is_taken_at_once_and_said_once(cluster, tmp_path):
    """Jobs stopped during a long setup line (a 120 s sleep until the test's flag exists),
    before any checkpoint. Three warned (USR1): the shell takes the signal at once, not when
    the line ends. One warned near its time limit (shrunk to 5 minutes: less left than the
    warning's lead) made no progress, so it is not requeued; one capped at max_requeues=0
    names the cap; both end FAILED 143 without a restart. The third, warned far from any
    limit, is a preemption: requeued without a checkpoint, it starts again (the flag now
    set), trains and completes. Two stopped (TERM): scancel sends it to every process of
    the job, the batch shell first (cancelled), or the setup line first, its shell untouched
    (line_stopped: the line's own process sent TERM here, as Slurm's order may have it).
    Either way one line, `TERM during setup`, exit code 143, no `setup failed` (the line did
    not fail: it used to end the job with exit code 2, bad input, and no line)."""
    flag = tmp_path / "setup-may-end"
    setup = [f'cluster.setup=["echo launcher-test: in setup", "[ -e {flag} ] || sleep 120"]']
    one_node = [*setup, "cluster.nodes=1"]
    jobs = {
        "noprogress": submit(cluster, tmp_path, "noprogress", *setup, run=SHORT),
        "capped": submit(
            cluster, tmp_path, "capped", *setup, "cluster.slurm.max_requeues=0", run=SHORT
        ),
        "preempted": submit(cluster, tmp_path, "preempted", *setup, run=SHORT),
        "cancelled": submit(cluster, tmp_path, "cancelled", *one_node, run=SHORT),
        "line_stopped": submit(cluster, tmp_path, "line_stopped", *one_node, run=SHORT),
    }
    deadline = time.monotonic() + JOB_TIMEOUT
    for name, (job_id, run_dir) in jobs.items():
        output_with(run_dir, job_id, "launcher-test: in setup", deadline)
        if name == "cancelled":
            subprocess.run(["scancel", job_id], env=cluster.env(), check=True)
            continue
        if name == "line_stopped":
            os.kill(setup_line_pid(job_id), signal.SIGTERM)
            continue
        time.sleep(0.5)  # the sleep has started
        if name == "noprogress":
            subprocess.run(
                ["scontrol", "update", f"JobId={job_id}", "TimeLimit=5"],
                env=cluster.env(),
                check=True,
            )
        sent = time.monotonic()
        subprocess.run(
            ["scancel", "--batch", "--signal=USR1", job_id], env=cluster.env(), check=True
        )
        taken = output_with(run_dir, job_id, "launcher: USR1 at", deadline) - sent
        assert taken < 5, f"{name}: USR1 taken {taken:.1f} s after it was sent"
    flag.touch()
    expected = {
        "noprogress": "not requeued: no newer checkpoint was completed during this start "
        "(still none); a requeue would make no progress",
        "capped": "not requeued: cluster.slurm.max_requeues=0 reached",
    }
    for name, (job_id, run_dir) in jobs.items():
        state = wait_until_done(cluster, job_id, run_dir)
        out = slurm_output(run_dir, job_id)
        assert (
            "requeue policy: on a preemption (USR1 well before the time limit) or a lost node "
            "(exit 8) always" in out
        )
        stop = "TERM" if name in ("cancelled", "line_stopped") else "USR1"
        said = (
            f"launcher: {stop} during setup: training did not start and wrote no checkpoint; "
            "exit code 143"
        )
        assert out.count(said) == 1 and "setup failed" not in out, out
        if name == "preempted":
            assert (state["JobState"], state["Restarts"]) == ("COMPLETED", "1"), out[-3000:]
            assert "(preemption): every rank checkpoints" in out
            requeued = f"launcher: requeueing job {job_id} (preemption); it resumes from the start"
            assert requeued in out
            assert summary(run_dir)["steps"] == 12
            continue
        ended = "CANCELLED" if name == "cancelled" else "FAILED"
        assert (state["JobState"], state["ExitCode"], state["Restarts"]) == (
            ended,
            "143:0",
            "0",
        ), out
        assert "training ended with exit code" not in out, out
        if name in expected:
            assert f"launcher: {expected[name]}" in out, out
        assert "requeueing" not in out and not (run_dir / "metrics.jsonl").exists()
    assert "(time_limit): every rank" in slurm_output(*reversed(jobs["noprogress"]))


def test_bad_input_fails_without_requeue(cluster, tmp_path):
    """A data file that is gone by the time the job starts: the trainer exits 2 (bad
    input), the job ends FAILED with exit code 2 and is not requeued. Needs launcher.torchrun
    to pass the trainer's code on (plain torchrun exits 1)."""
    text = tmp_path / "corpus.txt"
    text.write_text("some text to train on\n" * 2000)
    job_id, run_dir = submit(
        cluster,
        tmp_path,
        "badinput",
        "data=text_files",
        f"data.paths=[{text}]",
        "cluster.slurm.extra_sbatch=['--begin=now+4']",
        run=SHORT,
    )
    text.unlink()  # moved away after submission, before the job starts
    state = wait_until_done(cluster, job_id, run_dir)
    out = slurm_output(run_dir, job_id)
    assert (state["JobState"], state["ExitCode"], state["Restarts"]) == ("FAILED", "2:0", "0")
    assert "launcher: training ended with exit code 2 (bad input: retrying cannot help)" in out
    assert "data.paths: no file matches" in out
    assert "requeueing" not in out and "not requeued" not in out


def test_cancelled_job_checkpoints_without_scancel_errors(cluster, tmp_path):
    """scancel: Slurm sends TERM to the batch shell and every process of the step, then
    KILL after KillWait (30 s here). The ranks checkpoint and stop; the script's trap only
    logs (it used to call scancel itself, which failed with 'Invalid job id')."""
    job_id, run_dir = submit(cluster, tmp_path, "cancelled", run=[*SHORT, "trainer.max_steps=400"])
    deadline = time.monotonic() + JOB_TIMEOUT
    while not ((run_dir / "metrics.jsonl").exists() and metrics(run_dir)):
        assert time.monotonic() < deadline, "the job never logged a step"
        time.sleep(0.2)
    subprocess.run(["scancel", job_id], env=cluster.env(), check=True)
    state = wait_until_done(cluster, job_id, run_dir)
    out = slurm_output(run_dir, job_id)
    assert state["JobState"] == "CANCELLED" and state["Restarts"] == "0", out
    assert "launcher: TERM at" in out and "scancel: error" not in out, out
    stopped = re.search(r": stopped, \d+ steps in", out)  # the stop checkpoint was written
    assert stopped, out[-3000:]


def queued(cluster: SlurmCluster) -> str:
    return subprocess.run(
        ["squeue", "-h", "-o", "%i"], env=cluster.env(), capture_output=True, text=True
    ).stdout


def ranks(marker: str, job_id: str) -> dict[int, tuple[str, str]]:
    """{pid: (command, environment)} of job `job_id`'s running processes whose command holds
    `marker`, read from /proc (as root: every user's). The command is the command line, and
    for a warm start's fork server and the ranks forked from it (multiprocessing's command
    line), the training command in their environment after it (launcher.warm_start)."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().replace(b"\0", b"\n").decode()
        except OSError:
            continue  # ended meanwhile
        command = " ".join(launch_words(int(proc.name)) or [])
        if marker in command and f"SLURM_JOB_ID={job_id}" in environ.splitlines():
            found[int(proc.name)] = (command, environ)
    return found


def test_cpus_per_task_and_secrets_from_the_submitting_shell(cluster, tmp_path):
    """Each node's task gets processes x (1 + DataLoader workers) CPUs, as scontrol reads
    them back. Secrets in the submitting shell (W&B's key of its real shape, GH_PAT, a name
    the old list lacked, and MY_LOGIN, named in cluster.secrets) reach the ranks by
    inheritance (sbatch --export names them), never as text another user of the cluster can
    read: not in `squeue -o %k` (the comment) or `scontrol show job`, not on the command line
    of any process of the job on either node (/proc/*/cmdline, read while they run: no
    secret, not even an override, which travels in a 0600 file), not in any file of the run
    and submit folders or Slurm's output file, which only the submitting user can reach (the
    run directory is 0700: run.access=private). The rendezvous is on the port Slurm reserved
    for the step (cluster.slurm.resv_ports; the test cluster's MpiParams=ports=12000-12999)."""
    secrets = {
        "WANDB_API_KEY": secrets_module.token_hex(20),  # 40 hex digits, as W&B's
        "GH_PAT": "gh-test-pat-42",
        "MY_LOGIN": "aZ3kq9Xw7Lm2Pv8Rt5Yb1Nc4",
    }
    job_id, run_dir = submit(
        cluster,
        tmp_path,
        "cpus",
        "data.num_workers=1",
        'cluster.setup=["echo launcher-test: key of $(printf %s $WANDB_API_KEY | wc -c) chars"]',
        "cluster.slurm.resv_ports=true",
        "cluster.secrets=[MY_LOGIN]",
        "cluster.slurm.extra_sbatch=['--comment=launcher-secrets-test']",
        run=SHORT,
        env=secrets,
    )
    running = wait_until(cluster, job_id, ("RUNNING", "COMPLETED"))
    assert (running["NumNodes"], running["CPUs/Task"], running["NumCPUs"]) == ("2", "2", "4")
    seen: dict[int, tuple[str, str]] = {}
    rank_pids: set[int] = set()  # the ranks among them (a warm rank has its agent's command)
    listed = []
    while job_state(cluster, job_id).get("JobState") in ("PENDING", "RUNNING"):
        found = ranks("", job_id)  # every process of the job, on both nodes
        seen.update(found)
        rank_pids |= {pid for pid in found if is_rank(pid)}
        if not listed and any("launcher.train" in cmd for cmd, _ in seen.values()):
            for cmd in (["squeue", "-h", "-j", job_id, "-o", "%k %j %o"],
                        ["scontrol", "show", "job", job_id]):  # fmt: skip
                run = subprocess.run(cmd, env=cluster.env(), capture_output=True, text=True)
                listed.append(run.stdout)  # what every user of the cluster reads, while it runs
        time.sleep(0.5)
    state = wait_until_done(cluster, job_id, run_dir)
    out = slurm_output(run_dir, job_id)
    assert state["JobState"] == "COMPLETED", out[-3000:]
    assert f"launcher-test: key of {len(secrets['WANDB_API_KEY'])} chars" in out
    assert any("launcher-secrets-test" in text for text in listed), listed  # the comment, seen
    for text in listed:
        assert not any(value in text for value in secrets.values()), text
    workers = {pid: v for pid, v in seen.items() if pid in rank_pids}
    assert len(workers) >= 2, seen  # the two ranks were read while they ran
    agents = [v[0] for v in seen.values() if v[0].startswith("python -m launcher.torchrun")]
    ports = {int(p) for a in agents for p in re.findall(r"--rdzv-endpoint=n1:(\d+)", a)}
    assert len(ports) == 1 and 12000 <= ports.pop() <= 12999, agents
    for cmdline, _ in seen.values():  # the batch shell, srun, torchrun, ranks, loaders
        assert not any(value in cmdline for value in secrets.values()), cmdline
    for cmdline, environ in workers.values():
        assert "trainer.max_steps" not in cmdline and "run.id" not in cmdline, cmdline
        for name, value in secrets.items():
            assert f"{name}={value}" in environ.splitlines()  # inherited
    for path in run_dir.rglob("*"):  # the submit folder and Slurm's output file among them
        if path.is_file():
            text = path.read_bytes()
            assert not any(v.encode() in text for v in secrets.values()), path
    for path in (run_dir / "submit").iterdir():
        if path.suffix in (".sbatch", ".json"):
            assert path.stat().st_mode & 0o777 == 0o600, path
    assert run_dir.stat().st_mode & 0o777 == 0o700
    assert not readable_by_nobody(run_dir / "submit" / f"slurm-{job_id}.out")
    assert summary(run_dir)["steps"] == 12


@pytest.mark.parametrize(
    "override, words",
    [
        (
            "cluster.setup=['export HF_TOKEN=hf_aZ3kq9Xw7Lm2Pv8Rt5Yb1Nc4']",
            "error: cluster.setup[0] holds a secret, a token of a known kind (hf_...)",
        ),
        (
            "cluster.slurm.extra_sbatch=['--comment=password=hunter2']",
            "error: cluster.slurm.extra_sbatch[0] holds a secret, password=... (a secret's name)",
        ),
        (
            f"cluster.setup=[\"export WANDB_API_KEY='{KEY}'\"]",
            "error: cluster.setup[0] holds a secret, WANDB_API_KEY=... (a secret's name)",
        ),
        (
            f'cluster.setup=["wandb login {KEY}"]',
            "error: cluster.setup[0] holds a secret, `wandb login KEY`",
        ),
        (
            f"cluster.slurm.extra_sbatch=[\"--comment='{KEY}'\"]",
            "error: cluster.slurm.extra_sbatch[0] holds a secret, comment=...",
        ),
        (f"cluster.job_name=j{KEY}", "error: cluster.job_name holds a secret, a run of 40 hex"),
        (
            "cluster.slurm.mem_per_process=64T",
            "is more than partition debug can give 2 node(s)",
        ),
        (
            "cluster.nodes=2",
            "error: cluster.nodes=2: partition debug has 1 node(s) besides the ones this run "
            "keeps off (n1,",
        ),
    ],
    ids=[
        "setup-secret",
        "sbatch-secret",
        "quoted-key",
        "wandb-login",
        "comment-key",
        "job-name-key",
        "memory",
        "burnin-too-few",
    ],
)
def test_refused_before_sbatch(cluster, tmp_path, capfd, monkeypatch, override, words):
    """A secret in a setup line or an sbatch option, a --mem no node of the partition has,
    and (the run's burn-in gate having refused n1 earlier) more nodes than the partition has
    without it: one line, exit 2, nothing queued, no secret written anywhere."""
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))  # submit runs in this process
    if override == "cluster.nodes=2":
        (tmp_path / "refused").mkdir()
        (tmp_path / "refused" / "bad_hosts").write_text("n1\n")
    before = queued(cluster)
    args = [*SHAPE, *SHORT, f"run.root={tmp_path}", "run.id=refused", override]
    code = submit_main(["slurm", *args])
    err = capfd.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and words in err[0], err
    assert "aZ3kq9" not in err[0] and "hunter2" not in err[0] and KEY not in err[0]
    assert queued(cluster) == before
    leftovers = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert all(b"aZ3kq9" not in p.read_bytes() and KEY.encode() not in p.read_bytes()
               for p in leftovers)  # fmt: skip


def test_a_failed_setup_line_ends_the_job_naming_it(cluster, tmp_path):
    """`module` is not installed here, as on a cluster without Lmod for this shell: the
    job ends at that line with exit code 2, before any training, and is not requeued."""
    job_id, run_dir = submit(
        cluster,
        tmp_path,
        "badsetup",
        "cluster.slurm.modules=[cuda/12.4]",
        "cluster.setup=[echo after]",
        run=SHORT,
    )
    state = wait_until_done(cluster, job_id, run_dir)
    out = slurm_output(run_dir, job_id)
    assert (state["JobState"], state["ExitCode"], state["Restarts"]) == ("FAILED", "2:0", "0")
    assert (
        "launcher: setup failed: `module load cuda/12.4` exited 127; the job ends before "
        "training (fix cluster.setup, cluster.slurm.modules or cluster.slurm.venv)"
    ) in out, out
    assert "after" not in out.split("setup failed")[1] and "training ended" not in out
    assert not (run_dir / "metrics.jsonl").exists()
    assert "requeueing" not in out and "not requeued" not in out


def test_a_container_job_without_pyxis_is_refused_before_sbatch(cluster, tmp_path, capfd):
    """This cluster has no pyxis: srun would refuse --container-image after the queue
    wait. submit asks `srun --help` first and submits nothing."""
    before = queued(cluster)
    cmd = [sys.executable, "-m", "launcher.submit", "slurm", *SHAPE, *SHORT]
    cmd += [f"run.root={tmp_path}", "run.id=pyxis", "cluster.slurm.container_image=ubuntu:24.04"]
    proc = subprocess.run(cmd, env=cluster.env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    err = proc.stderr.strip().splitlines()
    assert err == [
        "error: cluster.slurm.container_image needs the pyxis plugin, but this cluster's srun "
        "has no --container-image (`srun --help`); ask your admins for pyxis and enroot, or "
        "leave container_image=null and use cluster.slurm.modules or venv"
    ]
    assert queued(cluster) == before


def test_a_node_the_burn_in_gate_refuses_is_excluded_on_the_one_requeue(cluster, tmp_path):
    """One node x 2 ranks, rank 0 slowed in the burn-in gate (once: the fault marks itself
    fired): the gate refuses, the job exits 6 (bad node) before any step, the batch script
    adds the host to the job's excluded nodes and requeues it once; the requeued start runs
    on the other node, passes the gate and trains. Needs launcher.torchrun (exit 6)."""
    job_id, run_dir = submit(
        cluster,
        tmp_path,
        "badnode",
        "cluster.nodes=1",
        "cluster.procs_per_node=2",
        "burnin.action=refuse",
        "burnin.tolerance=3",
        "fault.kind=slow_device",
        "fault.rank=0",
        "fault.seconds=0.2",
        run=[*SHORT, "trainer.max_steps=4"],
    )
    state = wait_until_done(cluster, job_id, run_dir)
    out = slurm_output(run_dir, job_id)
    assert (state["JobState"], state["Restarts"]) == ("COMPLETED", "1"), out[-4000:]
    assert state["ExcNodeList"] == "n1" and state["NodeList"] == "n2"  # scontrol's own view
    assert (
        "launcher: training ended with exit code 6 (bad node: the burn-in gate refused n1)" in out
    )
    assert f"launcher: requeueing job {job_id} once after the burn-in gate refused a node, " \
        f"without the node(s) in {run_dir}/bad_hosts: --exclude=n1" in out  # fmt: skip
    assert re.search(r"burn-in: slower than the others .*: rank 0 on n1: matmul", out)
    assert f"launcher: job {job_id}, start 1, nodes n2" in out
    assert bad_hosts.read(run_dir) == ["n1"]
    assert bad_hosts.reasons(run_dir)["n1"].startswith("burn-in: rank 0: matmul")
    assert json.loads((run_dir / "burnin.json").read_text())["verdict"] == "pass"  # on n2
    assert summary(run_dir)["status"] == "completed"
