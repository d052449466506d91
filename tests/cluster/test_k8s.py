"""Kubernetes: the rendered manifests, checked, schema-validated, and run as pods.

There is no cluster here. The manifests are validated against Kubernetes' own OpenAPI
schemas (kubernetes-validate --strict, offline) and, for JobSet and PyTorchJob, against the
CRDs' published schemas (tests/fixtures/crds/), the renderer's checks are exercised on
broken manifests, the failure policies, security context, QoS and gang options are checked
field by field, and the Indexed Job's pods are run the way Kubernetes would run them
(tests/pods.py: one network namespace, hostname and /dev/shm per pod, the container's
command and environment exactly as rendered): they rendezvous and train into one run
directory, a killed pod, started again, rejoins and the run resumes from its checkpoint,
and pods sent SIGTERM write a stop checkpoint and exit 143.

The pod runs need the lead's `launcher.torchrun` (the command the pods run); of them,
test_sigterm_to_the_pods_stops_with_a_checkpoint_and_143 also needs its exit code 143 and
the trainer's stop with DataLoader workers on.
"""

from __future__ import annotations

import atexit
import copy
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jsonschema
import pytest
import yaml

from launcher.checkpoint import memory as memory_tier
from launcher.config import ConfigError
from launcher.plan.host import node_processes
from launcher.plan.memory import shm_need
from launcher.submit import k8s, k8s_check, pod_security
from launcher.submit.__main__ import main
from launcher.submit.job import prepare
from launcher.submit.k8s.job import service_owner_patch
from launcher.submit.node_memory import PROCESS_MARGIN

from launch import FAST, losses, metrics, summary
from paths import FIXTURES, REPO
from pods import IndexedJobPods, can_run_pods

EXAMPLE_DIR = REPO / "k8s"
# The checked-in example: the default experiment on 2 nodes x 8 GPUs (16 ranks need a
# global batch that is a multiple of micro-batch 4 x 16).
EXAMPLE = [
    "cluster.nodes=2",
    "cluster.gpus_per_node=8",
    "trainer.global_batch_size=64",
    "run.root=/runs",
    "run.id=example",
]
REGENERATE = "LAUNCHER_UPDATE_EXAMPLES=1 python -m pytest tests/cluster/test_k8s.py -k example"
CRDS = FIXTURES / "crds"


def objects(files: dict[str, str]) -> dict[str, dict]:
    """{kind: object} of rendered files."""
    return {obj["kind"]: obj for obj in (yaml.safe_load(text) for text in files.values())}


@pytest.fixture(scope="module")
def example():
    job = prepare("k8s", EXAMPLE, check_paths=False)  # /runs exists only on the cluster
    return job, k8s.render(job)


def test_example_is_what_the_renderer_outputs(example):
    _, files = example
    if os.environ.get("LAUNCHER_UPDATE_EXAMPLES") == "1":
        for name, text in files.items():
            (EXAMPLE_DIR / name).write_text(text)
    assert sorted(p.name for p in EXAMPLE_DIR.glob("*.yaml")) == sorted(files), REGENERATE
    for name, text in files.items():
        assert (EXAMPLE_DIR / name).read_text() == text, f"k8s/{name} is stale: {REGENERATE}"


