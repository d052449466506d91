"""A Kubernetes kind of another package, defined in this file alone and installed the way the
launcher installs its own (an entry point of the `launcher.k8s_kinds` group naming this
module, docs/architecture.md, "Adding a Kubernetes kind"): a LeaderWorkerSet renders with
the pod every kind wraps, its own check judges its workload, and no file of the launcher is
edited.

LeaderWorkerSet (leaderworkerset.x-k8s.io) runs a group of pods, a leader and size-1 workers,
behind a headless Service named after it: pod <i> of group 0 is `<name>-0-<i>`, the leader
`<name>-0` at `<name>-0.<name>`, and each pod knows its index as LWS_WORKER_INDEX. Its
StatefulSets set the pods' restart policy.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from launcher.config import ConfigError
from launcher.submit import k8s, k8s_check
from launcher.submit.job import SubmitJob, prepare
from launcher.submit.k8s.kind import Kind
from launcher.submit.k8s.names import name_of, workload_metadata

from entry_points import installed_here
from launch import FAST

NAME = "leaderworkerset"
BUILT_IN = ["job", "jobset", "pytorchjob", "trainjob"]


def endpoint(job: SubmitJob) -> str:
    name = name_of(job)
    return f"{name}-0.{name}:{job.cluster.rdzv_port}"


def leaderworkerset(job: SubmitJob, pod: dict) -> dict:
    template = {"size": job.nodes, "restartPolicy": "RecreateGroupOnPodRestart"}
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": workload_metadata(job),
        "spec": {"replicas": 1, "leaderWorkerTemplate": {**template, "workerTemplate": pod}},
    }


def check_workload(objects: list[dict], expect: k8s_check.Expect) -> None:
    """One group of cluster.nodes pods, each the pod every kind wraps, rendezvousing at the
    leader."""
    lws = k8s_check.the(objects, "LeaderWorkerSet")
    spec = lws["spec"]
    size = spec["leaderWorkerTemplate"].get("size")
    if spec.get("replicas") != 1 or size != expect.nodes:
        raise ConfigError(
            f"{k8s_check.named(lws)}: spec.replicas={spec.get('replicas')}, "
            f"spec.leaderWorkerTemplate.size={size}: expected one group of {expect.nodes}"
        )
    path = "spec.leaderWorkerTemplate.workerTemplate"
    pod = spec["leaderWorkerTemplate"]["workerTemplate"]
    k8s_check.check_pod(lws, pod, path, expect, None)
    name = lws["metadata"]["name"]
    k8s_check.check_endpoint(lws, pod, path, f"{name}-0.{name}", expect)


KIND = Kind(
    name=NAME,
    endpoint=endpoint,
    objects=lambda job, pod: [("leaderworkerset.yaml", leaderworkerset(job, pod))],
    check=check_workload,
    node_rank="LWS_WORKER_INDEX",
    pod_restart_policy=False,
)


def job_of(tmp_path: Path, kind: str) -> SubmitJob:
    args = [*FAST, "cluster.nodes=3", "cluster.gpus_per_node=0", "trainer.global_batch_size=12"]
    args.append(f"cluster.k8s.kind={kind}")
    return prepare("k8s", [*args, f"run.root={tmp_path}", "run.id=l"])


@pytest.fixture
def installed(tmp_path):
    with installed_here(tmp_path, "lws-kind", {"launcher.k8s_kinds": {NAME: __name__}}):
        yield


def test_a_leaderworkerset_renders_with_the_pod_every_kind_wraps(tmp_path, installed):
    assert list(k8s.kinds()) == [*BUILT_IN, NAME]
    job = job_of(tmp_path, NAME)
    files = k8s.render(job)
    assert list(files) == ["leaderworkerset.yaml"]
    lws = yaml.safe_load(files["leaderworkerset.yaml"])
    name = name_of(job)
    assert lws["spec"]["replicas"] == 1 and lws["spec"]["leaderWorkerTemplate"]["size"] == 3
    pod = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    assert "restartPolicy" not in pod  # its StatefulSets set it
    args = pod["containers"][0]["args"]
    assert f"--rdzv-endpoint={name}-0.{name}:{job.cluster.rdzv_port}" in args
    assert "--node-rank=$(LWS_WORKER_INDEX)" in args
    assert "--nnodes=3" in args
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"  # the pod every kind wraps, checked


@pytest.mark.parametrize(
    ("breaks", "says"),
    [
        (
            lambda s: s["leaderWorkerTemplate"].update(size=2),
            "spec.leaderWorkerTemplate.size=2: expected one group of 3",
        ),
        (  # the shared pod check, called by this kind's own
            lambda s: s["leaderWorkerTemplate"]["workerTemplate"]["spec"]["volumes"].pop(0),
            "names no volume",
        ),
    ],
)
def test_its_own_check_judges_its_workload(tmp_path, installed, breaks, says):
    job = job_of(tmp_path, NAME)
    objects = [yaml.safe_load(text) for text in k8s.render(job).values()]
    broken = copy.deepcopy(objects)
    breaks(broken[0]["spec"])
    with pytest.raises(ConfigError) as err:
        k8s_check.check(broken, k8s.checks.expectations(job), k8s.kinds()[NAME])
    assert says in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith(f"LeaderWorkerSet '{name_of(job)}': ")


def test_without_it_the_kind_is_refused_naming_those_there_are(tmp_path):
    job = job_of(tmp_path, NAME)
    with pytest.raises(ConfigError) as err:
        k8s.render(job)
    assert str(err.value) == f"cluster.k8s.kind={NAME}: not one of {', '.join(BUILT_IN)}"
