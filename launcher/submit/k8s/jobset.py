"""`cluster.k8s.kind=jobset`: the Indexed Job as the only replicated Job of a JobSet, whose
controller makes the headless Service and owns it."""

from __future__ import annotations

from launcher.config import ConfigError
from launcher.submit.job import SubmitJob
from launcher.submit.k8s.job import job_spec
from launcher.submit.k8s.kind import Kind
from launcher.submit.k8s.names import (
    VOLCANO_MIN_MEMBER,
    name_of,
    restart_budget,
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

JOBSET_REPLICATED_JOB = "node"


def endpoint(job: SubmitJob) -> str:
    """Pod 0 of the replicated Job, in the subdomain named after the JobSet (a TrainJob's
    runtime makes the same JobSet)."""
    name = name_of(job)
    return f"{name}-{JOBSET_REPLICATED_JOB}-0-0.{name}:{job.cluster.rdzv_port}"


def jobset(job: SubmitJob, pod: dict) -> dict:
    """The same Indexed Job as the only replicated Job of a JobSet, which makes the
    headless Service itself (named after the JobSet). As in JobSet's own PyTorch example the
    inner Job has backoffLimit 0 and the JobSet restarts the whole set (maxRestarts); a Job
    failed by its podFailurePolicy (exit 2, 3, 4) fails the JobSet without a restart. A
    restart recreates the Jobs only once every pod of the old ones is gone
    (BlockingRecreate): the old generation's stop checkpoint is written before a new pod
    starts (the run directory's lock makes a new rank 0 wait for it too)."""
    k = job.cluster.k8s
    template: dict = {"spec": job_spec(job, pod, restarts_owned_by_jobset=True)}
    if k.gang == "volcano":
        template = {"metadata": {"annotations": {VOLCANO_MIN_MEMBER: str(job.nodes)}}, **template}
    spec: dict = {
        "network": {
            "enableDNSHostnames": True,
            "publishNotReadyAddresses": True,
            "subdomain": name_of(job),
        },
        "failurePolicy": {
            "maxRestarts": restart_budget(job),
            "restartStrategy": "BlockingRecreate",
            "rules": jobset_rules(job),
        },
    }
    if k.ttl_after_finished_s is not None:
        # on the JobSet: the inner Job's would delete the Job and leave the JobSet behind
        spec["ttlSecondsAfterFinished"] = int(k.ttl_after_finished_s)
    if k.gang == "kueue":
        spec["suspend"] = True
    spec["replicatedJobs"] = [{"name": JOBSET_REPLICATED_JOB, "replicas": 1, "template": template}]
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": workload_metadata(job),
        "spec": spec,
    }


def jobset_rules(job: SubmitJob) -> list[dict]:
    """Fail the set, without a restart, when the inner Job failed by its podFailurePolicy
    (exit 2, 3, 4) or, with a time limit, by its deadline: a restart would get a fresh
    activeDeadlineSeconds and run past the limit."""
    rules = [
        {
            "name": "fail-on-bad-input-nonfinite-oom",
            "action": "FailJobSet",
            "onJobFailureReasons": ["PodFailurePolicy"],
        }
    ]
    if job.cluster.time_limit is not None:
        rules.append(
            {
                "name": "fail-on-time-limit",
                "action": "FailJobSet",
                "onJobFailureReasons": ["DeadlineExceeded"],
            }
        )
    return rules


def check_workload(objects: list[dict], expect: Expect) -> None:
    """One replicated Indexed Job, DNS hostnames on, restarts owned by the set, and a Job
    failed by its podFailurePolicy or its deadline failing the set without a restart."""
    jobset = the(objects, "JobSet")
    spec = jobset["spec"]
    network = spec.get("network") or {}
    if network.get("enableDNSHostnames") is not True:
        raise ConfigError(
            f"{named(jobset)}: spec.network.enableDNSHostnames must be true: the pods find "
            "the rendezvous host by its DNS name"
        )
    replicated = spec.get("replicatedJobs") or []
    if len(replicated) != 1 or replicated[0].get("replicas") != 1:
        raise ConfigError(f"{named(jobset)}: spec.replicatedJobs must be one Job, replicas: 1")
    rjob = replicated[0]
    job_spec = rjob["template"]["spec"]
    base = "spec.replicatedJobs[0].template.spec"
    check_indexed(jobset, job_spec, base, expect)
    if job_spec.get("backoffLimit") != 0:
        raise ConfigError(
            f"{named(jobset)}: {base}.backoffLimit={job_spec.get('backoffLimit')!r}, expected "
            "0: the JobSet owns restarts (spec.failurePolicy.maxRestarts)"
        )
    rules = (spec.get("failurePolicy") or {}).get("rules") or []
    fails_on = {
        reason
        for r in rules
        if r.get("action") == "FailJobSet"
        for reason in r.get("onJobFailureReasons", [])
    }
    if "PodFailurePolicy" not in fails_on:
        raise ConfigError(
            f"{named(jobset)}: spec.failurePolicy.rules has no FailJobSet rule on "
            "PodFailurePolicy: a Job failed for bad input would be restarted"
        )
    if "activeDeadlineSeconds" in job_spec and "DeadlineExceeded" not in fails_on:
        raise ConfigError(
            f"{named(jobset)}: spec.failurePolicy.rules has no FailJobSet rule on "
            f"DeadlineExceeded: each restart would get a fresh {base}.activeDeadlineSeconds "
            "and the set would run past cluster.time_limit"
        )
    pod = job_spec["template"]
    check_pod(jobset, pod, f"{base}.template", expect, "Never")
    name = jobset["metadata"]["name"]
    subdomain = network.get("subdomain") or name
    last = f"{name}-{rjob['name']}-0-{expect.nodes - 1}"
    label(last, "the last pod's hostname", jobset, "shorten cluster.k8s.name")
    host = f"{name}-{rjob['name']}-0-0.{subdomain}"
    check_endpoint(jobset, pod, f"{base}.template", host, expect)


KIND = Kind(
    name="jobset",
    endpoint=endpoint,
    objects=lambda job, pod: [("jobset.yaml", jobset(job, pod))],
    check=check_workload,
)