def test_example_fields(example):
    job, files = example
    objs = objects(files)
    jb, svc = objs["Job"], objs["Service"]
    spec, pod = jb["spec"], jb["spec"]["template"]["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 2, 2)
    assert pod["restartPolicy"] == "Never"
    assert (spec["backoffLimitPerIndex"], spec["maxFailedIndexes"]) == (3, 0)
    assert "backoffLimit" not in spec  # per index, not a fixed total whatever the size
    assert spec["podFailurePolicy"] == {
        "rules": [
            {
                "action": "FailJob",
                "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [2, 3, 4]},
            },
            {
                "action": "Ignore",
                "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
            },
        ]
    }
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"]
    assert pod["subdomain"] == svc["metadata"]["name"] == "launcher-example"
    c = pod["containers"][0]
    assert c["command"] == ["python", "-m", "launcher.torchrun"]
    assert (c["image"], c["imagePullPolicy"]) == ("launcher:0.1.0", "IfNotPresent")  # pinned
    # no API token, no variables for the namespace's Services; the GPU nodes' taint tolerated
    assert (pod["automountServiceAccountToken"], pod["enableServiceLinks"]) == (False, False)
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert pod["terminationGracePeriodSeconds"] == 120
    assert {"name": "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "value": "110"} in c["env"]
    # security=restricted, the default: non-root, a writable HOME and /tmp, fsGroup.
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "fsGroup": 1000,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert {"name": "HOME", "value": "/home/launcher"} in c["env"]
    assert {"name": "home", "mountPath": "/home/launcher"} in c["volumeMounts"]
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "2Gi"}} in pod["volumes"]
    assert pod_security.violations(pod) == []
    labels = jb["metadata"]["labels"]
    assert labels["app.kubernetes.io/managed-by"] == "launcher"
    assert labels["app.kubernetes.io/component"] == "trainer"
    assert svc["metadata"]["labels"]["app.kubernetes.io/component"] == "rendezvous"
    meta = jb["spec"]["template"]["metadata"]
    assert meta["annotations"]["sidecar.istio.io/inject"] == "false"
    assert meta["labels"]["sidecar.istio.io/inject"] == "false"
    assert "--nnodes=2" in c["args"] and "--node-rank=$(JOB_COMPLETION_INDEX)" in c["args"]
    assert "--rdzv-endpoint=launcher-example-0.launcher-example:29500" in c["args"]
    res = c["resources"]
    assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"] == 8
    # the disk-backed emptyDirs' sizeLimits (home 10Gi + tmp 2Gi) and the container's own
    # disk (disk_margin 2Gi), requested and limited
    assert res["requests"]["ephemeral-storage"] == res["limits"]["ephemeral-storage"] == "14Gi"
    workers = job.cfg.data.num_workers
    assert res["requests"]["cpu"] == str(8 * (1 + workers)) and "cpu" not in res["limits"]
    # /dev/shm: the loaders' need on 8 ranks and the memory tier's on the node (on by default
    # under torchrun's restarts, cluster.k8s.max_restarts=3: two copies of DDP's state, once
    # per node) plus the 1 GiB margin, held by the memory limit.
    restarts = job.cluster.k8s.max_restarts
    tier = memory_tier.shm_bytes(job.cfg, 8, 16, restarts)
    assert tier == 2 * memory_tier.state_bytes(job.cfg) > 0
    need = shm_need(job.cfg, 8, 16, restarts)
    assert need == shm_need(job.cfg, 8, 16, restarts=0) + tier
    shm = pod["volumes"][0]
    assert shm["emptyDir"] == {
        "medium": "Memory",
        "sizeLimit": k8s_check.format_bytes(need + 2**30),
    }
    memory = k8s_check.parse_quantity(res["limits"]["memory"], "limit")
    processes = int(node_processes(job.cfg, 8, 16, True, restarts) * (1 + PROCESS_MARGIN))
    assert memory == -(-processes // 2**20) * 2**20 + k8s_check.parse_quantity(
        shm["emptyDir"]["sizeLimit"], "shm"
    )  # the plan's host memory for the pod's processes (cluster.k8s.memory=null), /dev/shm
    assert {"name": "runs", "mountPath": "/runs"} in c["volumeMounts"]
    wandb = next(e for e in c["env"] if e["name"] == "WANDB_API_KEY")
    assert wandb["valueFrom"]["secretKeyRef"] == {
        "name": "wandb",
        "key": "api-key",
        "optional": True,
    }


def render_into(folder: Path, overrides: list[str]) -> dict[str, str]:
    job = prepare("k8s", overrides)
    files = k8s.render(job)
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return files


FULL = [
    "cluster.nodes=2",
    "cluster.gpus_per_node=8",
    "trainer.global_batch_size=64",
    "+exp=bucket_sweep",
    "logger=wandb",
    "logger.mode=online",
    "nccl=infiniband",
    "cluster.k8s.rdma_resource=rdma/ib",
    "cluster.k8s.security=restricted",
    "cluster.k8s.guaranteed=true",
    "cluster.k8s.gang=kueue",
    "cluster.k8s.queue=team-a",
    "run.id=sweep",
    "cluster.time_limit=1-00:00:00",
    "cluster.workdir=/workspace",
    "cluster.setup=[nvidia-smi -L]",
    "cluster.k8s.namespace=ml",
    "cluster.k8s.image=registry.example.com/launcher:0.1",
    "cluster.k8s.image_pull_secrets=[regcred]",
    "cluster.k8s.service_account=trainer",
    "cluster.k8s.priority_class=high",
    "+cluster.k8s.node_selector.pool=h100",
    "cluster.k8s.tolerations=[{key: 'nvidia.com/gpu', operator: Exists, effect: NoSchedule}]",
    "++cluster.k8s.affinity={nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution:"
    " {nodeSelectorTerms: [{matchExpressions: [{key: 'topology.kubernetes.io/zone',"
    " operator: In, values: [zone-a]}]}]}}}",
    "+cluster.k8s.annotations.team=nlp",
    "cluster.k8s.ttl_after_finished_s=3600",
    "cluster.k8s.topology_spread_key=kubernetes.io/hostname",
]
VOLCANO = ["cluster.k8s.gang=volcano", "cluster.k8s.queue=research"]
# What a TrainJob cannot carry (refused for it: test_a_trainjob_refuses_what_it_cannot_carry).
NOT_FOR_TRAINJOB = (
    "cluster.k8s.priority_class",
    "cluster.k8s.ttl_after_finished_s",
    "cluster.k8s.topology_spread_key",
    "cluster.workdir",
    "cluster.k8s.gang=volcano",
)


def for_kind(kind: str, overrides: list[str]) -> list[str]:
    """`overrides` as a kind takes them: a TrainJob without what it cannot carry."""
    if kind != "trainjob":
        return overrides
    return [o for o in overrides if not o.startswith(NOT_FOR_TRAINJOB)]


