"""`cluster.k8s.kind=pytorchjob`: Kubeflow's PyTorchJob, a Master and nodes-1 Workers."""

from __future__ import annotations

import copy

from launcher.config import ConfigError
from launcher.submit.job import SubmitJob
from launcher.submit.k8s.kind import Kind
from launcher.submit.k8s.names import deadline_s, name_of, restart_budget, workload_metadata
from launcher.submit.k8s_check import Expect, check_endpoint, check_pod, named, the

PYTORCHJOB_PORT_NAME = "pytorchjob-port"  # the port the training operator's Services expose


def pytorchjob(job: SubmitJob, pod: dict) -> dict:
    """Kubeflow's PyTorchJob: a Master and nodes-1 Workers, each with its own Service made
    by the training operator. restartPolicy ExitCode: the operator restarts a pod that exited
    with 128 or more (a signal, and the 143 of a checkpointed stop) and fails the job on
    1-127, so bad input, a non-finite loss and out of memory (2, 3, 4), but also a crash (1),
    a hang (5) and a stop without a checkpoint (7), end it without a retry."""
    k = job.cluster.k8s
    # Running: when the job ends (a failure included), the pods still running are deleted,
    # so no Worker holds its GPUs; the finished ones stay for their logs.
    run_policy: dict = {"backoffLimit": restart_budget(job), "cleanPodPolicy": "Running"}
    deadline = deadline_s(job)
    if deadline:
        run_policy["activeDeadlineSeconds"] = deadline
    if k.ttl_after_finished_s is not None:
        run_policy["ttlSecondsAfterFinished"] = int(k.ttl_after_finished_s)
    if k.gang == "kueue":
        run_policy["suspend"] = True
    if k.gang == "volcano":
        policy: dict = {"minAvailable": job.nodes}
        if k.queue:
            policy["queue"] = str(k.queue)
        run_policy["schedulingPolicy"] = policy
    replicas = {"Master": {"replicas": 1, "restartPolicy": "ExitCode", "template": pod}}
    if job.nodes > 1:
        replicas["Worker"] = {
            "replicas": job.nodes - 1,
            "restartPolicy": "ExitCode",
            "template": copy.deepcopy(pod),  # a copy: YAML would write an anchor otherwise
        }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": workload_metadata(job),
        "spec": {"runPolicy": run_policy, "pytorchReplicaSpecs": replicas},
    }


def check_workload(objects: list[dict], expect: Expect) -> None:
    """A Master and nodes-1 Workers, each pod's training container named as the operator
    expects, every pod rendezvousing at the Master's Service."""
    ptj = the(objects, "PyTorchJob")
    replicas = ptj["spec"].get("pytorchReplicaSpecs") or {}
    name = ptj["metadata"]["name"]
    for role, count in {"Master": 1, "Worker": expect.nodes - 1}.items():
        got = (replicas.get(role) or {}).get("replicas", 0)
        if got != count:
            raise ConfigError(
                f"{named(ptj)}: spec.pytorchReplicaSpecs.{role}.replicas={got}, expected "
                f"{count} (cluster.nodes={expect.nodes})"
            )
    for role, rspec in replicas.items():
        path = f"spec.pytorchReplicaSpecs.{role}.template"
        pod = rspec["template"]
        check_pod(ptj, pod, path, expect, None)
        if pod["spec"]["containers"][0]["name"] != "pytorch":
            raise ConfigError(f"{named(ptj)}: {path}.spec.containers[0].name must be 'pytorch'")
        check_endpoint(ptj, pod, path, f"{name}-master-0", expect)


KIND = Kind(
    name="pytorchjob",
    endpoint=lambda job: f"{name_of(job)}-master-0:{job.cluster.rdzv_port}",
    objects=lambda job, pod: [("pytorchjob.yaml", pytorchjob(job, pod))],
    check=check_workload,
    node_rank="RANK",
    container="pytorch",
    port_name=PYTORCHJOB_PORT_NAME,
    pod_restart_policy=False,  # the operator sets it from the replica's restartPolicy
)
