"""A rendered job's setup run for real: a failing setup line, `module` or venv ends the job at
once naming it; the manifests need Kubernetes 1.29 as the refusal says; the sbatch script's
ending decides every exit code of the contract (what it says, whether it requeues)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from launcher.resilience import bad_hosts, exit_codes

from submit_render import render, slurm_stand_ins


def setup_part(script: str) -> str:
    """The rendered script from its setup function to the first export: what runs before
    training, runnable outside Slurm."""
    start = script.index("setup_failed() {")
    return script[start : script.index("\nexport ", start)]


def test_a_failing_setup_line_ends_the_job_at_once_naming_it(tmp_path):
    lines = ["echo one # a comment", "nosuchcommand-xyz --flag", "echo three"]
    quoted = ", ".join(f'"{line}"' for line in lines)
    script = render("slurm", tmp_path, f"cluster.setup=[{quoted}]")["job.sbatch"]
    proc = subprocess.run(["bash", "-c", setup_part(script)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stdout.splitlines() == [
        "one",
        "launcher: setup failed: `nosuchcommand-xyz --flag` exited 127; the job ends before "
        "training (fix cluster.setup, cluster.slurm.modules or cluster.slurm.venv)",
    ]
    assert "command not found" in proc.stderr
    ok = render("slurm", tmp_path, 'cluster.setup=["export A=1 && echo $A", "sleep 0 &"]',
                run_id="ok")["job.sbatch"]  # fmt: skip
    proc = subprocess.run(["bash", "-c", setup_part(ok)], capture_output=True, text=True)
    assert (proc.returncode, proc.stdout) == (0, "1\n")


def test_setup_modules_and_venv_each_fail_the_job(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("return 0\n")
    script = render(
        "slurm", tmp_path, "cluster.slurm.modules=[cuda/12.4]", f"cluster.slurm.venv={venv}"
    )
    proc = subprocess.run(
        ["bash", "-c", setup_part(script["job.sbatch"])], capture_output=True, text=True
    )
    assert proc.returncode == 2  # no `module` command here
    assert "launcher: setup failed: `module load cuda/12.4` exited 127" in proc.stdout


def test_the_manifests_need_kubernetes_1_29_as_the_refusal_says(tmp_path):
    """kubernetes-validate's own schemas: the rendered Job passes 1.29 and fails 1.28
    (podFailurePolicy rules need onPodConditions there, and backoffLimitPerIndex is new),
    which is why an older cluster.k8s.version is refused."""
    files = render("k8s", tmp_path, "cluster.k8s.version=1.29")
    job = tmp_path / "job.yaml"
    job.write_text(files["job.yaml"])
    tool = Path(sys.executable).parent / "kubernetes-validate"
    run = [str(tool), "--strict", "-k"]
    new = subprocess.run([*run, "1.29.0", str(job)], capture_output=True, text=True)
    old = subprocess.run([*run, "1.28.0", str(job)], capture_output=True, text=True)
    assert new.returncode == 0, new.stdout + new.stderr
    assert old.returncode != 0 and "onPodConditions" in old.stdout + old.stderr


# code: (requeued after Slurm's warning (USR1), requeued without one), when the start
# advanced the checkpoint: a stop without a checkpoint (7) is requeued like one with (143)
REQUEUED = {
    exit_codes.DONE: (False, False),
    exit_codes.CRASH: (True, False),
    exit_codes.BAD_INPUT: (False, False),
    exit_codes.NONFINITE: (False, False),
    exit_codes.OOM: (False, False),
    exit_codes.HANG: (True, True),
    exit_codes.BAD_NODE: (True, False),  # no bad_hosts here; with them, once elsewhere
    exit_codes.STOPPED_NO_CHECKPOINT: (True, False),
    exit_codes.NODE_LOST: (True, True),  # a node lost is requeued whether or not it advanced
    exit_codes.STOPPED: (True, False),
}
SLURM_STUBS = """
scontrol() { echo "scontrol $*" >> "$run_dir/calls"; }
checkpoints() { cat "$run_dir/reached"; }
SLURM_JOB_ID=9
restart=0
started_at=step_00000002
"""


def ending(script: str, run_dir: Path, code: int, stop: str) -> subprocess.CompletedProcess:
    """The rendered script from its `case` on the step's exit code to its end: what it says
    and whether it requeues."""
    tail = script[script.index('  case "$code" in') :]
    head = f"{SLURM_STUBS}run_dir={run_dir}\ncode={code}\nstop={stop}\nif true; then\n"
    return subprocess.run(["bash", "-c", head + tail], capture_output=True, text=True)


def test_the_sbatch_script_decides_every_exit_code(tmp_path):
    assert sorted(REQUEUED) == sorted(exit_codes.MEANING)
    script = render("slurm", tmp_path)["job.sbatch"]
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "logs" / "rank0.log").write_text("")
    for code, expected in REQUEUED.items():
        for stop, requeued in zip(("USR1", '""'), expected, strict=True):
            (run_dir / "reached").write_text("step_00000004\n")  # this start advanced it
            (run_dir / "calls").unlink(missing_ok=True)
            proc = ending(script, run_dir, code, stop)
            said = f"(code {code}, stop {stop}): {proc.stdout}{proc.stderr}"
            assert f"launcher: training ended with exit code {code} (" in proc.stdout, said
            assert ("requeueing job 9" in proc.stdout) == requeued, said
            assert proc.returncode == (0 if requeued else code), said
            assert (run_dir / "calls").exists() == requeued, said
    for code in (exit_codes.STOPPED_NO_CHECKPOINT, exit_codes.STOPPED):  # no progress made
        (run_dir / "reached").write_text("step_00000002\n")
        proc = ending(script, run_dir, code, "USR1")
        assert "not requeued: no newer checkpoint was completed" in proc.stdout, proc.stdout
        assert proc.returncode == code


@pytest.mark.parametrize("code", [exit_codes.HANG, exit_codes.NODE_LOST])
def test_every_requeue_keeps_the_runs_bad_hosts_out(tmp_path, code):
    """A hang (its culprit's host) and a lost node requeue the job with the run's bad_hosts
    added to its excluded nodes; when the partition would have too few nodes left, one line
    says so and the script ends with the job's code (no job pending for ever)."""
    script = render("slurm", tmp_path, "cluster.nodes=2")["job.sbatch"]
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "reached").write_text("step_00000004\n")
    bad_hosts.record(run_dir, {"n2": "hang: rank 9 wrote no stacks (after step 3)"})
    tail = script[script.index('  case "$code" in') :]
    stand_ins = slurm_stand_ins(["n1", "n2", "n3"])
    head = f"{SLURM_STUBS}{stand_ins}EXCLUDED='(null)'\nrun_dir={run_dir}\ncode={code}\nstop=\n"
    head += "if true; then\n"
    proc = subprocess.run(["bash", "-c", head + tail], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"without the node(s) in {run_dir}/bad_hosts: --exclude=n2" in proc.stdout
    assert (run_dir / "calls").read_text().splitlines() == [
        "requeuehold 9",
        "update JobId=9 ExcNodeList=n2",
        "release 9",
    ]
    bad_hosts.record(run_dir, {"n3": "device error: rank 4 at step 7: RuntimeError: ECC"})
    (run_dir / "calls").unlink()
    proc = subprocess.run(["bash", "-c", head + tail], capture_output=True, text=True)
    assert proc.returncode == code, proc.stdout + proc.stderr
    (line,) = [ln for ln in proc.stdout.splitlines() if "not requeued" in ln]
    assert "this run keeps off (n2,n3;" in line and "has 1 node(s) and the job needs 2" in line
    assert not (run_dir / "calls").exists()
