"""What the cluster itself is asked before `sbatch`, so that a job that could only pend for
ever or fail after the queue wait is refused in one line now: the partition's nodes and their
memory (`sinfo`), reserved ports (`scontrol show config`), the pyxis plugin (`srun --help`);
and Slurm's own rejection said as one line."""

from __future__ import annotations

import re
import shutil
import subprocess

from launcher.config import ConfigError
from launcher.resilience import bad_hosts
from launcher.submit.job import SubmitJob
from launcher.submit.slurm.resources import MIB, mem_option, slurm_bytes

# pyxis (NVIDIA's SPANK plugin) adds this option to srun; without it srun refuses the job.
PYXIS_OPTION = "--container-image"


def check_partition(job: SubmitJob) -> None:
    """The partition must hold cluster.nodes nodes that are not excluded (the burn-in
    gate's refusals) and have the memory --mem asks for (`sinfo`: each node's RealMemory);
    otherwise the job would pend for ever. One line naming the figures and the keys."""
    s = job.cluster.slurm
    where = ["-p", str(s.partition)] if s.partition else []
    proc = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N %m %P", *where], capture_output=True, text=True
    )
    rows = [ln.split() for ln in proc.stdout.splitlines() if len(ln.split()) == 3]
    if not s.partition:
        rows = [r for r in rows if r[2].endswith("*")]  # the default partition
    nodes = {r[0]: int(r[1].rstrip("+")) for r in rows if r[1].rstrip("+").isdigit()}
    if proc.returncode != 0 or not nodes:
        return  # sbatch names the partition problem itself
    name = s.partition or next(iter(rows))[2].rstrip("*")
    refused = set(bad_hosts.read(job.run_dir))
    usable = {n: m for n, m in nodes.items() if n not in refused}
    if len(usable) < job.nodes:
        raise ConfigError(
            f"cluster.nodes={job.nodes}: partition {name} has {len(usable)} node(s) besides "
            f"the ones this run keeps off ({', '.join(sorted(refused))}, "
            f"{job.run_dir / bad_hosts.FILE}); fix or replace those nodes, or lower cluster.nodes"
        )
    mem = mem_option(job)
    if mem == "0":
        return
    need = -(-slurm_bytes(mem, "cluster.slurm.mem") // MIB)
    fits = sorted(m for m in usable.values() if m >= need)
    if len(fits) < job.nodes:
        raise ConfigError(
            f"--mem={mem} ({need} MiB per node) is more than partition {name} can give "
            f"{job.nodes} node(s) (largest: {max(usable.values())} MiB): lower "
            "cluster.slurm.mem_per_process or data.num_workers, set cluster.slurm.mem, or "
            "use cluster.slurm.exclusive=true (--mem=0: whole nodes)"
        )


def check_resv_ports() -> None:
    """srun --resv-ports needs a port range in MpiParams; without one the step fails after
    the queue wait."""
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True)
    if not re.search(r"^MpiParams\s*=.*\bports=\d", config.stdout, re.MULTILINE):
        raise ConfigError(
            "cluster.slurm.resv_ports=true, but this cluster reserves no ports (no "
            "MpiParams=ports=<range> in `scontrol show config`); leave resv_ports=false, or "
            "ask your admins for a port range"
        )


def check_pyxis() -> None:
    """Containers need pyxis on the nodes; without it srun refuses the option after the
    queue wait. The plugin adds its options to `srun --help`, so ask that here."""
    srun = shutil.which("srun")
    found = (
        srun
        and PYXIS_OPTION in subprocess.run([srun, "--help"], capture_output=True, text=True).stdout
    )
    if not found:
        raise ConfigError(
            "cluster.slurm.container_image needs the pyxis plugin, but this cluster's srun "
            f"has no {PYXIS_OPTION} (`srun --help`); ask your admins for pyxis and enroot, "
            "or leave container_image=null and use cluster.slurm.modules or venv"
        )


def slurm_error(stderr: str) -> str:
    """Slurm's error lines, without their `sbatch: error:` prefixes, as one line."""
    lines = [ln.split("error:", 1)[1].strip() for ln in stderr.splitlines() if "error:" in ln]
    unique = list(dict.fromkeys(ln for ln in lines if ln))
    return "; ".join(unique) or " ".join(stderr.split()) or "no reason given"
