"""What the cluster.k8s.* keys must satisfy before anything is rendered, and what the
manifests must agree with (k8s_check.Expect): the pod's memory and /dev/shm, the grace
period, the deadline, the cluster's version, the image and the CPU request."""

from __future__ import annotations

import dataclasses

from launcher.config import ConfigError
from launcher.config.backends.k8s import BACKEND
from launcher.data.shm import loader_shm_need
from launcher.submit import k8s_check, stop_time
from launcher.submit.job import SubmitJob, check_interval_fits
from launcher.submit.k8s.names import deadline_s
from launcher.submit.k8s.pod import cpu_request, floating, image_pull_policy
from launcher.submit.node_memory import NodeMemory, node_memory

GANGS = ("none", "kueue", "volcano")
MIN_VERSION = (1, 29)  # the oldest Kubernetes the rendered manifests pass validation for
SECURITY = ("restricted", "root")


def check_options(job: SubmitJob) -> None:
    """The cluster.k8s.* choices that do not fit together; one line each, before rendering."""
    k = job.cluster.k8s
    if k.gang not in GANGS:
        raise ConfigError(f"cluster.k8s.gang={k.gang}: not one of {', '.join(GANGS)}")
    if k.gang == "kueue" and not k.queue:
        raise ConfigError(
            "cluster.k8s.gang=kueue needs cluster.k8s.queue: the name of a Kueue LocalQueue "
            "in the job's namespace"
        )
    if k.security not in SECURITY:
        raise ConfigError(f"cluster.k8s.security={k.security}: not one of {', '.join(SECURITY)}")
    if k.security == "restricted" and k.run_as_user < 1:
        raise ConfigError(
            f"cluster.k8s.run_as_user={k.run_as_user}: security=restricted runs as a non-root "
            "UID (1 or more) that can write the runs volume"
        )
    if k.backoff_limit_per_node < 0:
        raise ConfigError(
            f"cluster.k8s.backoff_limit_per_node={k.backoff_limit_per_node}: must be 0 or more"
        )
    if uses_infiniband(job) and not k.rdma_resource:
        raise ConfigError(
            "nccl=infiniband (NCCL_IB_DISABLE=0) in a pod needs RDMA devices, else NCCL falls "
            "back to TCP: set cluster.k8s.rdma_resource to your RDMA device plugin's resource "
            "(e.g. rdma/ib), or use nccl=ethernet"
        )
    if k.rdma_resource and k.rdma_per_node < 1:
        raise ConfigError(f"cluster.k8s.rdma_per_node={k.rdma_per_node}: must be at least 1")
    if k.rdma_resource and k.security == "restricted":
        job.warnings.append(
            f"cluster.k8s.rdma_resource={k.rdma_resource} adds the IPC_LOCK capability, "
            "which Pod Security 'restricted' (and 'baseline') refuse: the namespace must "
            "enforce 'privileged' or exempt these pods"
        )
    for key in ("home_size", "tmp_size", "disk_margin"):
        k8s_check.parse_quantity(k[key], f"cluster.k8s.{key}")
    stop_time.check_stop_window(job, BACKEND)
    _check_deadline(job)
    _check_version(job)
    _check_image(job)
    _check_spread(job)
    _check_cpu(job)


def uses_infiniband(job: SubmitJob) -> bool:
    return str(job.cfg.nccl.env.get("NCCL_IB_DISABLE")) == "0"


def _check_deadline(job: SubmitJob) -> None:
    """The same minimum as Slurm's: a limit must leave time to train. At the deadline the
    pods get SIGTERM and the grace period to stop in, so a deadline no longer than that
    grace trains nothing; and one checkpoint interval must fit, as on Slurm."""
    deadline = deadline_s(job)
    if deadline is None:
        return
    limit, grace = job.cluster.time_limit, int(job.cluster.k8s.termination_grace_s)
    if deadline <= grace:
        raise ConfigError(
            f"cluster.time_limit={limit} ({deadline} s) leaves no time to train: it is no "
            f"longer than cluster.k8s.termination_grace_s={grace} s, the time the pods get "
            "to stop; raise the time limit"
        )
    step = job.cluster.k8s.step_time_s
    check_interval_fits(
        limit, deadline, job.cfg.trainer, step, "cluster.k8s", "before the deadline"
    )


