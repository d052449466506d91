"""Check rendered Kubernetes manifests for what schema validation cannot see.

`kubernetes-validate --strict` catches a misspelt field, but a Job whose mount names no
volume, whose GPU request differs from its limit, whose /dev/shm cannot hold the loaders'
batches or whose rendezvous host names no Service's pod is well-formed and fails only on
the cluster, minutes later. `check` looks at the objects the renderer built and raises
ConfigError with one line naming the object, the field and the cluster.* key to change.

What every kind's pods must hold (mounts, resources, /dev/shm, the stop's grace, security,
the rendezvous endpoint) is checked here; each Kubernetes kind (launcher.submit.k8s.kind)
checks its own workload object with these pieces, beside the code that renders it, so a new
kind edits nothing here.
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


def check(objects: list[dict], expect: Expect, kind) -> None:
    """Raise ConfigError on the first problem found in the rendered objects: every name,
    then `kind`'s own check of its workload (a `Kind`, launcher.submit.k8s.kind)."""
    for obj in objects:
        check_name(obj)
    kind.check(objects, expect)


def the(objects: list[dict], kubernetes_kind: str) -> dict:
    """The rendered object of that Kubernetes `kind`; ConfigError if there is none."""
    found = [obj for obj in objects if obj["kind"] == kubernetes_kind]
    if not found:
        raise ConfigError(f"no {kubernetes_kind} among {sorted(o['kind'] for o in objects)}")
    return found[0]


def named(obj: dict) -> str:
    return f"{obj['kind']} {obj['metadata'].get('name')!r}"


def check_name(obj: dict) -> None:
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


def label(value: str, field: str, obj: dict, fix: str) -> None:
    if len(value) > LABEL_MAX or not DNS1123_LABEL.match(value):
        raise ConfigError(
            f"{named(obj)}: {field}={value!r} is not a valid DNS label (lower-case letters, "
            f"digits and '-', at most {LABEL_MAX} characters); {fix}"
        )


def check_indexed(obj: dict, spec: dict, path: str, expect: Expect) -> None:
    """An Indexed Job's spec (a Job's, or the one a JobSet replicates): one pod per node,
    failed at once on what a retry cannot help, a disruption not counted."""
    for key, want in (
        ("completionMode", "Indexed"),
        ("completions", expect.nodes),
        ("parallelism", expect.nodes),
    ):
        if spec.get(key) != want:
            raise ConfigError(
                f"{named(obj)}: {path}.{key}={spec.get(key)!r}, expected {want!r} "
                f"(one pod per node, cluster.nodes={expect.nodes})"
            )
    check_failure_policy(obj, spec, path)


def check_failure_policy(obj: dict, spec: dict, path: str) -> None:
    rules = (spec.get("podFailurePolicy") or {}).get("rules", [])
    ignores_disruption = any(
        r.get("action") == "Ignore"
        and any(c.get("type") == "DisruptionTarget" for c in r.get("onPodConditions", []))
        for r in rules
    )
    if not ignores_disruption:
        raise ConfigError(
            f"{named(obj)}: {path}.podFailurePolicy has no Ignore rule for DisruptionTarget: "
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
            f"{named(obj)}: {path}.podFailurePolicy does not fail the Job at once on exit "
            f"codes 2 (bad input) and 3 (non-finite loss) (FailJob on {sorted(fails_at_once)}): "
            "the pods would be retried with input that cannot work"
        )


def check_pod(obj: dict, pod: dict, path: str, expect: Expect, restart: str | None) -> None:
    spec = pod["spec"]
    if restart and spec.get("restartPolicy") != restart:
        raise ConfigError(
            f"{named(obj)}: {path}.spec.restartPolicy={spec.get('restartPolicy')!r}, expected "
            f"{restart!r}: the Job controller, not the kubelet, must replace a failed pod"
        )
    volumes = {}
    for i, vol in enumerate(spec.get("volumes", [])):
        label(vol["name"], f"{path}.spec.volumes[{i}].name", obj, "rename the volume")
        if vol["name"] in volumes:
            raise ConfigError(f"{named(obj)}: {path}.spec.volumes: {vol['name']!r} twice")
        volumes[vol["name"]] = vol
    containers = spec.get("containers") or []
    if not containers:
        raise ConfigError(f"{named(obj)}: {path}.spec.containers is empty")
    for c, container in enumerate(containers):
        where = f"{path}.spec.containers[{c}]"
        label(container["name"], f"{where}.name", obj, "rename the container")
        shm_volume = _check_mounts(obj, container, where, volumes)
        _check_resources(obj, container, where, expect)
        _check_env(obj, container, where)
        if shm_volume is None:
            raise ConfigError(
                f"{named(obj)}: {where} mounts nothing at {SHM_PATH}: the container runtime's "
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
            f"{named(obj)}: {where}.env TORCH_ELASTIC_SHUTDOWN_TIMEOUT={timeout} must be set "
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
                f"{named(obj)}: {path}.{broken[0]} (Pod Security 'restricted'); "
                f"{len(broken)} rule(s) broken"
            )
        _check_writable_home(obj, container, where, spec, path)
    if expect.rdma_resource and "IPC_LOCK" not in caps.get("add", []):
        raise ConfigError(
            f"{named(obj)}: {where}: RDMA ({expect.rdma_resource}) needs the IPC_LOCK "
            "capability to pin memory; without it NCCL falls back to TCP"
        )
    resources = container.get("resources") or {}
    requests, limits = resources.get("requests", {}), resources.get("limits", {})
    if expect.guaranteed and str(limits.get("cpu")) != str(requests.get("cpu")):
        raise ConfigError(
            f"{named(obj)}: {where}.resources: limits.cpu={limits.get('cpu')!r} differs from "
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
            f"{named(obj)}: {where}.env HOME={home} is not a mounted emptyDir: the non-root "
            "UID could write no cache or home files"
        )
    pod_ctx = spec.get("securityContext") or {}
    if pod_ctx.get("fsGroup") is None:
        raise ConfigError(
            f"{named(obj)}: {path}.spec.securityContext.fsGroup is missing: the non-root UID "
            "cannot write a volume made by root"
        )


