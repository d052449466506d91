"""The sbatch script's requeue that keeps a run's bad hosts out (docs/slurm.md, "Requeue").

Whatever requeues the job (a preemption, a hang, a lost node, the burn-in gate's refusal), the
hosts of the run directory's `bad_hosts` (launcher.resilience.bad_hosts: burn-in refusals,
hang culprits, device errors, persistent stragglers) are added to the job's excluded nodes
first. Slurm changes a job's ExcNodeList only while it is pending, hence requeuehold, update,
release; the TERM that the requeue sends the batch shell is not Slurm ending the job, so it is
ignored then. When the partition would have fewer nodes left than the job needs, the job
would pend for ever (BadConstraints): it is not requeued, one line names the hosts, and the
script ends with the job's code.
"""

from __future__ import annotations

from launcher.resilience import bad_hosts

FUNCTION = "requeue_without_bad_hosts"
# The hosts of bad_hosts as one comma list (each line: the host, then why).
HOSTS = f'cut -d" " -f1 "$run_dir"/{bad_hosts.FILE} 2>/dev/null | paste -sd, -'


def function(nodes: int) -> list[str]:
    """The shell function `requeue_without_bad_hosts TAIL` for a job of `nodes` nodes: it
    requeues (and exits 0), or says why not and returns. TAIL follows "requeueing job <id>"
    in the line it says (" (preemption); it resumes from step_00000040")."""
    where = f"$run_dir/{bad_hosts.FILE}"
    return [
        "# Requeue this job, the run's bad hosts added to its excluded nodes (docs/slurm.md).",
        f"{FUNCTION}() {{",
        "  local bad excluded exclude left",
        f"  bad=$({HOSTS})",
        '  if [ -z "$bad" ]; then',
        '    echo "launcher: requeueing job $SLURM_JOB_ID$1"',
        '    scontrol requeue "$SLURM_JOB_ID"',
        "    exit 0",
        "  fi",
        '  excluded=$(scontrol -o show job "$SLURM_JOB_ID" | grep -o "ExcNodeList=[^ ]*" '
        "| cut -d= -f2)",
        '  [ "$excluded" = "(null)" ] && excluded=""',
        '  exclude=$({ [ -n "$excluded" ] && scontrol show hostnames "$excluded"; '
        'scontrol show hostnames "$bad"; } | sort -u | paste -sd, -)',
        '  left=$(sinfo -h -N -p "$SLURM_JOB_PARTITION" -o %N | sort -u '
        '| grep -vxF -f <(tr , "\\n" <<< "$exclude") | wc -l)',
        f'  if [ "$left" -lt {nodes} ]; then',
        f'    echo "launcher: not requeued: without the node(s) this run keeps off '
        f"($exclude; {where}) partition $SLURM_JOB_PARTITION has $left node(s) and the job "
        f'needs {nodes}; fix or replace those nodes, or lower cluster.nodes"',
        "    return",
        "  fi",
        f'  echo "launcher: requeueing job $SLURM_JOB_ID$1, without the node(s) in {where}: '
        '--exclude=$exclude"',
        '  trap "" TERM',
        '  scontrol requeuehold "$SLURM_JOB_ID" && scontrol update JobId="$SLURM_JOB_ID" '
        'ExcNodeList="$exclude" && scontrol release "$SLURM_JOB_ID"',
        "  exit 0",
        "}",
    ]