def _check_version(job: SubmitJob) -> None:
    """The Job's backoffLimitPerIndex and podFailurePolicy rules without onPodConditions
    need Kubernetes 1.29 (1.27/1.28 reject them); refuse an older cluster in one line."""
    version = job.cluster.k8s.version
    if version is None:
        return
    parts = str(version).removeprefix("v").split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        raise ConfigError(f"cluster.k8s.version={version}: not a Kubernetes version such as 1.30")
    if (int(parts[0]), int(parts[1])) < MIN_VERSION:
        raise ConfigError(
            f"cluster.k8s.version={version}: the manifests need "
            f"{'.'.join(map(str, MIN_VERSION))} or later (backoffLimitPerIndex, and "
            "podFailurePolicy rules without onPodConditions, which 1.27/1.28 require); "
            "upgrade the cluster, or run there with Slurm or by hand"
        )


def _check_image(job: SubmitJob) -> None:
    """Only a digest pins the build every pod runs (a tag may be pushed again: notes say
    so); :latest (or none) may differ from node to node and from one restart to the next:
    refused, or warned with cluster.k8s.allow_floating_image=true."""
    k = job.cluster.k8s
    if floating(str(k.image)):
        if not k.allow_floating_image:
            raise ConfigError(
                f"cluster.k8s.image={k.image}: names no fixed build (:latest or no tag), so "
                "pods may run different code; give a digest (repo/launcher@sha256:...), or "
                "at least a tag (launcher:0.1.0), or set cluster.k8s.allow_floating_image=true"
            )
        job.warnings.append(
            f"cluster.k8s.image={k.image} names no fixed build (cluster.k8s."
            "allow_floating_image=true): nodes may run different code; pin a digest"
        )
    policy = image_pull_policy(job)
    if policy not in ("Always", "IfNotPresent", "Never"):
        raise ConfigError(
            f"cluster.k8s.image_pull_policy={policy}: not one of Always, IfNotPresent, Never"
        )
    if policy != "Always" and floating(str(k.image)):
        job.warnings.append(
            f"cluster.k8s.image={k.image} with cluster.k8s.image_pull_policy={policy}: a node "
            "that pulled an older :latest keeps running it; pin a digest, or leave "
            "image_pull_policy=null (Always)"
        )


def _check_spread(job: SubmitJob) -> None:
    """Spreading a training job over zones (or regions) puts every step's all-reduce on
    the slowest, dearest links there are: said, since a user may want it for availability."""
    key = str(job.cluster.k8s.topology_spread_key or "")
    if "zone" in key.lower() or "region" in key.lower():
        job.warnings.append(
            f"cluster.k8s.topology_spread_key={key} spreads the pods over zones: NCCL's "
            "all-reduce then crosses zones every step; pack them instead (one zone by "
            "node_selector or affinity, docs/kubernetes.md)"
        )


def _check_cpu(job: SubmitJob) -> None:
    k = job.cluster.k8s
    cpus = k8s_check.parse_quantity(cpu_request(job), "cluster.k8s.cpu")
    if k.guaranteed and cpus != int(cpus):
        raise ConfigError(
            f"cluster.k8s.cpu={k.cpu}: Guaranteed QoS (cluster.k8s.guaranteed=true) needs whole "
            "CPUs, so that the static CPU manager can pin them; give an integer"
        )
    if cpus < job.cpu_need:
        job.warnings.append(
            f"cluster.k8s.cpu={k.cpu} is less than the {job.cpu_need} CPUs the pod's "
            f"{job.procs_per_node} process(es) and their data.num_workers DataLoader workers "
            "use (one each); leave it null to have it computed"
        )


