"""`cluster.k8s.kind=trainjob`: Kubeflow Trainer v2's TrainJob.

A TrainJob names a torch runtime (cluster.k8s.runtime), whose JobSet has one replicated Job
`node` with one container `node`; the pod's fields a TrainJob may set go into a runtime
patch (the runtime sets the rest: see docs/kubernetes.md). Its pods are an Indexed Job's,
in a JobSet: they rendezvous as a JobSet's do.
"""

from __future__ import annotations

from launcher.config import ConfigError
from launcher.submit.job import SubmitJob
from launcher.submit.k8s import jobset
from launcher.submit.k8s.kind import Kind
from launcher.submit.k8s.names import deadline_s, workload_metadata
from launcher.submit.k8s_check import Expect, check_endpoint, check_pod, named, the

TRAINJOB_CONTAINER = "node"
TRAINJOB_MANAGER = "launcher"
TRAINJOB_TRAINER = ("image", "command", "args", "env")
TRAINJOB_CONTAINER_PATCH = ("volumeMounts", "securityContext")
TRAINJOB_POD_PATCH = (
    "affinity",
    "imagePullSecrets",
    "nodeSelector",
    "securityContext",
    "serviceAccountName",
    "terminationGracePeriodSeconds",
    "tolerations",
    "volumes",
)


def needs(job: SubmitJob) -> list[str]:
    k = job.cluster.k8s
    return [
        f"needs: Kubeflow Trainer 2.2 or later with the torch runtime {k.runtime} "
        "(cluster.k8s.runtime); its pod template must set automountServiceAccountToken "
        "and enableServiceLinks to false, which a TrainJob cannot patch"
    ]


def uncarried(job: SubmitJob) -> list[tuple[str, object, str]]:
    """(key, value, what it sets) of each setting given that a TrainJob cannot carry: its
    trainer takes only TRAINJOB_TRAINER and resources, its runtime patch only the fields of
    TRAINJOB_POD_PATCH and TRAINJOB_CONTAINER_PATCH (Kubeflow Trainer 2.3's schema); the
    rest is the runtime's."""
    k, c = job.cluster.k8s, job.cluster
    given = [
        ("cluster.k8s.priority_class", k.priority_class, "the pods' priorityClassName"),
        ("cluster.k8s.topology_spread_key", k.topology_spread_key,
         "the pods' topologySpreadConstraints"),
        ("cluster.k8s.ttl_after_finished_s", k.ttl_after_finished_s,
         "the JobSet's ttlSecondsAfterFinished"),
        ("cluster.k8s.image_pull_policy", k.image_pull_policy, "the container's imagePullPolicy"),
        ("cluster.workdir", c.workdir, "the container's workingDir"),
        ("cluster.k8s.gang", "volcano" if k.gang == "volcano" else None,
         "the pods' schedulerName (Volcano: the runtime's podGroupPolicy)"),
    ]  # fmt: skip
    return [(key, value, what) for key, value, what in given if value is not None]


def check(job: SubmitJob) -> None:
    """A setting a TrainJob would drop without a word is refused in one line instead."""
    for key, value, what in uncarried(job):
        raise ConfigError(
            f"{key}={value}: a TrainJob cannot set {what} (its runtime patch takes "
            f"{', '.join(TRAINJOB_POD_PATCH)}); set it in the runtime "
            f"{job.cluster.k8s.runtime} (cluster.k8s.runtime), leave it unset, or use "
            "cluster.k8s.kind=jobset"
        )


def trainjob(job: SubmitJob, pod: dict) -> dict:
    """Kubeflow Trainer v2's TrainJob on the torch runtime cluster.k8s.runtime: the
    container's image, command, arguments, environment and resources as the trainer's,
    numNodes nodes, and the pod's other fields (volumes, /dev/shm, security, placement) as a
    runtime patch. Restarts and failures follow the runtime's JobSet failure policy. A
    setting it cannot carry is refused (`check`), never dropped."""
    check(job)
    k = job.cluster.k8s
    container = pod["spec"]["containers"][0]
    trainer = {key: container[key] for key in TRAINJOB_TRAINER if key in container}
    trainer["numNodes"] = job.nodes
    trainer["resourcesPerNode"] = container["resources"]
    patch_container = {"name": TRAINJOB_CONTAINER}
    patch_container.update({f: container[f] for f in TRAINJOB_CONTAINER_PATCH if f in container})
    pod_spec = {key: pod["spec"][key] for key in TRAINJOB_POD_PATCH if key in pod["spec"]}
    pod_spec["containers"] = [patch_container]
    node = {"metadata": pod["metadata"], "spec": pod_spec}
    replicated = {"name": jobset.JOBSET_REPLICATED_JOB, "template": {"spec": {"template": node}}}
    spec: dict = {"runtimeRef": {"name": str(k.runtime)}}
    if k.gang == "kueue":
        spec["suspend"] = True
    deadline = deadline_s(job)
    if deadline:
        spec["activeDeadlineSeconds"] = deadline
    spec["trainer"] = trainer
    spec["runtimePatches"] = [
        {
            "manager": TRAINJOB_MANAGER,
            "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [replicated]}}},
        }
    ]
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": workload_metadata(job),
        "spec": spec,
    }


def check_workload(objects: list[dict], expect: Expect) -> None:
    """The pod a TrainJob's node runs, as its trainer and its runtime patch make it up
    (the runtime adds the rest), checked as any other kind's."""
    tj = the(objects, "TrainJob")
    spec = tj["spec"]
    trainer = spec.get("trainer") or {}
    if trainer.get("numNodes") != expect.nodes:
        raise ConfigError(
            f"{named(tj)}: spec.trainer.numNodes={trainer.get('numNodes')!r}, expected "
            f"{expect.nodes} (cluster.nodes)"
        )
    patches = spec.get("runtimePatches") or []
    path = "spec.runtimePatches[0].trainingRuntimeSpec.template.spec.replicatedJobs[0]"
    try:
        rjob = patches[0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
        pod = rjob["template"]["spec"]["template"]
    except (IndexError, KeyError):
        raise ConfigError(f"{named(tj)}: {path}.template.spec.template is missing") from None
    container = {**pod["spec"]["containers"][0], **trainer}
    container["resources"] = trainer.get("resourcesPerNode") or {}
    merged = {**pod, "spec": {**pod["spec"], "containers": [container]}}
    check_pod(tj, merged, f"{path}.template.spec.template", expect, None)
    name = tj["metadata"]["name"]
    check_endpoint(tj, merged, path, f"{name}-{rjob['name']}-0-0.{name}", expect)


KIND = Kind(
    name="trainjob",
    endpoint=jobset.endpoint,
    objects=lambda job, pod: [("trainjob.yaml", trainjob(job, pod))],
    check=check_workload,
    container=TRAINJOB_CONTAINER,
    needs=needs,
)
