"""The rendered script handed to `sbatch`, once the cluster has been asked what it can give
(launcher.submit.slurm.probes) and the submitting shell holds the secrets the job takes from
it by name."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from launcher.config import ConfigError
from launcher.submit.job import SubmitJob
from launcher.submit.slurm.probes import (
    check_partition,
    check_pyxis,
    check_resv_ports,
    slurm_error,
)
from launcher.submit.slurm.script import OUTPUT, export_names


def submit(job: SubmitJob, paths: list[Path]) -> str:
    """`sbatch` the script; what the partition cannot give, and Slurm's rejection (a missing
    partition...), become one line. --export on the command line, which SBATCH_EXPORT in
    the submitting shell cannot override as it does an #SBATCH line."""
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise ConfigError(
            "sbatch not found: submit from a machine with the Slurm client, or use --dry-run "
            f"and run `sbatch {paths[0]}` there"
        )
    s = job.cluster.slurm
    if s.container_image is not None and s.container_runtime == "pyxis":
        check_pyxis()
    check_secrets_set(job, dict(os.environ))
    check_partition(job)
    if s.resv_ports:
        check_resv_ports()
    export = f"--export={','.join(export_names(job, dict(os.environ)))}"
    proc = subprocess.run(
        [sbatch, "--parsable", export, str(paths[0])], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise ConfigError(f"sbatch rejected the job: {slurm_error(proc.stderr)}")
    job_id = proc.stdout.strip().split(";")[0]
    output = job.submit_dir / OUTPUT.replace("%j", job_id)
    return f"submitted Slurm job {job_id}; run dir {job.run_dir}; Slurm output {output}"


def check_secrets_set(job: SubmitJob, environ: dict[str, str]) -> None:
    """Each of cluster.secrets is set in the submitting shell, which the job takes it from:
    a job started without one fails at its first use, after the queue wait."""
    unset = [str(n) for n in job.cluster.secrets if not environ.get(str(n))]
    if unset:
        raise ConfigError(
            f"cluster.secrets names {', '.join(unset)}, which this shell does not set; export "
            f"{'it' if len(unset) == 1 else 'them'} before submitting (the job takes "
            "cluster.secrets from the submitting shell by name)"
        )
