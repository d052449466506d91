"""The `k8s` backend: `python -m launcher.submit k8s` renders Kubernetes manifests
(launcher.submit.k8s); its keys are `cluster.k8s.*` (docs/kubernetes.md). A pod's ranks
find their launch by torchrun's rendezvous id, so it declares no job key."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from launcher.config.backends import Backend
from launcher.config.ranges import AT_LEAST_1, NON_NEGATIVE, POSITIVE, Range, ranged


@dataclass
class K8sConfig:
    """Kubernetes manifest settings (cluster=k8s); see docs/kubernetes.md.

    Every pod runs one torchrun for one node; memory and /dev/shm are per pod.
    """

    kind: str = "job"  # job (Indexed Job + headless Service), jobset, pytorchjob, trainjob
    runtime: str = "torch-distributed"  # trainjob: the Kubeflow Trainer (Cluster)TrainingRuntime
    name: str | None = None  # the objects' name; null: <cluster.job_name>-<run id>
    namespace: str | None = None  # null: kubectl's current namespace
    image: str = "launcher:0.1.0"  # an image with this project and its torch; a tag or digest
    allow_floating_image: bool = False  # accept :latest or no tag (warned): nodes may differ
    image_pull_policy: str | None = None  # null: Always for :latest/untagged, else IfNotPresent
    image_pull_secrets: list[str] = field(default_factory=list)
    service_account: str | None = None
    cpu: str | None = None  # CPU request per pod; null: processes x (1 + DataLoader workers)
    # for the processes; null: the plan's host memory (launcher.plan.host, with a margin), a
    # figure below it refused; the container limit adds /dev/shm's size
    memory: str | None = None
    guaranteed: bool = False  # Guaranteed QoS: CPU limit = request (whole CPUs)
    gpu_resource: str = "nvidia.com/gpu"  # the extended resource cluster.gpus_per_node counts
    rdma_resource: str | None = None  # e.g. rdma/ib: RDMA devices for nccl=infiniband
    rdma_per_node: int = ranged(1, AT_LEAST_1)  # how many of rdma_resource each pod requests
    shm_size: str | None = None  # /dev/shm sizeLimit; null: the loaders' need + shm_margin
    shm_margin: str = "1Gi"  # on top of the loaders' need: NCCL's shared-memory transport etc.
    runs_pvc: str = "launcher-runs"  # PersistentVolumeClaim (ReadWriteMany) mounted at run.root
    wandb_secret: str | None = "wandb"  # Secret holding WANDB_API_KEY; null: none
    wandb_secret_key: str = "api-key"  # the key inside that Secret
    # the Secret holding cluster.secrets' variables, one key each, named as the variable
    env_secret: str = "launcher-secrets"
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[Any] = field(default_factory=list)
    gpu_toleration: bool = True  # tolerate the GPU nodes' taint (gpu_resource:NoSchedule)
    # spread the pods one per value of this node label (kubernetes.io/hostname: one per node)
    topology_spread_key: str | None = None
    affinity: dict[str, Any] = field(default_factory=dict)
    priority_class: str | None = None
    labels: dict[str, str] = field(default_factory=dict)  # added to every object and pod
    annotations: dict[str, str] = field(default_factory=dict)  # added to the pods
    security: str = "restricted"  # Pod Security 'restricted'; root: the image's user, no context
    # the UID (GID, fsGroup) with security=restricted
    run_as_user: int = ranged(1000, Range(low=1, why="a non-root UID"))
    home_size: str = "10Gi"  # restricted: the writable HOME emptyDir (caches, data cache)
    tmp_size: str = "2Gi"  # restricted: the writable /tmp emptyDir
    # restricted: the container's own disk (its writable layer, its logs) on top of the
    # emptyDirs: ephemeral-storage is requested and limited at their sum
    disk_margin: str = "2Gi"
    gang: str = "none"  # none, kueue (queue-name label, suspended) or volcano (min members)
    queue: str | None = None  # the Kueue LocalQueue or the Volcano queue
    # failed pods tolerated per node (disruptions not counted)
    backoff_limit_per_node: int = ranged(3, NON_NEGATIVE)
    # torchrun --max-restarts: re-rendezvous when a peer pod is replaced
    max_restarts: int = ranged(3, NON_NEGATIVE)
    # how long torchrun waits for all pods to join (join_timeout)
    rdzv_timeout_s: int = ranged(900, AT_LEAST_1)
    # SIGTERM -> SIGKILL: time to write the stop checkpoint
    termination_grace_s: int = ranged(120, NON_NEGATIVE)
    # a measured step time: checks termination_grace_s
    step_time_s: float | None = ranged(None, POSITIVE)
    # one checkpoint write; null: estimated (docs)
    checkpoint_write_s: float | None = ranged(None, NON_NEGATIVE)
    # write bandwidth one rank reaches to the runs volume (measure yours)
    checkpoint_write_mb_s: float = ranged(100, POSITIVE)
    # delete the finished Job after this long
    ttl_after_finished_s: int | None = ranged(None, NON_NEGATIVE)
    version: str | None = None  # the cluster's Kubernetes (1.30); older than 1.29 is refused


BACKEND = Backend(
    name="k8s",
    summary="an Indexed Job and its Service",
    tool="kubectl apply",
    docs="docs/kubernetes.md",
    secret_way="put it in the Secret cluster.k8s.env_secret and name it in "
    "cluster.secrets=[NAME]: every pod gets it by secretKeyRef",
    schema=K8sConfig,
    # whoever may list the namespace's pods reads their names, labels and annotations
    public_text=("name", "labels", "annotations"),
    stop_window="termination_grace_s",
    # torchrun's agent must have ended (its workers checkpointed and exited) this long
    # before the kubelet's SIGKILL at terminationGracePeriodSeconds, so the pod exits with
    # its code (TORCH_ELASTIC_SHUTDOWN_TIMEOUT is the grace less this)
    stop_margin_s=10,
)
