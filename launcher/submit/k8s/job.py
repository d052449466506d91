"""`cluster.k8s.kind=job` (the default): an Indexed Job and a headless Service.

An Indexed Job with `spec.subdomain` gives pod <i> the hostname `<name>-<i>` and the DNS
name `<name>-<i>.<service>`, so every torchrun rendezvouses at `<name>-0.<service>:<port>`,
with its completion index as node rank. The Job's spec is also the one a JobSet replicates.
"""

from __future__ import annotations

import json
import subprocess

from launcher.config import ConfigError
from launcher.resilience import exit_codes
from launcher.submit.job import SubmitJob
from launcher.submit.k8s.kind import CONTAINER, Kind
from launcher.submit.k8s.names import (
    INSTANCE_LABEL,
    VOLCANO_MIN_MEMBER,
    deadline_s,
    metadata,
    name_of,
    workload_metadata,
)
from launcher.submit.k8s_check import (
    Expect,
    check_endpoint,
    check_indexed,
    check_pod,
    label,
    named,
    the,
)

# Exit codes that fail the whole job at once: retrying the same config cannot help.
FAIL_AT_ONCE = [exit_codes.BAD_INPUT, exit_codes.NONFINITE, exit_codes.OOM]


def endpoint(job: SubmitJob) -> str:
    name = name_of(job)
    return f"{name}-0.{name}:{job.cluster.rdzv_port}"


def objects(job: SubmitJob, pod: dict) -> list[tuple[str, dict]]:
    """The Service (named as the Job) before the Job whose pods need it."""
    service_name = name_of(job)
    pod["spec"] = {"subdomain": service_name, **pod["spec"]}
    return [("service.yaml", service(job, service_name)), ("job.yaml", indexed_job(job, pod))]


def remove(job: SubmitJob) -> list[str]:
    ns_flag = f" -n {job.cluster.k8s.namespace}" if job.cluster.k8s.namespace else ""
    return [
        f"remove: kubectl delete job,service{ns_flag} -l "
        f"{INSTANCE_LABEL}={name_of(job)} (submit makes the Job own the Service, "
        "so deleting the Job, or its ttlSecondsAfterFinished, removes both; applied "
        "with kubectl apply -f or a GitOps tool alone, the Service is not owned: delete "
        "it by that label, or use cluster.k8s.kind=jobset, whose controller owns it)"
    ]


def service(job: SubmitJob, service_name: str) -> dict:
    """Headless: DNS answers with each pod's own address, ready or not (rendezvous comes
    before readiness)."""
    port = int(job.cluster.rdzv_port)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(job, service_name, component="rendezvous"),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {INSTANCE_LABEL: name_of(job)},
            "ports": [{"name": "rdzv", "port": port, "targetPort": port}],
        },
    }


def pod_failure_policy() -> dict:
    """Fail at once on an exit code retrying cannot help (bad input, a non-finite loss, out
    of memory); a preempted, evicted or drained pod (DisruptionTarget) is replaced without
    being counted; anything else (a crash, a hang, a stop) counts against the budget."""
    return {
        "rules": [
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": CONTAINER,
                    "operator": "In",
                    "values": list(FAIL_AT_ONCE),
                },
            },
            {
                "action": "Ignore",
                "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
            },
        ]
    }


def job_spec(job: SubmitJob, pod: dict, restarts_owned_by_jobset: bool = False) -> dict:
    """An Indexed Job's spec: one pod per node, each replaced when it fails, within
    backoff_limit_per_node failures per index (maxFailedIndexes 0: one node out of budget
    ends the job). Inside a JobSet the JobSet owns the restarts: backoffLimit 0."""
    k = job.cluster.k8s
    spec: dict = {
        "completionMode": "Indexed",
        "completions": job.nodes,
        "parallelism": job.nodes,
    }
    if restarts_owned_by_jobset:
        spec["backoffLimit"] = 0
    else:
        spec["backoffLimitPerIndex"] = int(k.backoff_limit_per_node)
        spec["maxFailedIndexes"] = 0
    spec["podFailurePolicy"] = pod_failure_policy()
    deadline = deadline_s(job)
    if deadline:
        spec["activeDeadlineSeconds"] = deadline
    if k.ttl_after_finished_s is not None and not restarts_owned_by_jobset:
        spec["ttlSecondsAfterFinished"] = int(k.ttl_after_finished_s)  # a JobSet's: its own
    if k.gang == "kueue" and not restarts_owned_by_jobset:
        spec["suspend"] = True  # Kueue unsuspends it once the whole job is admitted
    spec["template"] = pod
    return spec


