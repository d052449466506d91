"""What every object of one Kubernetes job shares, whatever its kind: the name, the labels
and metadata, the deadline and the restart budget."""

from __future__ import annotations

from launcher.submit.job import DEFAULT_JOB_NAME, SubmitJob, time_limit_s

# The label the Service and the topology spread select the job's pods by.
INSTANCE_LABEL = "app.kubernetes.io/instance"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
VOLCANO_MIN_MEMBER = "scheduling.volcano.sh/group-min-member"  # on the Job (Volcano >= 1.12)


def name_of(job: SubmitJob) -> str:
    """The objects' name: cluster.k8s.name, else <cluster.job_name or launcher>-<run id>."""
    k = job.cluster.k8s
    return str(k.name or f"{job.cluster.job_name or DEFAULT_JOB_NAME}-{job.run_id}")


def metadata(job: SubmitJob, name: str | None = None, component: str = "trainer") -> dict:
    """The workload's metadata: its labels, and Kueue's queue label with gang=kueue."""
    meta: dict = {"name": name or name_of(job)}
    if job.cluster.k8s.namespace:
        meta["namespace"] = str(job.cluster.k8s.namespace)
    meta["labels"] = labels(job, component)
    return meta


def workload_metadata(job: SubmitJob) -> dict:
    meta = metadata(job)
    k = job.cluster.k8s
    if k.gang == "kueue":
        meta["labels"][KUEUE_QUEUE_LABEL] = str(k.queue)
    return meta


def labels(job: SubmitJob, component: str = "trainer") -> dict[str, str]:
    """User labels, then the recommended app.kubernetes.io ones (the Service selects the
    pods by the instance label)."""
    own = {
        "app.kubernetes.io/name": "launcher",
        INSTANCE_LABEL: name_of(job),
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": "launcher",
    }
    return {**{str(k): str(v) for k, v in job.cluster.k8s.labels.items()}, **own}


def restart_budget(job: SubmitJob) -> int:
    """Whole-job restarts (JobSet, PyTorchJob): the per-node budget times the nodes, as a
    plain Job's per-index limits add up."""
    return int(job.cluster.k8s.backoff_limit_per_node) * job.nodes


def deadline_s(job: SubmitJob) -> int | None:
    """cluster.time_limit in seconds, for activeDeadlineSeconds."""
    limit = job.cluster.time_limit
    return time_limit_s(str(limit)) if limit is not None else None