@pytest.fixture(scope="module")
def variants(tmp_path_factory) -> tuple[Path, dict[str, dict[str, str]]]:
    """Every kind, plain and with every optional field set (and Volcano in place of Kueue),
    rendered once: (folder, {"<kind>-<variant>": files})."""
    tmp_path = tmp_path_factory.mktemp("variants")
    root = [f"run.root={tmp_path / 'runs'}"]
    return tmp_path, {
        f"{kind}-{variant}": render_into(
            tmp_path / f"{kind}-{variant}",
            [*for_kind(kind, overrides), *root, f"cluster.k8s.kind={kind}"],
        )
        for kind in k8s.kinds()
        for variant, overrides in (
            ("plain", EXAMPLE[:3]),
            ("full", FULL),
            ("volcano", [*EXAMPLE[:3], *VOLCANO]),
        )
    }


def strict(schema):
    """A CRD's structural schema as the API server applies it with strict field validation
    (kubectl's default since 1.27), in JSON Schema: an object with `properties` takes no
    other field unless x-kubernetes-preserve-unknown-fields; int-or-string takes either."""
    if not isinstance(schema, dict):
        return schema
    out = {k: v for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if "properties" in schema:
        out["properties"] = {k: strict(v) for k, v in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get(
            "x-kubernetes-preserve-unknown-fields"
        ):
            out["additionalProperties"] = False
    if isinstance(schema.get("additionalProperties"), dict):
        out["additionalProperties"] = strict(schema["additionalProperties"])
    if "items" in schema:
        out["items"] = strict(schema["items"])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in schema:
            out[key] = [strict(s) for s in schema[key]]
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
    return out


def crd_errors(obj: dict) -> list[str]:
    """What the CRD's published schema (tests/fixtures/crds) says is wrong with `obj`."""
    group, _, version = obj["apiVersion"].rpartition("/")
    crd = json.loads((CRDS / f"{group}_{version}_{obj['kind']}.json").read_text())
    validator = jsonschema.Draft7Validator(strict(crd["openAPIV3Schema"]))
    return [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)
    ]


def test_every_kind_passes_its_schema(variants, tmp_path):
    """Job and Service against Kubernetes 1.37's schemas (kubernetes-validate --strict), JobSet
    and PyTorchJob against their CRDs' published OpenAPI schemas, each plain and with every
    option set; a misspelt field fails both ways."""
    folder, rendered = variants
    full_job = objects(rendered["job-full"])["Job"]
    container = full_job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["/bin/sh", "-c"]
    script = container["args"][0]
    assert "exec python -m launcher.torchrun --max-restarts=3" in script
    assert '"$JOB_COMPLETION_INDEX"' in script
    assert {"name": "NCCL_IB_DISABLE", "value": "0"} in container["env"]
    key = next(e for e in container["env"] if e["name"] == "WANDB_API_KEY")
    assert key == {
        "name": "WANDB_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}},
    }
    assert full_job["spec"]["activeDeadlineSeconds"] == 86400
    files = sorted(str(p) for p in folder.glob("job-*/*.yaml"))
    files += sorted(str(p) for p in EXAMPLE_DIR.glob("*.yaml"))
    assert len(files) == 8
    typo = tmp_path / "typo.yaml"
    bad = copy.deepcopy(full_job)
    bad["spec"]["template"]["spec"]["containers"][0]["securityContext"]["runAsNonroot"] = True
    typo.write_text(yaml.safe_dump(bad))
    tool = shutil.which("kubernetes-validate", path=str(Path(sys.executable).parent))
    # every version docs/kubernetes.md claims (k8s.MIN_VERSION to the tool's newest, 1.37);
    # the one before fails, as the docs say, on rules without onPodConditions
    for minor in range(k8s.MIN_VERSION[1] - 1, 38):
        proc = subprocess.run(
            [tool, "--strict", "-k", f"1.{minor}.0", *files, str(typo)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        out = proc.stdout + proc.stderr
        passed = [ln for ln in proc.stdout.splitlines() if "passed" in ln]
        if minor < k8s.MIN_VERSION[1]:
            assert len(passed) < 8 and "onPodConditions" in out, out
            continue
        assert len(passed) == 8, (minor, out)
        assert "'runAsNonroot' was unexpected" in out and proc.returncode != 0
    crds = [
        obj
        for name, files in rendered.items()
        if not name.startswith("job-")
        for obj in objects(files).values()
    ]
    kinds = ["JobSet"] * 3 + ["PyTorchJob"] * 3 + ["TrainJob"] * 3
    assert sorted(o["kind"] for o in crds) == kinds
    for obj in crds:
        assert crd_errors(obj) == [], obj["kind"]
    for obj, path in (
        (crds[0], ("spec", "failurePolicy", "maxRestart")),
        (crds[5], ("spec", "runPolicy", "schedulingPolicy", "minAvailble")),
        (crds[-1], ("spec", "trainer", "numNode")),
    ):
        broken = copy.deepcopy(obj)
        node = broken
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = 1
        assert any(f"'{path[-1]}' was unexpected" in e for e in crd_errors(broken)), path


def test_failure_policies_per_kind(variants):
    """The exit-code contract (launcher/resilience/exit_codes.py) as each kind's failure policy."""
    _, rendered = variants
    fail_at_once = {
        "action": "FailJob",
        "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [2, 3, 4]},
    }
    disrupted = [{"type": "DisruptionTarget", "status": "True"}]
    ignore = {"action": "Ignore", "onPodConditions": disrupted}
    job = objects(rendered["job-plain"])["Job"]["spec"]
    assert job["podFailurePolicy"]["rules"] == [fail_at_once, ignore]
    assert (job["backoffLimitPerIndex"], job["maxFailedIndexes"]) == (3, 0)
    jobset = objects(rendered["jobset-plain"])["JobSet"]["spec"]
    inner = jobset["replicatedJobs"][0]["template"]["spec"]
    assert inner["backoffLimit"] == 0 and "backoffLimitPerIndex" not in inner
    assert inner["podFailurePolicy"]["rules"] == [fail_at_once, ignore]
    assert jobset["failurePolicy"] == {
        "maxRestarts": 6,  # 3 per node x 2 nodes
        # a restart waits until every old pod is gone (its stop checkpoint written)
        "restartStrategy": "BlockingRecreate",
        "rules": [
            {
                "name": "fail-on-bad-input-nonfinite-oom",
                "action": "FailJobSet",
                "onJobFailureReasons": ["PodFailurePolicy"],
            }
        ],
    }
    # With a time limit, a deadline failure ends the set: a restart would get a fresh one.
    full = objects(rendered["jobset-full"])["JobSet"]["spec"]
    assert full["failurePolicy"]["rules"][1] == {
        "name": "fail-on-time-limit",
        "action": "FailJobSet",
        "onJobFailureReasons": ["DeadlineExceeded"],
    }
    assert full["replicatedJobs"][0]["template"]["spec"]["activeDeadlineSeconds"] == 86400
    ptj = objects(rendered["pytorchjob-plain"])["PyTorchJob"]["spec"]
    assert ptj["runPolicy"]["backoffLimit"] == 6
    assert ptj["runPolicy"]["cleanPodPolicy"] == "Running"  # no Worker left holding GPUs
    assert {r["restartPolicy"] for r in ptj["pytorchReplicaSpecs"].values()} == {"ExitCode"}


def test_ttl_trainjob_and_placement(variants):
    """The JobSet's ttlSecondsAfterFinished is its own (the inner Job's would leave the JobSet
    behind); a TrainJob names its torch runtime and carries the trainer's container and the
    pod's fields in a runtime patch; every pod of every kind runs without an API token or
    Service variables, tolerates the GPU taint once, and spreads by the key given."""
    _, rendered = variants
    jobset = objects(rendered["jobset-full"])["JobSet"]["spec"]
    assert jobset["ttlSecondsAfterFinished"] == 3600
    assert "ttlSecondsAfterFinished" not in jobset["replicatedJobs"][0]["template"]["spec"]
    assert objects(rendered["job-full"])["Job"]["spec"]["ttlSecondsAfterFinished"] == 3600
    tj = objects(rendered["trainjob-full"])["TrainJob"]["spec"]
    assert tj["runtimeRef"] == {"name": "torch-distributed"}
    assert tj["trainer"]["numNodes"] == 2 and tj["activeDeadlineSeconds"] == 86400
    assert tj["trainer"]["image"] == "registry.example.com/launcher:0.1"
    assert tj["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == 8
    (container,) = pod_specs(objects(rendered["trainjob-full"])["TrainJob"])[0]["containers"]
    assert container["name"] == "node" and "volumeMounts" in container
    gpu = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    for name, files in rendered.items():
        for obj in objects(files).values():
            for pod in pod_specs(obj):
                assert pod["tolerations"] == [gpu], name  # FULL gives it too: kept once
                if obj["kind"] == "TrainJob":
                    continue  # the runtime's pod template sets these (docs/kubernetes.md)
                assert pod["automountServiceAccountToken"] is False, name
                assert pod["enableServiceLinks"] is False, name
                if name.endswith("-full"):
                    (spread,) = pod["topologySpreadConstraints"]
                    assert (spread["topologyKey"], spread["maxSkew"]) == (
                        "kubernetes.io/hostname",
                        1,
                    )
                    assert spread["labelSelector"]["matchLabels"] == {
                        "app.kubernetes.io/instance": "launcher-sweep"
                    }


def pod_specs(obj: dict) -> list[dict]:
    """The pod specs of a rendered workload, whatever its kind."""
    if obj["kind"] == "Job":
        return [obj["spec"]["template"]["spec"]]
    if obj["kind"] == "JobSet":
        return [r["template"]["spec"]["template"]["spec"] for r in obj["spec"]["replicatedJobs"]]
    if obj["kind"] == "PyTorchJob":
        return [r["template"]["spec"] for r in obj["spec"]["pytorchReplicaSpecs"].values()]
    if obj["kind"] == "TrainJob":  # the runtime patch's pod (the trainer's container fields)
        patch = obj["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
        return [r["template"]["spec"]["template"]["spec"] for r in patch["replicatedJobs"]]
    return []


def test_security_qos_and_gang_options(variants):
    _, rendered = variants
    full = objects(rendered["job-full"])
    job, pod = full["Job"], full["Job"]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    # Pod Security 'restricted', with RDMA's documented IPC_LOCK exception.
    assert pod["securityContext"]["runAsUser"] == pod["securityContext"]["fsGroup"] == 1000
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]},
    }
    assert pod_security.violations(pod) == [
        "spec.containers[trainer].securityContext.capabilities.add: IPC_LOCK breaks baseline "
        "or restricted"
    ]
    for name, files in rendered.items():  # every kind's pods, as rendered by default
        for obj in objects(files).values():
            for pod_spec in pod_specs(obj):
                broken = pod_security.violations(pod_spec)
                assert broken == [] or name.endswith("-full"), (name, broken)
    # Guaranteed QoS: every resource's limit equals its request, CPUs whole.
    res = c["resources"]
    assert res["requests"] == res["limits"]  # ephemeral-storage too: requested as limited
    assert res["limits"]["cpu"] == "24" and res["limits"]["rdma/ib"] == 1  # 8 x (1 + 2 workers)
    assert c["imagePullPolicy"] == "IfNotPresent"  # a tag (the notes say it pins nothing)
    # Kueue: the queue label on the workload, created suspended.
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert job["spec"]["suspend"] is True
    jobset = objects(rendered["jobset-full"])["JobSet"]
    assert jobset["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert jobset["spec"]["suspend"] is True
    assert "suspend" not in jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
    ptj = objects(rendered["pytorchjob-full"])["PyTorchJob"]
    assert ptj["spec"]["runPolicy"]["suspend"] is True
    # Volcano: all pods or none (min members = nodes), in the named queue.
    vjob = objects(rendered["job-volcano"])["Job"]
    assert vjob["metadata"]["annotations"] == {"scheduling.volcano.sh/group-min-member": "2"}
    vpod = vjob["spec"]["template"]
    assert vpod["spec"]["schedulerName"] == "volcano"
    assert vpod["metadata"]["annotations"]["scheduling.volcano.sh/queue-name"] == "research"
    assert "suspend" not in vjob["spec"]
    vjs = objects(rendered["jobset-volcano"])["JobSet"]["spec"]["replicatedJobs"][0]["template"]
    assert vjs["metadata"]["annotations"] == {"scheduling.volcano.sh/group-min-member": "2"}
    vptj = objects(rendered["pytorchjob-volcano"])["PyTorchJob"]["spec"]
    assert vptj["runPolicy"]["schedulingPolicy"] == {"minAvailable": 2, "queue": "research"}
    master = vptj["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert master["schedulerName"] == "volcano"
    # Off by default.
    plain = objects(rendered["job-plain"])["Job"]
    assert "suspend" not in plain["spec"] and "annotations" not in plain["metadata"]
    assert "schedulerName" not in plain["spec"]["template"]["spec"]


def test_dry_run_notes_and_owner_patch(tmp_path, capsys):
    code = main(
        [
            "k8s",
            "--dry-run",
            *EXAMPLE[:3],
            f"run.root={tmp_path}",
            "run.id=n1",
            "cluster.k8s.namespace=ml",
            "cluster.k8s.image=launcher:latest",
            "cluster.k8s.allow_floating_image=true",
            "cluster.k8s.image_pull_policy=IfNotPresent",
            "cluster.k8s.cpu=4",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0 and len(out.split()) == 2
    lines = err.splitlines()
    assert lines[0] == (
        "warning: cluster.k8s.image=launcher:latest names no fixed build (cluster.k8s."
        "allow_floating_image=true): nodes may run different code; pin a digest"
    )
    assert lines[1].startswith(
        "warning: cluster.k8s.image=launcher:latest with cluster.k8s.image_pull_policy="
        "IfNotPresent: a node that pulled an older :latest keeps running it"
    )
    assert lines[2].startswith("warning: cluster.k8s.cpu=4 is less than the 24 CPUs")
    assert (
        "note: needs: PersistentVolumeClaim launcher-runs (ReadWriteMany) in ml, mounted at "
        f"{tmp_path} in every pod (cluster.k8s.runs_pvc)"
    ) in lines
    assert "note: remove: kubectl delete job,service -n ml -l app.kubernetes.io/instance=" in err
    job = prepare("k8s", [*EXAMPLE[:3], f"run.root={tmp_path}", "run.id=n1"])
    owner = service_owner_patch(job, "uid-1")["metadata"]["ownerReferences"][0]
    assert owner == {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": "launcher-n1",
        "uid": "uid-1",
        "blockOwnerDeletion": False,
        "controller": False,
    }


@pytest.mark.parametrize(
    "extra, expected",
    [
        (
            [
                "cluster.k8s.shm_size=16Mi",
                "data.num_workers=8",
                "data.prefetch_factor=8",
                "trainer.seq_len=1024",
            ],
            # 8 processes x the loaders' 8 MiB + the memory tier's two copies of the state,
            # once a node under DDP (launcher.plan.memory.shm_need: a node's figure)
            "cluster.k8s.shm_size=16Mi is less than the 142Mi this config's DataLoader workers "
            "and memory tier need per pod",
        ),
        (["cluster.k8s.name=Bad_Name"], "metadata.name='Bad_Name' is not a valid DNS label"),
        ([f"cluster.job_name={'x' * 60}"], "is not a valid DNS label"),
        (["cluster.gpus_per_node=6"], "trainer.global_batch_size=64 is not divisible"),
        (["cluster.k8s.kind=deployment"], "cluster.k8s.kind=deployment: not one of"),
        (["cluster.k8s.memory=lots"], "cluster.k8s.memory='lots': not a Kubernetes quantity"),
        (["+cluster.env.WANDB_API_KEY=abc"], "cluster.env.WANDB_API_KEY is a secret: it would be"),
        (["nccl=infiniband"], "nccl=infiniband (NCCL_IB_DISABLE=0) in a pod needs RDMA devices"),
        (
            [
                "cluster.k8s.termination_grace_s=60",
                "cluster.k8s.step_time_s=25",
                "cluster.k8s.checkpoint_write_s=30",
            ],
            "cluster.k8s.termination_grace_s=60 is too short to stop with a checkpoint: "
            "cluster.k8s.step_time_s=25.0 + a 30 s checkpoint write "
            "(cluster.k8s.checkpoint_write_s=30) + 10 s for torchrun to end = 65 s",
        ),
        (["cluster.k8s.gang=kueue"], "cluster.k8s.gang=kueue needs cluster.k8s.queue"),
        (["cluster.k8s.gang=yunikorn"], "cluster.k8s.gang=yunikorn: not one of"),
        (
            ["cluster.k8s.guaranteed=true", "cluster.k8s.cpu=7.5"],
            "Guaranteed QoS (cluster.k8s.guaranteed=true) needs whole CPUs",
        ),
        (["cluster.k8s.security=strict"], "cluster.k8s.security=strict: not one of"),
        (["cluster.k8s.backoff_limit=6"], "cluster.k8s.backoff_limit: unknown key"),
        (
            ["cluster.k8s.image=registry.example.com/launcher"],
            "cluster.k8s.image=registry.example.com/launcher: names no fixed build (:latest or "
            "no tag), so pods may run different code; give a digest (repo/launcher@sha256:...), "
            "or at least a tag",
        ),
        (["+cluster.env.GH_PAT=abc"], "cluster.env.GH_PAT is a secret: it would be"),
        (
            ["cluster.setup=['huggingface-cli login --token hf_abcdefghijklmnopqrstuvwx']"],
            "cluster.setup[0] holds a secret, a token of a known kind (hf_...): it would be",
        ),
    ],
    ids=[
        "shm",
        "name",
        "long-name",
        "gpus-vs-batch",
        "kind",
        "quantity",
        "secret",
        "ib-without-rdma",
        "grace",
        "kueue-queue",
        "gang",
        "guaranteed-cpu",
        "security",
        "old-key",
        "floating-image",
        "secret-name",
        "secret-value",
    ],  # fmt: skip
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, extra, expected):
    root = tmp_path / "runs"
    code = main(["k8s", "--dry-run", *EXAMPLE[:3], f"run.root={root}", *extra])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert expected in err, err
    assert not root.exists()


def test_dry_run_writes_the_files_and_prints_their_paths(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "launcher.submit",
            "k8s",
            "--dry-run",
            *EXAMPLE[:3],
            f"run.root={tmp_path}",
            "run.id=r1",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    submit = tmp_path / "r1" / "submit"
    assert proc.stdout.split() == [str(submit / "service.yaml"), str(submit / "job.yaml")]
    assert "launcher-r1-0.launcher-r1:29500" in (submit / "job.yaml").read_text()


def _break(path: str, value):
    """A mutation of the example's objects: set `path` ("Kind key key ...") to `value`."""

    def apply(objs: dict) -> None:
        kind, *keys = path.split(" ")
        node = objs[kind]
        for key in keys[:-1]:
            node = node[int(key)] if key.isdigit() else node[key]
        last = keys[-1]
        node[int(last) if last.isdigit() else last] = value

    return apply


POD = "Job spec template spec"
BROKEN = {
    "mount-without-volume": (
        _break(f"{POD} containers 0 volumeMounts 1 name", "data"),
        "volumeMounts[1].name='data' names no volume",
    ),
    "gpu-request-not-limit": (
        _break(f"{POD} containers 0 resources requests nvidia.com/gpu", 4),
        "requests['nvidia.com/gpu']=4 differs from limits",
    ),
    "shm-over-memory": (
        _break(f"{POD} volumes 0 emptyDir sizeLimit", "65Gi"),
        "beside /dev/shm's sizeLimit 65Gi, less than the 23774Mi the processes get",
    ),
    "shm-on-disk": (_break(f"{POD} volumes 0 emptyDir", {}), "not an emptyDir with medium: Memory"),
    "wrong-subdomain": (_break(f"{POD} subdomain", "other"), "subdomain='other' does not name"),
    "service-selects-nothing": (
        _break("Service spec selector", {"app": "x"}),
        "does not select the Job's pods",
    ),
    "not-headless": (_break("Service spec clusterIP", "10.0.0.1"), "must be 'None' (headless)"),
    "kubelet-restarts": (_break(f"{POD} restartPolicy", "OnFailure"), "restartPolicy='OnFailure'"),
    "disruptions-counted": (_break("Job spec podFailurePolicy", None), "no Ignore rule"),
    "bad-input-retried": (
        _break("Job spec podFailurePolicy rules 0 action", "Count"),
        "does not fail the Job at once on exit codes 2 (bad input) and 3",
    ),
    "killed-before-checkpoint": (
        _break(f"{POD} terminationGracePeriodSeconds", 100),
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT=110 must be set and below",
    ),
    "completions": (_break("Job spec completions", 3), "spec.completions=3, expected 2"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_checks_name_the_broken_field(example, case):
    job, files = example
    broken, expected = BROKEN[case]
    objs = copy.deepcopy(objects(files))
    broken(objs)
    with pytest.raises(ConfigError) as err:
        k8s_check.check(list(objs.values()), k8s.expectations(job), k8s.kinds()["job"])
    assert expected in str(err.value)
    assert "\n" not in str(err.value)


# The pods: 2 nodes x 1 CPU process, one DataLoader worker each (so /dev/shm is used), a
# /dev/shm of exactly the rendered size (no margin), checkpoints every 10 steps.
POD_RUN = [
    "cluster.nodes=2",
    "cluster.gpus_per_node=0",
    "cluster.procs_per_node=1",
    "+cluster.env.OMP_NUM_THREADS=1",
    "cluster.k8s.shm_margin=0",
    *FAST,
    "data.num_workers=1",
    "data.persistent_workers=true",
    "trainer.max_steps=60",
    "trainer.checkpoint_interval=10",
    "trainer.eval_interval=1000",
]
POD_TIMEOUT = 240


def rendered_pods(tmp_path: Path, run_id: str, run: list[str] = POD_RUN) -> IndexedJobPods:
    """The rendered Job's pods, restricted as by default (UID 1000). Their run root and
    workdir lie in a folder UID 1000 can reach (pytest's own are root's alone), seen by the
    test at tmp_path/runs; without LAUNCHER_CACHE_DIR the data cache is the pod's own, in
    its HOME emptyDir, as in a real restricted pod."""
    reason = can_run_pods()
    if reason:
        pytest.skip(f"cannot run pods here: {reason}")
    if importlib.util.find_spec("launcher.torchrun") is None:
        pytest.skip("launcher.torchrun (the exit-code front door the pods run) is not installed")
    base = Path(tempfile.mkdtemp(prefix="launcher-pods-", dir="/var/tmp"))
    base.chmod(0o755)
    atexit.register(shutil.rmtree, base, True)
    (base / "runs").mkdir()
    (tmp_path / "runs").symlink_to(base / "runs")
    job = prepare("k8s", [*run, f"run.root={base / 'runs'}", f"run.id={run_id}",
                          f"cluster.workdir={base}"])  # fmt: skip
    paths = job.write(k8s.render(job))
    objs = {yaml.safe_load(p.read_text())["kind"]: yaml.safe_load(p.read_text()) for p in paths}
    venv_bin = Path(sys.executable).parent
    image_env = {  # what the container image itself provides
        "PATH": f"{venv_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
    }
    state = tmp_path / f"pods-{run_id}"
    state.mkdir()
    interpreter = Path(os.path.realpath(sys.executable))  # the image's python, for UID 1000
    return IndexedJobPods(
        objs["Job"], objs["Service"], image_env, base, state, expose=[interpreter]
    )


@pytest.fixture(scope="module")
def pod_reference(tmp_path_factory):
    """Both pods started together and left alone: the uninterrupted run."""
    tmp = tmp_path_factory.mktemp("k8s-pods")
    with rendered_pods(tmp, "ref") as cluster:
        pods = [cluster.start(i) for i in range(2)]
        codes = [pod.wait(POD_TIMEOUT) for pod in pods]
        assert codes == [0, 0], cluster.logs()
        run_dir = tmp / "runs" / "ref"
        return cluster, run_dir


def test_pods_rendezvous_and_train_into_one_run_directory(pod_reference):
    cluster, run_dir = pod_reference
    assert summary(run_dir)["steps"] == 60
    # As UID 1000 (security=restricted, the default): it wrote the run files, into a runs
    # volume made by root, through fsGroup; its data cache was its own HOME emptyDir's.
    assert cluster.pod_spec["securityContext"]["runAsUser"] == 1000
    written = [p for p in run_dir.rglob("*") if "submit" not in p.relative_to(run_dir).parts]
    assert written and {p.stat().st_uid for p in written} == {1000}  # submit/ is the test's
    assert run_dir.parent.stat().st_gid == 1000  # OnRootMismatch gave the volume's root
    homes = list(cluster.state_dir.glob("pod*.volumes/home/.cache/launcher"))
    assert len(homes) == 2 and all(any(h.iterdir()) for h in homes)
    assert sorted(p.name for p in (run_dir / "logs").iterdir()) == [
        "nodes", "rank0.log", "rank1.log"
    ]  # fmt: skip
    # each pod's launcher.torchrun kept its heartbeat there, and left it saying it ended
    beats = [yaml.safe_load(p.read_text()) for p in (run_dir / "logs" / "nodes").iterdir()]
    assert sorted((b["ranks"], b["ended"]) for b in beats) == [([0], 0), ([1], 0)]
    env = yaml.safe_load((run_dir / "env.json").read_text())
    # The trainer saw the pod's hostname and a /dev/shm of the rendered sizeLimit.
    assert env["hostname"] in ("launcher-ref-0", "launcher-ref-1")
    size = cluster.pod_spec["volumes"][0]["emptyDir"]["sizeLimit"]
    # The loaders' 1 MiB and the memory tier's two copies of the state (on by default under
    # torchrun's restarts, which the pods run with).
    assert env["shm"]["size_bytes"] == k8s_check.parse_quantity(size, "shm") > 2**20
    assert 0 < env["shm"]["need_bytes"] <= env["shm"]["size_bytes"]


def test_killed_pod_started_again_rejoins_and_the_run_resumes(pod_reference, tmp_path):
    _, reference_dir = pod_reference
    run_dir = tmp_path / "runs" / "killed"
    latest = run_dir / "checkpoints" / "latest"
    with rendered_pods(tmp_path, "killed") as cluster:
        pods = [cluster.start(i) for i in range(2)]
        deadline = time.monotonic() + POD_TIMEOUT
        while not latest.exists():
            assert all(p.proc.poll() is None for p in pods), cluster.logs()
            assert time.monotonic() < deadline, cluster.logs()
            time.sleep(0.02)
        pods[1].kill()  # the node goes away; the Job controller makes a new pod 1
        assert not (run_dir / "summary.json").exists()  # killed mid-run
        pods[1] = cluster.start(1)
        codes = [pod.wait(POD_TIMEOUT) for pod in pods]
        assert codes == [0, 0], cluster.logs()
        assert (pods[0].starts, pods[1].starts) == (1, 2)  # pod 0 survived and rejoined
    logs = "".join((run_dir / "logs" / f"rank{r}.log").read_text() for r in (0, 1))
    resumed = [int(ln.rsplit(" ", 1)[1]) for ln in logs.splitlines() if "resumed from step" in ln]
    assert len(resumed) == 2 and resumed[0] == resumed[1] and 10 <= resumed[0] < 60, logs
    assert summary(run_dir)["steps"] == 60
    assert losses(run_dir) == losses(reference_dir)  # every step, the redone ones included


def test_sigterm_to_the_pods_stops_with_a_checkpoint_and_143(tmp_path):
    """Deleting the Job, or a preemption of it: the kubelet sends SIGTERM to every pod's
    process (python -m launcher.torchrun). With the default DataLoader workers every rank
    checkpoints at the same step, and each pod exits 143 (stopped with a checkpoint) within
    terminationGracePeriodSeconds, because torchrun's shutdown timeout is set below it.
    Needs launcher.torchrun's exit code 143 and the trainer's stop with workers on."""
    defaults = [o for o in POD_RUN if not o.startswith("data.")]  # default DataLoader workers
    run_dir = tmp_path / "runs" / "stopped"
    with rendered_pods(tmp_path, "stopped", defaults) as cluster:
        env = cluster.pod_spec["containers"][0]["env"]
        grace = cluster.pod_spec["terminationGracePeriodSeconds"]
        assert {"name": "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "value": str(grace - 10)} in env
        pods = [cluster.start(i) for i in range(2)]
        deadline = time.monotonic() + POD_TIMEOUT
        while not (
            (run_dir / "metrics.jsonl").exists()
            and any(r.get("step", 0) >= 3 for r in metrics(run_dir))
        ):
            assert all(p.proc.poll() is None for p in pods), cluster.logs()
            assert time.monotonic() < deadline, cluster.logs()
            time.sleep(0.05)
        for pod in pods:
            pod.sigterm()
        codes = [pod.wait_or_kill(grace) for pod in pods]
        assert codes == [143, 143], cluster.logs()
    s = summary(run_dir)
    assert s["status"] == "stopped" and 3 <= s["steps"] < 60, s
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    assert latest == f"step_{s['steps']:08d}", latest  # the stop checkpoint, complete
    assert (run_dir / "checkpoints" / latest / "meta.json").is_file()


@pytest.mark.parametrize(
    "override",
    [
        "cluster.k8s.priority_class=high",
        "cluster.k8s.ttl_after_finished_s=3600",
        "cluster.k8s.topology_spread_key=kubernetes.io/hostname",
        "cluster.k8s.image_pull_policy=Always",
        "cluster.workdir=/workspace",
        "cluster.k8s.gang=volcano",
    ],
)
def test_a_trainjob_refuses_what_it_cannot_carry(tmp_path, capsys, override):
    """Kubeflow Trainer's runtime patch has no field for these (the CRD's schema): a
    TrainJob would drop them without a word, so each is one line naming the key and where
    it goes instead; the other kinds carry it."""
    key = override.split("=")[0]
    args = [*EXAMPLE[:3], f"run.root={tmp_path}", "run.id=tj", override]
    queue = ["cluster.k8s.queue=research"] if "volcano" in override else []
    assert main(["k8s", "--dry-run", "cluster.k8s.kind=trainjob", *args, *queue]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {key}="), err
    assert "a TrainJob cannot set" in err and "cluster.k8s.kind=jobset" in err
    assert not (tmp_path / "tj").exists()
    assert main(["k8s", "--dry-run", "cluster.k8s.kind=jobset", *args, *queue]) == 0