def indexed_job(job: SubmitJob, pod: dict) -> dict:
    meta = workload_metadata(job)
    if job.cluster.k8s.gang == "volcano":
        meta["annotations"] = {VOLCANO_MIN_MEMBER: str(job.nodes)}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": job_spec(job, pod)}


def service_owner_patch(job: SubmitJob, job_uid: str) -> dict:
    """A merge patch that makes the Job own its headless Service: deleting the Job (by
    hand or through ttlSecondsAfterFinished) then removes the Service too."""
    owner = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": name_of(job),
        "uid": job_uid,
        "blockOwnerDeletion": False,
        "controller": False,
    }
    return {"metadata": {"ownerReferences": [owner]}}


def own_service(kubectl: str, job: SubmitJob) -> str:
    """The owner reference needs the Job's uid, which exists only once the Job does."""
    ns = ["-n", str(job.cluster.k8s.namespace)] if job.cluster.k8s.namespace else []
    name = name_of(job)
    got = subprocess.run(
        [kubectl, "get", f"job/{name}", *ns, "-o", "jsonpath={.metadata.uid}"],
        capture_output=True,
        text=True,
    )
    uid = got.stdout.strip()
    if got.returncode != 0 or not uid:
        return f"warning: the Service is not owned by the Job; remove both with: {remove(job)[0]}"
    patch = json.dumps(service_owner_patch(job, uid))
    done = subprocess.run(
        [kubectl, "patch", f"service/{name}", *ns, "--type=merge", "-p", patch],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        return f"warning: the Service is not owned by the Job; remove both with: {remove(job)[0]}"
    return f"service/{name} is owned by job/{name}: deleting the Job removes it"


def check_workload(objects: list[dict], expect: Expect) -> None:
    """The Indexed Job (a pod per node, its last pod's hostname a DNS label) and the
    headless Service its pods find each other through."""
    job = the(objects, "Job")
    spec = job["spec"]
    name = job["metadata"]["name"]
    check_indexed(job, spec, "spec", expect)
    pod = spec["template"]
    check_pod(job, pod, "spec.template", expect, "Never")
    label(f"{name}-{expect.nodes - 1}", "the last pod's hostname", job, "shorten cluster.k8s.name")
    services = [obj for obj in objects if obj["kind"] == "Service"]
    if not services:
        raise ConfigError(f"{named(job)}: no headless Service for the rendezvous was rendered")
    subdomain = pod["spec"].get("subdomain")
    if subdomain != services[0]["metadata"]["name"]:
        raise ConfigError(
            f"{named(job)}: spec.template.spec.subdomain={subdomain!r} does not name the "
            f"Service {services[0]['metadata']['name']!r}: the pods get no DNS names"
        )
    check_service(services[0], pod, expect)
    check_endpoint(job, pod, "spec.template", f"{name}-0.{subdomain}", expect)


def check_service(service: dict, pod: dict, expect: Expect) -> None:
    spec = service["spec"]
    if spec.get("clusterIP") != "None":
        raise ConfigError(
            f"{named(service)}: spec.clusterIP={spec.get('clusterIP')!r}: must be 'None' "
            "(headless), so that each pod gets its own DNS name"
        )
    if spec.get("publishNotReadyAddresses") is not True:
        raise ConfigError(
            f"{named(service)}: spec.publishNotReadyAddresses must be true: the pods must "
            "find each other before any of them is ready"
        )
    labels = pod["metadata"].get("labels", {})
    selector = spec.get("selector") or {}
    unmatched = {k: v for k, v in selector.items() if labels.get(k) != v}
    if not selector or unmatched:
        raise ConfigError(
            f"{named(service)}: spec.selector={selector} does not select the Job's pods "
            f"(their labels: {labels}); the rendezvous name would not resolve"
        )
    ports = [p.get("port") for p in spec.get("ports", [])]
    if expect.rdzv_port not in ports:
        raise ConfigError(
            f"{named(service)}: spec.ports {ports} lack the rendezvous port "
            f"cluster.rdzv_port={expect.rdzv_port}"
        )


KIND = Kind(
    name="job",
    endpoint=endpoint,
    objects=objects,
    check=check_workload,
    remove=remove,
    after_apply=own_service,
)
