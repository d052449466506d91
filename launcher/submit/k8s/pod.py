"""The pod every node runs, whatever the kind wraps it in: one container running
launcher.torchrun, /dev/shm in memory, the run directory on the PVC, the security context,
the placement and the resources."""

from __future__ import annotations

import copy
import shlex

from omegaconf import OmegaConf

from launcher.config.backends.k8s import BACKEND
from launcher.resilience import bad_hosts
from launcher.resilience.node_presence import WAIT_ENV
from launcher.submit import k8s_check
from launcher.submit.job import FRONT_DOOR, SubmitJob
from launcher.submit.k8s.kind import Kind
from launcher.submit.k8s.names import INSTANCE_LABEL, labels, name_of

SHM_VOLUME = "dshm"
RUNS_VOLUME = "runs"
# security=restricted: the UID has no home in most images and may not write the image's
# /tmp; these emptyDirs give it both (the data cache, ~/.cache/launcher, lies in HOME).
HOME_VOLUME, HOME_DIR = "home", "/home/launcher"
TMP_VOLUME, TMP_DIR = "tmp", "/tmp"
RANK_PLACEHOLDER = "@NODE_RANK@"
VOLCANO_QUEUE = "scheduling.volcano.sh/queue-name"  # on the pods
ISTIO_INJECT = "sidecar.istio.io/inject"


def pod_template(
    job: SubmitJob, kind: Kind, endpoint: str, shm_size: str, process_memory: int
) -> dict:
    """The pod every node runs: one container, /dev/shm in memory, the run dir on the PVC."""
    k = job.cluster.k8s
    shm_bytes = int(k8s_check.parse_quantity(shm_size, "cluster.k8s.shm_size"))
    memory_limit = k8s_check.format_bytes(process_memory + shm_bytes)
    spec = {**pod_settings(job, kind), **placement(job)}
    spec["containers"] = [container(job, kind, endpoint, memory_limit)]
    spec["volumes"] = [
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": shm_size}},
        {"name": RUNS_VOLUME, "persistentVolumeClaim": {"claimName": str(k.runs_pvc)}},
    ]
    if k.security == "restricted":
        spec["volumes"] += [
            {"name": HOME_VOLUME, "emptyDir": {"sizeLimit": str(k.home_size)}},
            {"name": TMP_VOLUME, "emptyDir": {"sizeLimit": str(k.tmp_size)}},
        ]
    return {"metadata": pod_metadata(job), "spec": spec}


def container(job: SubmitJob, kind: Kind, endpoint: str, memory_limit: str) -> dict:
    """The one container: launcher.torchrun, its environment, port, resources and mounts."""
    main: dict = {
        "name": kind.container,
        "image": str(job.cluster.k8s.image),
        "imagePullPolicy": image_pull_policy(job),
    }
    if job.cluster.workdir:
        main["workingDir"] = str(job.cluster.workdir)
    main["command"], main["args"] = container_command(job, kind, endpoint)
    main["env"] = container_env(job)
    main["ports"] = [{"name": kind.port_name, "containerPort": int(job.cluster.rdzv_port)}]
    main["resources"] = resources(job, memory_limit)
    security = container_security(job)
    if security:
        main["securityContext"] = security
    main["volumeMounts"] = [
        {"name": SHM_VOLUME, "mountPath": k8s_check.SHM_PATH},
        {"name": RUNS_VOLUME, "mountPath": str(job.run_root)},
    ]
    if job.cluster.k8s.security == "restricted":
        main["volumeMounts"] += [
            {"name": HOME_VOLUME, "mountPath": HOME_DIR},
            {"name": TMP_VOLUME, "mountPath": TMP_DIR},
        ]
    return main


def pod_settings(job: SubmitJob, kind: Kind) -> dict:
    """The pod's own fields before its placement: restarts, the API token, the grace
    period, the scheduler, the security context, the account and the image pull secrets."""
    k = job.cluster.k8s
    spec: dict = {"restartPolicy": "Never"} if kind.pod_restart_policy else {}
    # No API token in the pod (training never calls the API server), and no variables for
    # every Service of the namespace (thousands of them slow the start and clutter env).
    spec["automountServiceAccountToken"] = False
    spec["enableServiceLinks"] = False
    spec["terminationGracePeriodSeconds"] = int(k.termination_grace_s)
    if k.gang == "volcano":
        spec["schedulerName"] = "volcano"
    if k.security == "restricted":
        spec["securityContext"] = {
            "runAsNonRoot": True,
            "runAsUser": int(k.run_as_user),
            "runAsGroup": int(k.run_as_user),
            # The volumes' group, so that the UID can write a volume made by root; the
            # recursive change happens only when the volume's root does not match already.
            "fsGroup": int(k.run_as_user),
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        }
    if k.service_account:
        spec["serviceAccountName"] = str(k.service_account)
    if k.priority_class:
        spec["priorityClassName"] = str(k.priority_class)
    if k.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": str(s)} for s in k.image_pull_secrets]
    return spec


