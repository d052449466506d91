"""Check rendered Kubernetes manifests for what schema validation cannot see.

`kubernetes-validate --strict` catches a misspelt field, but a Job whose mount names no
volume, whose GPU request differs from its limit, whose /dev/shm cannot hold the loaders'
batches or whose rendezvous host names no Service's pod is well-formed and fails only on
the cluster, minutes later. `check` looks at the objects the renderer built and raises
ConfigError with one line naming the object, the field and the cluster.* key to change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from launcher.config import ConfigError
from launcher.config.secret_keys import is_secret_key
from launcher.submit import pod_security

SHM_PATH = "/dev/shm"
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_MAX = 63

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"m": Decimal("0.001"), "": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_DECIMAL.update({"P": 10**15, "E": 10**18})
_QUANTITY = re.compile(r"^([+]?[0-9]+(?:\.[0-9]*)?|[+]?\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|[mkMGTPE]?)$")


def parse_quantity(text: object, what: str) -> Decimal:
    """A Kubernetes quantity ("64Gi", "1500M", "8", "500m") as a number; ConfigError if not."""
    match = _QUANTITY.match(str(text).strip())
    if not match:
        raise ConfigError(
            f"{what}={text!r}: not a Kubernetes quantity; write e.g. 64Gi, 512Mi, 8 or 500m"
        )
    try:
        number = Decimal(match.group(1))
    except InvalidOperation:
        raise ConfigError(f"{what}={text!r}: not a Kubernetes quantity") from None
    suffix = match.group(2)
    return number * (_BINARY.get(suffix) or _DECIMAL[suffix])


def format_bytes(n: int) -> str:
    """Bytes as a quantity, rounded up to whole MiB: "1025Mi", or "2Gi" when exact."""
    mib = -(-int(n) // 2**20)
    return f"{mib // 1024}Gi" if mib and mib % 1024 == 0 else f"{mib}Mi"


@dataclass
class Expect:
    """What the manifests must agree with: the job as the launcher composed it."""

    nodes: int
    procs_per_node: int
    gpus_per_node: int
    gpu_resource: str
    shm_need: int  # bytes of /dev/shm one pod's loaders need
    process_memory: int  # bytes the processes get besides /dev/shm (cluster.k8s.memory, plan)
    rdzv_port: int
    security: str = "restricted"  # Pod Security's 'restricted' profile; root: not checked
    guaranteed: bool = False  # CPU limit = request (QoS Guaranteed)
    rdma_resource: str | None = None  # requested with IPC_LOCK when set


def check(objects: list[dict], expect: Expect) -> None:
    """Raise ConfigError on the first problem found in the rendered objects."""
    for obj in objects:
        _check_name(obj)
    kinds = {obj["kind"]: obj for obj in objects}
    if "Job" in kinds:
        _check_job(kinds["Job"], kinds.get("Service"), expect)
    elif "JobSet" in kinds:
        _check_jobset(kinds["JobSet"], expect)
    elif "PyTorchJob" in kinds:
        _check_pytorchjob(kinds["PyTorchJob"], expect)
    elif "TrainJob" in kinds:
        _check_trainjob(kinds["TrainJob"], expect)
    else:
        raise ConfigError(f"no Job, JobSet, PyTorchJob or TrainJob among {sorted(kinds)}")


def _where(obj: dict) -> str:
    return f"{obj['kind']} {obj['metadata'].get('name')!r}"


def _check_name(obj: dict) -> None:
    name = str(obj["metadata"].get("name", ""))
    pattern, rule = (
        (DNS1035_LABEL, "start with a letter")
        if obj["kind"] == "Service"
        else (DNS1123_LABEL, "start and end with a letter or digit")
    )
    if len(name) > LABEL_MAX or not pattern.match(name):
        raise ConfigError(
            f"{obj['kind']} metadata.name={name!r} is not a valid DNS label (lower-case "
            f"letters, digits and '-', {rule}, at most {LABEL_MAX} characters); set "
            "cluster.k8s.name, or cluster.job_name and run.id"
        )


def _label(value: str, field: str, obj: dict, fix: str) -> None:
    if len(value) > LABEL_MAX or not DNS1123_LABEL.match(value):
        raise ConfigError(
            f"{_where(obj)}: {field}={value!r} is not a valid DNS label (lower-case letters, "
            f"digits and '-', at most {LABEL_MAX} characters); {fix}"
        )


def _check_job(job: dict, service: dict | None, expect: Expect) -> None:
    spec = job["spec"]
    name = job["metadata"]["name"]
    for key, want in (
        ("completionMode", "Indexed"),
        ("completions", expect.nodes),
        ("parallelism", expect.nodes),
    ):
        if spec.get(key) != want:
            raise ConfigError(
                f"{_where(job)}: spec.{key}={spec.get(key)!r}, expected {want!r} "
                f"(one pod per node, cluster.nodes={expect.nodes})"
            )
    _check_failure_policy(job, spec, "spec")
    pod = spec["template"]
    _check_pod(job, pod, "spec.template", expect, "Never")
    last = f"{name}-{expect.nodes - 1}"
    _label(last, "the last pod's hostname", job, "shorten cluster.k8s.name")
    if service is None:
        raise ConfigError(f"{_where(job)}: no headless Service for the rendezvous was rendered")
    subdomain = pod["spec"].get("subdomain")
    if subdomain != service["metadata"]["name"]:
        raise ConfigError(
            f"{_where(job)}: spec.template.spec.subdomain={subdomain!r} does not name the "
            f"Service {service['metadata']['name']!r}: the pods get no DNS names"
        )
    _check_service(service, pod, expect)
    _check_endpoint(job, pod, "spec.template", f"{name}-0.{subdomain}", expect)


def _check_failure_policy(obj: dict, spec: dict, path: str) -> None:
    rules = (spec.get("podFailurePolicy") or {}).get("rules", [])
    ignores_disruption = any(
        r.get("action") == "Ignore"
        and any(c.get("type") == "DisruptionTarget" for c in r.get("onPodConditions", []))
        for r in rules
    )
    if not ignores_disruption:
        raise ConfigError(
            f"{_where(obj)}: {path}.podFailurePolicy has no Ignore rule for DisruptionTarget: "
            "a preempted or evicted pod would count against backoffLimit"
        )
    fails_at_once = {
        code
        for r in rules
        if r.get("action") == "FailJob" and (r.get("onExitCodes") or {}).get("operator") == "In"
        for code in r["onExitCodes"].get("values", [])
    }
    if not {2, 3} <= fails_at_once:
        raise ConfigError(
            f"{_where(obj)}: {path}.podFailurePolicy does not fail the Job at once on exit "
            f"codes 2 (bad input) and 3 (non-finite loss) (FailJob on {sorted(fails_at_once)}): "
            "the pods would be retried with input that cannot work"
        )


def _check_service(service: dict, pod: dict, expect: Expect) -> None:
    spec = service["spec"]
    if spec.get("clusterIP") != "None":
        raise ConfigError(
            f"{_where(service)}: spec.clusterIP={spec.get('clusterIP')!r}: must be 'None' "
            "(headless), so that each pod gets its own DNS name"
        )
    if spec.get("publishNotReadyAddresses") is not True:
        raise ConfigError(
            f"{_where(service)}: spec.publishNotReadyAddresses must be true: the pods must "
            "find each other before any of them is ready"
        )
    labels = pod["metadata"].get("labels", {})
    selector = spec.get("selector") or {}
    unmatched = {k: v for k, v in selector.items() if labels.get(k) != v}
    if not selector or unmatched:
        raise ConfigError(
            f"{_where(service)}: spec.selector={selector} does not select the Job's pods "
            f"(their labels: {labels}); the rendezvous name would not resolve"
        )
    ports = [p.get("port") for p in spec.get("ports", [])]
    if expect.rdzv_port not in ports:
        raise ConfigError(
            f"{_where(service)}: spec.ports {ports} lack the rendezvous port "
            f"cluster.rdzv_port={expect.rdzv_port}"
        )


def _check_jobset(jobset: dict, expect: Expect) -> None:
    spec = jobset["spec"]
    network = spec.get("network") or {}
    if network.get("enableDNSHostnames") is not True:
        raise ConfigError(
            f"{_where(jobset)}: spec.network.enableDNSHostnames must be true: the pods find "
            "the rendezvous host by its DNS name"
        )
    replicated = spec.get("replicatedJobs") or []
    if len(replicated) != 1 or replicated[0].get("replicas") != 1:
        raise ConfigError(f"{_where(jobset)}: spec.replicatedJobs must be one Job, replicas: 1")
    rjob = replicated[0]
    job_spec = rjob["template"]["spec"]
    base = "spec.replicatedJobs[0].template.spec"
    for key, want in (
        ("completionMode", "Indexed"),
        ("completions", expect.nodes),
        ("parallelism", expect.nodes),
    ):
        if job_spec.get(key) != want:
            raise ConfigError(
                f"{_where(jobset)}: {base}.{key}={job_spec.get(key)!r}, expected {want!r}"
            )
    _check_failure_policy(jobset, job_spec, base)
    if job_spec.get("backoffLimit") != 0:
        raise ConfigError(
            f"{_where(jobset)}: {base}.backoffLimit={job_spec.get('backoffLimit')!r}, expected "
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
            f"{_where(jobset)}: spec.failurePolicy.rules has no FailJobSet rule on "
            "PodFailurePolicy: a Job failed for bad input would be restarted"
        )
    if "activeDeadlineSeconds" in job_spec and "DeadlineExceeded" not in fails_on:
        raise ConfigError(
            f"{_where(jobset)}: spec.failurePolicy.rules has no FailJobSet rule on "
            f"DeadlineExceeded: each restart would get a fresh {base}.activeDeadlineSeconds "
            "and the set would run past cluster.time_limit"
        )
    pod = job_spec["template"]
    _check_pod(jobset, pod, f"{base}.template", expect, "Never")
    name = jobset["metadata"]["name"]
    subdomain = network.get("subdomain") or name
    _label(
        f"{name}-{rjob['name']}-0-{expect.nodes - 1}",
        "the last pod's hostname",
        jobset,
        "shorten cluster.k8s.name",
    )
    _check_endpoint(
        jobset, pod, f"{base}.template", f"{name}-{rjob['name']}-0-0.{subdomain}", expect
    )


def _check_pytorchjob(ptj: dict, expect: Expect) -> None:
    replicas = ptj["spec"].get("pytorchReplicaSpecs") or {}
    name = ptj["metadata"]["name"]
    want = {"Master": 1, "Worker": expect.nodes - 1}
    for role, count in want.items():
        got = (replicas.get(role) or {}).get("replicas", 0)
        if got != count:
            raise ConfigError(
                f"{_where(ptj)}: spec.pytorchReplicaSpecs.{role}.replicas={got}, expected "
                f"{count} (cluster.nodes={expect.nodes})"
            )
    for role, rspec in replicas.items():
        path = f"spec.pytorchReplicaSpecs.{role}.template"
        pod = rspec["template"]
        _check_pod(ptj, pod, path, expect, None)
        if pod["spec"]["containers"][0]["name"] != "pytorch":
            raise ConfigError(f"{_where(ptj)}: {path}.spec.containers[0].name must be 'pytorch'")
        _check_endpoint(ptj, pod, path, f"{name}-master-0", expect)


def _check_trainjob(tj: dict, expect: Expect) -> None:
    """The pod a TrainJob's node runs, as its trainer and its runtime patch make it up
    (the runtime adds the rest), checked as any other kind's."""
    spec = tj["spec"]
    trainer = spec.get("trainer") or {}
    if trainer.get("numNodes") != expect.nodes:
        raise ConfigError(
            f"{_where(tj)}: spec.trainer.numNodes={trainer.get('numNodes')!r}, expected "
            f"{expect.nodes} (cluster.nodes)"
        )
    patches = spec.get("runtimePatches") or []
    path = "spec.runtimePatches[0].trainingRuntimeSpec.template.spec.replicatedJobs[0]"
    try:
        rjob = patches[0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
        pod = rjob["template"]["spec"]["template"]
    except (IndexError, KeyError):
        raise ConfigError(f"{_where(tj)}: {path}.template.spec.template is missing") from None
    container = {**pod["spec"]["containers"][0], **trainer}
    container["resources"] = trainer.get("resourcesPerNode") or {}
    merged = {**pod, "spec": {**pod["spec"], "containers": [container]}}
    _check_pod(tj, merged, f"{path}.template.spec.template", expect, None)
    name = tj["metadata"]["name"]
    _check_endpoint(tj, merged, path, f"{name}-{rjob['name']}-0-0.{name}", expect)


def _check_pod(obj: dict, pod: dict, path: str, expect: Expect, restart: str | None) -> None:
    spec = pod["spec"]
    if restart and spec.get("restartPolicy") != restart:
        raise ConfigError(
            f"{_where(obj)}: {path}.spec.restartPolicy={spec.get('restartPolicy')!r}, expected "
            f"{restart!r}: the Job controller, not the kubelet, must replace a failed pod"
        )
    volumes = {}
    for i, vol in enumerate(spec.get("volumes", [])):
        _label(vol["name"], f"{path}.spec.volumes[{i}].name", obj, "rename the volume")
        if vol["name"] in volumes:
            raise ConfigError(f"{_where(obj)}: {path}.spec.volumes: {vol['name']!r} twice")
        volumes[vol["name"]] = vol
    containers = spec.get("containers") or []
    if not containers:
        raise ConfigError(f"{_where(obj)}: {path}.spec.containers is empty")
    for c, container in enumerate(containers):
        where = f"{path}.spec.containers[{c}]"
        _label(container["name"], f"{where}.name", obj, "rename the container")
        shm_volume = _check_mounts(obj, container, where, volumes)
        _check_resources(obj, container, where, expect)
        _check_env(obj, container, where)
        if shm_volume is None:
            raise ConfigError(
                f"{_where(obj)}: {where} mounts nothing at {SHM_PATH}: the container runtime's "
                "default (often 64 MiB) would kill multi-worker DataLoaders with a bus error"
            )
        _check_shm(obj, container, where, shm_volume, path, expect)
        _check_shutdown(obj, container, where, spec, path)
        _check_security(obj, container, where, spec, path, expect)


def _check_shutdown(obj: dict, container: dict, where: str, spec: dict, path: str) -> None:
    """torchrun must end its workers (which checkpoint on SIGTERM) before the kubelet's
    SIGKILL: TORCH_ELASTIC_SHUTDOWN_TIMEOUT below terminationGracePeriodSeconds."""
    grace = spec.get("terminationGracePeriodSeconds", 30)
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    timeout = env.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")
    if timeout is None or not str(timeout).isdigit() or int(timeout) >= grace:
        raise ConfigError(
            f"{_where(obj)}: {where}.env TORCH_ELASTIC_SHUTDOWN_TIMEOUT={timeout} must be set "
            f"and below {path}.spec.terminationGracePeriodSeconds={grace}: torchrun kills its "
            "workers 30 s after SIGTERM by default, before their stop checkpoint is written"
        )


def _check_security(obj, container, where, spec, path, expect: Expect) -> None:
    """security=restricted: Pod Security's 'restricted' rules (pod_security; IPC_LOCK for
    RDMA is the one documented exception), a writable HOME, and fsGroup for the volumes;
    guaranteed: CPU limit = request."""
    context = container.get("securityContext") or {}
    caps = context.get("capabilities") or {}
    if expect.security == "restricted":
        broken = [
            v
            for v in pod_security.violations(spec)
            if not (expect.rdma_resource and v.endswith(": IPC_LOCK breaks baseline or restricted"))
        ]
        if broken:
            raise ConfigError(
                f"{_where(obj)}: {path}.{broken[0]} (Pod Security 'restricted'); "
                f"{len(broken)} rule(s) broken"
            )
        _check_writable_home(obj, container, where, spec, path)
    if expect.rdma_resource and "IPC_LOCK" not in caps.get("add", []):
        raise ConfigError(
            f"{_where(obj)}: {where}: RDMA ({expect.rdma_resource}) needs the IPC_LOCK "
            "capability to pin memory; without it NCCL falls back to TCP"
        )
    resources = container.get("resources") or {}
    requests, limits = resources.get("requests", {}), resources.get("limits", {})
    if expect.guaranteed and str(limits.get("cpu")) != str(requests.get("cpu")):
        raise ConfigError(
            f"{_where(obj)}: {where}.resources: limits.cpu={limits.get('cpu')!r} differs from "
            f"requests.cpu={requests.get('cpu')!r}: the pod is not Guaranteed QoS"
        )


def _check_writable_home(obj, container, where, spec, path) -> None:
    """A non-root UID has no home in most images: HOME must be an emptyDir mount, and the
    volumes' group (fsGroup) the UID's, so that it can write a root-owned runs volume."""
    home = next((e.get("value") for e in container.get("env", []) if e["name"] == "HOME"), None)
    empty = {v["name"] for v in spec.get("volumes", []) if "emptyDir" in v}
    mounted = {m["mountPath"] for m in container.get("volumeMounts", []) if m["name"] in empty}
    if home not in mounted:
        raise ConfigError(
            f"{_where(obj)}: {where}.env HOME={home} is not a mounted emptyDir: the non-root "
            "UID could write no cache or home files"
        )
    pod_ctx = spec.get("securityContext") or {}
    if pod_ctx.get("fsGroup") is None:
        raise ConfigError(
            f"{_where(obj)}: {path}.spec.securityContext.fsGroup is missing: the non-root UID "
            "cannot write a volume made by root"
        )


def _check_mounts(obj: dict, container: dict, where: str, volumes: dict) -> dict | None:
    shm = None
    paths = set()
    for m, mount in enumerate(container.get("volumeMounts", [])):
        if mount["name"] not in volumes:
            raise ConfigError(
                f"{_where(obj)}: {where}.volumeMounts[{m}].name={mount['name']!r} names no "
                f"volume (volumes: {', '.join(volumes) or 'none'})"
            )
        path = mount["mountPath"]
        if not path.startswith("/") or path in paths:
            raise ConfigError(
                f"{_where(obj)}: {where}.volumeMounts[{m}].mountPath={path!r} is not an "
                "absolute path mounted once; run.root must be an absolute path"
            )
        paths.add(path)
        if path == SHM_PATH:
            shm = (volumes[mount["name"]], f"{where}.volumeMounts[{m}]")
    return shm


def _check_resources(obj: dict, container: dict, where: str, expect: Expect) -> None:
    resources = container.get("resources") or {}
    requests, limits = resources.get("requests", {}), resources.get("limits", {})
    for key in sorted(set(requests) | set(limits)):
        if "/" not in key:
            continue  # cpu, memory, ephemeral-storage may differ
        if str(requests.get(key)) != str(limits.get(key)):
            raise ConfigError(
                f"{_where(obj)}: {where}.resources: requests[{key!r}]={requests.get(key)!r} "
                f"differs from limits[{key!r}]={limits.get(key)!r}; extended resources such as "
                "GPUs must be requested exactly as limited"
            )
    gpus = int(limits.get(expect.gpu_resource, 0))
    if gpus != expect.gpus_per_node:
        raise ConfigError(
            f"{_where(obj)}: {where}.resources.limits[{expect.gpu_resource!r}]={gpus}, but "
            f"cluster.gpus_per_node={expect.gpus_per_node}"
        )
    text = " ".join(map(str, container.get("command", []) + container.get("args", [])))
    procs = re.search(r"--nproc-per-node[= ](\d+)", text)
    if not procs or int(procs.group(1)) != expect.procs_per_node:
        raise ConfigError(
            f"{_where(obj)}: {where}: torchrun --nproc-per-node "
            f"{procs.group(1) if procs else 'missing'}, expected {expect.procs_per_node} "
            f"(one process per GPU, cluster.gpus_per_node={expect.gpus_per_node})"
        )


def _check_env(obj: dict, container: dict, where: str) -> None:
    for e, env in enumerate(container.get("env", [])):
        if "value" in env and is_secret_key(env["name"]):
            raise ConfigError(
                f"{_where(obj)}: {where}.env[{e}] {env['name']} is a secret written into the "
                "manifest; remove it from cluster.env and give it through a Secret "
                "(cluster.k8s.wandb_secret for WANDB_API_KEY)"
            )


def _check_shm(obj, container, where, shm, path, expect: Expect) -> None:
    volume, mount_where = shm
    empty_dir = volume.get("emptyDir")
    if empty_dir is None or empty_dir.get("medium") != "Memory":
        raise ConfigError(
            f"{_where(obj)}: {mount_where} mounts volume {volume['name']!r} at {SHM_PATH}, "
            "which is not an emptyDir with medium: Memory"
        )
    if "sizeLimit" not in empty_dir:
        raise ConfigError(
            f"{_where(obj)}: volume {volume['name']!r} (/dev/shm) has no sizeLimit: it could "
            "grow to the node's memory"
        )
    size = parse_quantity(empty_dir["sizeLimit"], f"{path}.spec.volumes.{volume['name']}.sizeLimit")
    if size < expect.shm_need:
        raise ConfigError(
            f"{_where(obj)}: /dev/shm sizeLimit {empty_dir['sizeLimit']} is less than the "
            f"{format_bytes(expect.shm_need)} this config's DataLoader workers and memory "
            "tier need per pod (data.num_workers x data.prefetch_factor x batch, and the "
            "memory tier's two copies of the state, x processes per node); raise "
            "cluster.k8s.shm_size (or leave it null) or lower data.num_workers / "
            "data.prefetch_factor"
        )
    limits = (container.get("resources") or {}).get("limits", {})
    if "memory" not in limits:
        raise ConfigError(
            f"{_where(obj)}: {where}.resources.limits.memory is missing: a memory-backed "
            "/dev/shm counts against the pod's memory and needs a limit that holds it"
        )
    memory = parse_quantity(limits["memory"], f"{where}.resources.limits.memory")
    if memory - size < expect.process_memory:
        raise ConfigError(
            f"{_where(obj)}: {where}.resources.limits.memory={limits['memory']} leaves "
            f"{format_bytes(int(max(memory - size, 0)))} beside /dev/shm's sizeLimit "
            f"{empty_dir['sizeLimit']}, less than the {format_bytes(expect.process_memory)} "
            "the processes get (cluster.k8s.memory, or the plan's); memory-backed "
            "emptyDir pages count against the container's memory"
        )


def _check_endpoint(obj: dict, pod: dict, path: str, host: str, expect: Expect) -> None:
    container = pod["spec"]["containers"][0]
    text = " ".join(map(str, container.get("command", []) + container.get("args", [])))
    found = re.search(r"--rdzv-endpoint[= ]([^\s'\"]+)", text)
    want = f"{host}:{expect.rdzv_port}"
    if not found or found.group(1) != want:
        raise ConfigError(
            f"{_where(obj)}: {path}.spec.containers[0]: torchrun --rdzv-endpoint="
            f"{found.group(1) if found else 'missing'}, but the first pod's DNS name is {want}"
        )