def pod_memory(job: SubmitJob) -> NodeMemory:
    """The pod's memory (node_memory: the same sum as Slurm's --mem): cluster.k8s.memory,
    or the plan's, for the processes, the /dev/shm need, cluster.k8s.shm_margin; torchrun
    restarts as cluster.k8s.max_restarts, which the memory tier's default follows."""
    k = job.cluster.k8s
    given = None
    if k.memory is not None:
        processes = k8s_check.parse_quantity(k.memory, "cluster.k8s.memory")
        given = (f"cluster.k8s.memory={k.memory}", int(processes))
    margin = k8s_check.parse_quantity(k.shm_margin, "cluster.k8s.shm_margin")
    return node_memory(job, int(k.max_restarts), int(margin), given)


def expectations(job: SubmitJob, memory: NodeMemory | None = None) -> k8s_check.Expect:
    """What the manifests must agree with, from the composed config."""
    k = job.cluster.k8s
    memory = memory or pod_memory(job)
    return k8s_check.Expect(
        nodes=job.nodes,
        procs_per_node=job.procs_per_node,
        gpus_per_node=int(job.cluster.gpus_per_node),
        gpu_resource=str(k.gpu_resource),
        shm_need=memory.shm_need,
        process_memory=memory.processes,
        rdzv_port=int(job.cluster.rdzv_port),
        security=str(k.security),
        guaranteed=bool(k.guaranteed),
        rdma_resource=str(k.rdma_resource) if k.rdma_resource else None,
    )


def without_default_tier(job: SubmitJob, expect: k8s_check.Expect) -> k8s_check.Expect:
    """`expect` with the memory tier's share left out of /dev/shm where cluster.k8s.shm_size
    cannot hold it and trainer.memory_checkpoint_interval is left to its default: the
    trainer turns the tier off at the start of each pod (launcher.checkpoint.memory.open_tier),
    said here in one warning."""
    k = job.cluster.k8s
    if k.shm_size is None or any(
        p.trainer.memory_checkpoint_interval is not None for p in job.points or [job.cfg]
    ):
        return expect
    size = k8s_check.parse_quantity(k.shm_size, "cluster.k8s.shm_size")
    loaders = max(loader_shm_need(p) for p in job.points or [job.cfg]) * job.procs_per_node
    if size >= expect.shm_need or size < loaders:
        return expect
    job.warnings.append(
        f"cluster.k8s.shm_size={k.shm_size} cannot hold the memory tier "
        f"({k8s_check.format_bytes(expect.shm_need - loaders)} a pod): it is off in these pods, "
        "durable checkpoints only; leave cluster.k8s.shm_size null to have it sized"
    )
    return dataclasses.replace(expect, shm_need=loaders)


def shm_size_limit(job: SubmitJob, memory: NodeMemory) -> str:
    """/dev/shm's sizeLimit: cluster.k8s.shm_size, or the loaders' need plus the margin."""
    k = job.cluster.k8s
    need = memory.shm_need
    if k.shm_size is not None:
        size = k8s_check.parse_quantity(k.shm_size, "cluster.k8s.shm_size")
        if size < need:
            raise ConfigError(
                f"cluster.k8s.shm_size={k.shm_size} is less than the "
                f"{k8s_check.format_bytes(need)} this config's DataLoader workers and memory "
                f"tier need per pod (data.num_workers x data.prefetch_factor x batch for each "
                f"of {job.procs_per_node} processes, and two copies of the node's model and "
                f"optimizer state with trainer.memory_checkpoint_interval on: once a node under "
                f"DDP, each rank's shard under FSDP2 and DeepSpeed, see "
                f"docs/shared-memory.md); raise it, "
                "leave it null to have it computed, or lower data.num_workers / "
                "data.prefetch_factor"
            )
        return str(k.shm_size)
    return k8s_check.format_bytes(memory.shm)