def placement(job: SubmitJob) -> dict:
    """Where the pods may run: the node selector, the tolerations, one pod per value of the
    spread key, and the affinity, off the nodes this run keeps off (its bad_hosts)."""
    k = job.cluster.k8s
    spec: dict = {}
    if k.node_selector:
        spec["nodeSelector"] = {str(a): str(b) for a, b in k.node_selector.items()}
    tolerations = tolerations_of(job)
    if tolerations:
        spec["tolerations"] = tolerations
    if k.topology_spread_key:
        spec["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": str(k.topology_spread_key),
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {INSTANCE_LABEL: name_of(job)}},
            }
        ]
    affinity = OmegaConf.to_container(k.affinity, resolve=True) if k.affinity else {}
    refused = bad_hosts.read(job.run_dir)  # what this run's earlier pods keep off
    if refused:
        affinity = without_nodes(affinity, refused)
    if affinity:
        spec["affinity"] = affinity
    return spec


def pod_metadata(job: SubmitJob) -> dict:
    """No service-mesh sidecar: it would hold the pod open after training ends, and the
    rendezvous and NCCL traffic must not go through a proxy (label: current Istio; the
    annotation: older releases). Volcano's queue, then the user's annotations."""
    k = job.cluster.k8s
    meta: dict = {"labels": {**labels(job), ISTIO_INJECT: "false"}}
    annotations = {ISTIO_INJECT: "false"}
    if k.gang == "volcano" and k.queue:
        annotations[VOLCANO_QUEUE] = str(k.queue)
    annotations.update({str(a): str(b) for a, b in k.annotations.items()})
    meta["annotations"] = annotations
    return meta


def tolerations_of(job: SubmitJob) -> list[dict]:
    """cluster.k8s.tolerations, and with GPUs the GPU nodes' usual taint (the GPU
    resource's name, any value, NoSchedule: what NVIDIA's GPU operator and the clouds put
    on GPU nodes), unless cluster.k8s.gpu_toleration=false."""
    k = job.cluster.k8s
    own = OmegaConf.to_container(k.tolerations, resolve=True) if k.tolerations else []
    if job.cluster.gpus_per_node and k.gpu_toleration:
        gpu = {"key": str(k.gpu_resource), "operator": "Exists", "effect": "NoSchedule"}
        if gpu not in own:
            own.append(gpu)
    return own


def without_nodes(affinity: dict, hosts: list[str]) -> dict:
    """`affinity` with a required node-affinity rule that keeps the pods off `hosts` (by
    the kubernetes.io/hostname label, which is the node's name unless a cloud sets it
    otherwise). Node selector terms are ORed, so the rule joins every term there is."""
    out = copy.deepcopy(affinity)
    rule = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": list(hosts)}
    node = out.setdefault("nodeAffinity", {})
    required = node.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({})
    for term in terms:
        term.setdefault("matchExpressions", []).append(rule)
    return out


def resources(job: SubmitJob, memory_limit: str) -> dict:
    """Requests and limits: memory (processes + /dev/shm) request = limit, GPUs and RDMA
    devices request = limit, and the CPU request; with guaranteed=true the CPU limit equals
    the request, which makes the pod's QoS class Guaranteed."""
    k = job.cluster.k8s
    gpus = int(job.cluster.gpus_per_node)
    cpu = cpu_request(job)
    requests: dict = {"cpu": cpu, "memory": memory_limit}
    limits: dict = {"memory": memory_limit}
    if k.security == "restricted":
        # The disk-backed emptyDirs (home, tmp) and the container's own writes (its writable
        # layer, its logs) are the pod's ephemeral storage: requested, so that the scheduler
        # places the pod where that much disk is free, and limited at the same sum, so that
        # a runaway write evicts this pod rather than fill the node's disk under others.
        disk = sum(
            k8s_check.parse_quantity(k[key], f"cluster.k8s.{key}")
            for key in ("home_size", "tmp_size", "disk_margin")
        )
        requests["ephemeral-storage"] = limits["ephemeral-storage"] = k8s_check.format_bytes(
            int(disk)
        )
    if k.guaranteed:
        limits = {"cpu": cpu, **limits}
    if gpus:
        requests[str(k.gpu_resource)] = gpus
        limits[str(k.gpu_resource)] = gpus
    if k.rdma_resource:
        requests[str(k.rdma_resource)] = int(k.rdma_per_node)
        limits[str(k.rdma_resource)] = int(k.rdma_per_node)
    return {"requests": requests, "limits": limits}


