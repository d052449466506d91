"""The experiment as an sbatch script: `python -m launcher.submit slurm` renders it
(`render`), checks it and hands it to `sbatch` (`submit`); the `launcher.renderers` entry
point `slurm` names this package. One concern a module: the script (`script`), what it asks
of the cluster, checked before it is written (`resources`), what the cluster is asked before
`sbatch` (`probes`), the submission (`submitter`), and the requeue that keeps a run's bad
hosts out (`exclude`).

A checkpoint-and-requeue runs when Slurm warns of a preemption (always) or of the time limit,
or the trainer detects a hang (for as long as each start advances the checkpoint), at most
cluster.slurm.max_requeues times. Nothing secret is written into the script: the job gets
the submitting shell's variables by name (--export), the trainer's overrides through a 0600
file rather than the ranks' command lines, and --mem is the node's need as a pod's memory
request is (node_memory). docs/slurm.md explains the choices (the signal path above all).
"""

from __future__ import annotations

from omegaconf import DictConfig

from launcher.submit import stop_time
from launcher.submit.slurm.resources import cpus_per_task, job_memory, slurm_bytes
from launcher.submit.slurm.script import EXAMPLE_OVERRIDES, SCRIPT, render, render_example
from launcher.submit.slurm.submitter import check_secrets_set, submit

# What the launcher (submit, rehearse) and the tests reach through this package.
__all__ = [
    "EXAMPLE_OVERRIDES",
    "SCRIPT",
    "check_secrets_set",
    "cpus_per_task",
    "job_memory",
    "rehearse",
    "render",
    "render_example",
    "slurm_bytes",
    "submit",
]


def rehearse(seen, s: DictConfig, key: str, write: stop_time.WriteTime) -> None:
    """launcher.rehearse's cluster case: the signal lead holds the stop checkpoint's write,
    and a preempted job is requeued, a limited number of times."""
    seen.ok(
        f"signal_lead_s={s.signal_lead_s} holds the {write.seconds:.1f} s "
        f"stop checkpoint ({write.why})"
    )
    seen.require(bool(s.requeue), f"{key}.requeue=false: a preempted job is not requeued")
    seen.require(s.max_requeues is not None,
                 f"{key}.max_requeues=null: a failing job requeues forever")  # fmt: skip
    seen.ok(f"requeue limited to {s.max_requeues}")