def _check_mounts(obj: dict, container: dict, where: str, volumes: dict) -> dict | None:
    shm = None
    paths = set()
    for m, mount in enumerate(container.get("volumeMounts", [])):
        if mount["name"] not in volumes:
            raise ConfigError(
                f"{named(obj)}: {where}.volumeMounts[{m}].name={mount['name']!r} names no "
                f"volume (volumes: {', '.join(volumes) or 'none'})"
            )
        path = mount["mountPath"]
        if not path.startswith("/") or path in paths:
            raise ConfigError(
                f"{named(obj)}: {where}.volumeMounts[{m}].mountPath={path!r} is not an "
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
                f"{named(obj)}: {where}.resources: requests[{key!r}]={requests.get(key)!r} "
                f"differs from limits[{key!r}]={limits.get(key)!r}; extended resources such as "
                "GPUs must be requested exactly as limited"
            )
    gpus = int(limits.get(expect.gpu_resource, 0))
    if gpus != expect.gpus_per_node:
        raise ConfigError(
            f"{named(obj)}: {where}.resources.limits[{expect.gpu_resource!r}]={gpus}, but "
            f"cluster.gpus_per_node={expect.gpus_per_node}"
        )
    text = " ".join(map(str, container.get("command", []) + container.get("args", [])))
    procs = re.search(r"--nproc-per-node[= ](\d+)", text)
    if not procs or int(procs.group(1)) != expect.procs_per_node:
        raise ConfigError(
            f"{named(obj)}: {where}: torchrun --nproc-per-node "
            f"{procs.group(1) if procs else 'missing'}, expected {expect.procs_per_node} "
            f"(one process per GPU, cluster.gpus_per_node={expect.gpus_per_node})"
        )


def _check_env(obj: dict, container: dict, where: str) -> None:
    for e, env in enumerate(container.get("env", [])):
        if "value" in env and is_secret_key(env["name"]):
            raise ConfigError(
                f"{named(obj)}: {where}.env[{e}] {env['name']} is a secret written into the "
                "manifest; remove it from cluster.env and give it through a Secret "
                "(cluster.k8s.wandb_secret for WANDB_API_KEY)"
            )


def _check_shm(obj, container, where, shm, path, expect: Expect) -> None:
    volume, mount_where = shm
    empty_dir = volume.get("emptyDir")
    if empty_dir is None or empty_dir.get("medium") != "Memory":
        raise ConfigError(
            f"{named(obj)}: {mount_where} mounts volume {volume['name']!r} at {SHM_PATH}, "
            "which is not an emptyDir with medium: Memory"
        )
    if "sizeLimit" not in empty_dir:
        raise ConfigError(
            f"{named(obj)}: volume {volume['name']!r} (/dev/shm) has no sizeLimit: it could "
            "grow to the node's memory"
        )
    size = parse_quantity(empty_dir["sizeLimit"], f"{path}.spec.volumes.{volume['name']}.sizeLimit")
    if size < expect.shm_need:
        raise ConfigError(
            f"{named(obj)}: /dev/shm sizeLimit {empty_dir['sizeLimit']} is less than the "
            f"{format_bytes(expect.shm_need)} this config's DataLoader workers and memory "
            "tier need per pod (data.num_workers x data.prefetch_factor x batch, and the "
            "memory tier's two copies of the state, x processes per node); raise "
            "cluster.k8s.shm_size (or leave it null) or lower data.num_workers / "
            "data.prefetch_factor"
        )
    limits = (container.get("resources") or {}).get("limits", {})
    if "memory" not in limits:
        raise ConfigError(
            f"{named(obj)}: {where}.resources.limits.memory is missing: a memory-backed "
            "/dev/shm counts against the pod's memory and needs a limit that holds it"
        )
    memory = parse_quantity(limits["memory"], f"{where}.resources.limits.memory")
    if memory - size < expect.process_memory:
        raise ConfigError(
            f"{named(obj)}: {where}.resources.limits.memory={limits['memory']} leaves "
            f"{format_bytes(int(max(memory - size, 0)))} beside /dev/shm's sizeLimit "
            f"{empty_dir['sizeLimit']}, less than the {format_bytes(expect.process_memory)} "
            "the processes get (cluster.k8s.memory, or the plan's); memory-backed "
            "emptyDir pages count against the container's memory"
        )


def check_endpoint(obj: dict, pod: dict, path: str, host: str, expect: Expect) -> None:
    container = pod["spec"]["containers"][0]
    text = " ".join(map(str, container.get("command", []) + container.get("args", [])))
    found = re.search(r"--rdzv-endpoint[= ]([^\s'\"]+)", text)
    want = f"{host}:{expect.rdzv_port}"
    if not found or found.group(1) != want:
        raise ConfigError(
            f"{named(obj)}: {path}.spec.containers[0]: torchrun --rdzv-endpoint="
            f"{found.group(1) if found else 'missing'}, but the first pod's DNS name is {want}"
        )