def container_security(job: SubmitJob) -> dict | None:
    """security=restricted: what Pod Security's 'restricted' profile asks of a container.
    RDMA needs IPC_LOCK (to pin memory for the NIC), the one documented exception: no Pod
    Security level but privileged allows adding it (check_options warns)."""
    k = job.cluster.k8s
    context: dict = {}
    if k.security == "restricted":
        context = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    if k.rdma_resource:
        context.setdefault("capabilities", {})["add"] = ["IPC_LOCK"]
    return context or None


def container_command(job: SubmitJob, kind: Kind, endpoint: str) -> tuple[list[str], list[str]]:
    """(command, args): launcher.torchrun itself, or a shell running cluster.setup first.

    The node rank is `$(VAR)`, which Kubernetes expands from the container's environment;
    a literal `$(` in an override is escaped as `$$(` so Kubernetes leaves it alone.
    """
    k = job.cluster.k8s
    argv = job.torchrun_argv(endpoint, RANK_PLACEHOLDER)
    extra = [
        f"--max-restarts={int(k.max_restarts)}",
        f"--rdzv-conf=join_timeout={int(k.rdzv_timeout_s)}",
    ]
    front = len(FRONT_DOOR)
    argv = [*argv[:front], *extra, *argv[front:]]
    rank_var = kind.node_rank
    if not job.cluster.setup:
        argv = [a.replace("$(", "$$(").replace(RANK_PLACEHOLDER, f"$({rank_var})") for a in argv]
        return argv[:front], argv[front:]
    script = ["set -e", *map(str, job.cluster.setup)]
    line = " ".join(shlex.quote(a) for a in argv).replace(RANK_PLACEHOLDER, f'"${rank_var}"')
    script.append(f"exec {line}")
    return ["/bin/sh", "-c"], ["\n".join(script).replace("$(", "$$(")]


def container_env(job: SubmitJob) -> list[dict]:
    """The `nccl` group's and cluster.env's variables; the W&B key and cluster.secrets only
    through Secrets."""
    k = job.cluster.k8s
    env = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    # The node, as bad_hosts names one to keep off (and the next render excludes it).
    env.append({"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
    # A lost pod's replacement is waited for as long as the rendezvous waits for it; then the
    # others end with 8 (node lost), naming its ranks (launcher.resilience.node_presence).
    env.append({"name": WAIT_ENV, "value": str(int(k.rdzv_timeout_s))})
    if k.security == "restricted":
        env.append({"name": "HOME", "value": HOME_DIR})
    env += [{"name": name, "value": value} for name, value in job.env().items()]
    # torchrun's agent lets its workers checkpoint this long after SIGTERM (its default is
    # 30 s), ending before the kubelet's SIGKILL at terminationGracePeriodSeconds.
    shutdown = int(k.termination_grace_s) - BACKEND.stop_margin_s
    env.append({"name": "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "value": str(shutdown)})
    if k.wandb_secret:
        ref = {"name": str(k.wandb_secret), "key": str(k.wandb_secret_key)}
        # A run that logs online must not start without its key; others start without it.
        if job.cfg.logger.mode != "online":
            ref["optional"] = True
        env.append({"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": ref}})
    for name in job.cluster.secrets:  # the Secret's key is the variable's name
        ref = {"name": str(k.env_secret), "key": str(name)}
        env.append({"name": str(name), "valueFrom": {"secretKeyRef": ref}})
    return env


def image_pull_policy(job: SubmitJob) -> str:
    """cluster.k8s.image_pull_policy, else what Kubernetes itself defaults to: Always for
    :latest or no tag (a node would otherwise keep an old :latest), else IfNotPresent."""
    k = job.cluster.k8s
    if k.image_pull_policy:
        return str(k.image_pull_policy)
    return "Always" if floating(str(k.image)) else "IfNotPresent"


def pinned(image: str) -> bool:
    """True for an image reference by digest (repo@sha256:...), the only one that names one
    build for good: a tag names what was last pushed under it."""
    return "@sha256:" in image or "@sha512:" in image


def floating(image: str) -> bool:
    """True for an image reference that names no fixed build: :latest, or no tag at all."""
    if "@" in image:
        return False
    last = image.rsplit("/", 1)[-1]
    return ":" not in last or last.endswith(":latest")


def cpu_request(job: SubmitJob) -> str:
    k = job.cluster.k8s
    return str(k.cpu) if k.cpu is not None else str(job.cpu_need)
