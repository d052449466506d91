"""`python -m launcher.submit k8s`: the experiment as an Indexed Job and a headless Service.

One pod per node runs one torchrun. The pods find each other through the Service: an
Indexed Job with `spec.subdomain` gives pod <i> the hostname `<name>-<i>` and the DNS name
`<name>-<i>.<service>`, so every torchrun rendezvouses at `<name>-0.<service>:<port>`, with
its completion index as node rank. /dev/shm is a memory-backed emptyDir sized from the same
computation the trainer's preflight uses (launcher.plan.memory.shm_need), and the container's
memory limit holds it on top of what the processes get. `cluster.k8s.kind` renders the same
pod as a JobSet or a Kubeflow PyTorchJob instead. See docs/kubernetes.md.

Each pod runs `python -m launcher.torchrun`, which exits with the job's contract code
(launcher/resilience/exit_codes.py); the failure policies act on it: bad input, a non-finite
loss and out of memory fail the job at once, a crash or a hang is retried within a per-node budget,
and a disruption (preemption, eviction, drain) is not counted at all.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shlex
import shutil
import subprocess
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from launcher.config import ConfigError
from launcher.plan.memory import loader_shm_need, shm_need
from launcher.resilience import exit_codes
from launcher.resilience.burnin import BAD_HOSTS, read_bad_hosts
from launcher.submit import k8s_check, stop_time
from launcher.submit.job import (
    DEFAULT_JOB_NAME,
    FRONT_DOOR,
    SubmitJob,
    check_interval_fits,
    time_limit_s,
)

KINDS = ("job", "jobset", "pytorchjob")
CONTAINER = "trainer"
SHM_VOLUME = "dshm"
RUNS_VOLUME = "runs"
# security=restricted: the UID has no home in most images and may not write the image's
# /tmp; these emptyDirs give it both (the data cache, ~/.cache/launcher, lies in HOME).
HOME_VOLUME, HOME_DIR = "home", "/home/launcher"
TMP_VOLUME, TMP_DIR = "tmp", "/tmp"
RANK_PLACEHOLDER = "@NODE_RANK@"
# What each kind's pods know their node rank by (Kubernetes expands $(VAR) in args).
NODE_RANK = {"job": "JOB_COMPLETION_INDEX", "jobset": "JOB_COMPLETION_INDEX", "pytorchjob": "RANK"}
JOBSET_REPLICATED_JOB = "node"
PYTORCHJOB_PORT_NAME = "pytorchjob-port"  # the port the training operator's Services expose
# Exit codes that fail the whole job at once: retrying the same config cannot help.
FAIL_AT_ONCE = [exit_codes.BAD_INPUT, exit_codes.NONFINITE, exit_codes.OOM]
# torchrun's agent must have ended (its workers checkpointed and exited) this long before
# the kubelet's SIGKILL at terminationGracePeriodSeconds, so the pod exits with its code.
SHUTDOWN_MARGIN_S = 10
GANGS = ("none", "kueue", "volcano")
MIN_VERSION = (1, 29)  # the oldest Kubernetes the rendered manifests pass validation for
SECURITY = ("restricted", "root")
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
VOLCANO_MIN_MEMBER = "scheduling.volcano.sh/group-min-member"  # on the Job (Volcano >= 1.12)
VOLCANO_QUEUE = "scheduling.volcano.sh/queue-name"  # on the pods
ISTIO_INJECT = "sidecar.istio.io/inject"


def render(job: SubmitJob) -> dict[str, str]:
    """The manifests as {file name: YAML text}, checked; raise ConfigError on bad input."""
    k = job.cluster.k8s
    if k.kind not in KINDS:
        raise ConfigError(f"cluster.k8s.kind={k.kind}: not one of {', '.join(KINDS)}")
    check_options(job)
    expect = without_default_tier(job, expectations(job))
    shm_size = shm_size_limit(job, expect.shm_need)
    objects = build(job, shm_size, expect.process_memory)
    k8s_check.check([obj for _, obj in objects], expect)
    return {filename: to_yaml(obj, job) for filename, obj in objects}


def submit(job: SubmitJob, paths: list[Path]) -> str:
    """`kubectl apply` the files in order (the Service before the pods that need it)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise ConfigError("kubectl is not on PATH; install it, or render only with --dry-run")
    cmd = [kubectl, "apply"]
    for path in paths:
        cmd += ["-f", str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines() or ["(no output)"]
        raise ConfigError(f"kubectl apply failed (exit {proc.returncode}): {lines[-1]}")
    ns = f" -n {job.cluster.k8s.namespace}" if job.cluster.k8s.namespace else ""
    applied = proc.stdout.strip()
    if job.cluster.k8s.kind == "job":
        applied += "\n" + _own_service(kubectl, job)
    follow = f"follow it: kubectl logs{ns} -f --prefix -l {_instance_label(job)}={name_of(job)}"
    return f"{applied}\n{follow}"


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


def _own_service(kubectl: str, job: SubmitJob) -> str:
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
        return f"warning: the Service is not owned by the Job; remove both with: {notes(job)[-1]}"
    patch = json.dumps(service_owner_patch(job, uid))
    done = subprocess.run(
        [kubectl, "patch", f"service/{name}", *ns, "--type=merge", "-p", patch],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        return f"warning: the Service is not owned by the Job; remove both with: {notes(job)[-1]}"
    return f"service/{name} is owned by job/{name}: deleting the Job removes it"


def notes(job: SubmitJob) -> list[str]:
    """What must exist before the manifests can run, and how the objects are removed."""
    k = job.cluster.k8s
    ns = k.namespace or "the current namespace"
    ns_flag = f" -n {k.namespace}" if k.namespace else ""
    lines = [
        f"needs: PersistentVolumeClaim {k.runs_pvc} (ReadWriteMany) in {ns}, mounted at "
        f"{job.run_root} in every pod (cluster.k8s.runs_pvc)"
    ]
    if k.wandb_secret:
        required = "required" if job.cfg.logger.mode == "online" else "optional"
        lines.append(
            f"needs: Secret {k.wandb_secret} with key {k.wandb_secret_key} ({required}: "
            f"kubectl create secret generic {k.wandb_secret} "
            f"--from-literal={k.wandb_secret_key}=$WANDB_API_KEY{ns_flag})"
        )
    refused = read_bad_hosts(job.run_dir)
    if refused:
        lines.append(
            f"excluded: node(s) {', '.join(refused)}, refused by this run's burn-in gate "
            f"({job.run_dir / BAD_HOSTS}; docs/burnin.md)"
        )
    if k.gang == "kueue":
        lines.append(f"needs: Kueue with a LocalQueue {k.queue} in {ns}")
    if k.gang == "volcano":
        lines.append("needs: Volcano (1.12 or later for a plain Job's group-min-member)")
    if k.kind == "job":
        lines.append(
            f"remove: kubectl delete job,service{ns_flag} -l "
            f"{_instance_label(job)}={name_of(job)} (submit makes the Job own the Service, "
            "so deleting the Job, or its ttlSecondsAfterFinished, removes both; applied "
            "with kubectl apply -f or a GitOps tool alone, the Service is not owned: delete "
            "it by that label, or use cluster.k8s.kind=jobset, whose controller owns it)"
        )
    return lines


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
    for key in ("home_size", "tmp_size"):
        k8s_check.parse_quantity(k[key], f"cluster.k8s.{key}")
    _check_grace(job)
    _check_deadline(job)
    _check_version(job)
    _check_image(job)
    _check_cpu(job)


def uses_infiniband(job: SubmitJob) -> bool:
    return str(job.cfg.nccl.env.get("NCCL_IB_DISABLE")) == "0"


def _check_grace(job: SubmitJob) -> None:
    """terminationGracePeriodSeconds must hold one step, the stop checkpoint's write
    (stop_time: measured, given or estimated from the model) and torchrun's own shutdown:
    SIGTERM arrives mid-step, the ranks finish it, checkpoint, and exit."""
    k = job.cluster.k8s
    step = float(k.step_time_s or 0)
    write = stop_time.checkpoint_write(job, k, "cluster.k8s")
    need = step + write.seconds + SHUTDOWN_MARGIN_S
    if k.termination_grace_s < need:
        measured = f"cluster.k8s.step_time_s={k.step_time_s} + " if k.step_time_s else ""
        raise ConfigError(
            f"cluster.k8s.termination_grace_s={k.termination_grace_s} is too short to stop "
            f"with a checkpoint: {measured}a {write.seconds:.0f} s checkpoint write "
            f"({write.why}) + {SHUTDOWN_MARGIN_S} s for torchrun to end = {need:.0f} s; "
            "raise termination_grace_s"
        )


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


def image_pull_policy(job: SubmitJob) -> str:
    """cluster.k8s.image_pull_policy, else what Kubernetes itself defaults to: Always for
    :latest or no tag (a node would otherwise keep an old :latest), else IfNotPresent."""
    k = job.cluster.k8s
    if k.image_pull_policy:
        return str(k.image_pull_policy)
    return "Always" if _floating(str(k.image)) else "IfNotPresent"


def _floating(image: str) -> bool:
    """True for an image reference that names no fixed build: :latest, or no tag at all."""
    if "@" in image:
        return False
    last = image.rsplit("/", 1)[-1]
    return ":" not in last or last.endswith(":latest")


def _check_image(job: SubmitJob) -> None:
    k = job.cluster.k8s
    policy = image_pull_policy(job)
    if policy not in ("Always", "IfNotPresent", "Never"):
        raise ConfigError(
            f"cluster.k8s.image_pull_policy={policy}: not one of Always, IfNotPresent, Never"
        )
    if policy != "Always" and _floating(str(k.image)):
        job.warnings.append(
            f"cluster.k8s.image={k.image} with cluster.k8s.image_pull_policy={policy}: a node "
            "that pulled an older :latest keeps running it; pin a tag or digest, or leave "
            "image_pull_policy=null (Always)"
        )


def cpu_request(job: SubmitJob) -> str:
    k = job.cluster.k8s
    return str(k.cpu) if k.cpu is not None else str(job.cpu_need)


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


def name_of(job: SubmitJob) -> str:
    """The objects' name: cluster.k8s.name, else <cluster.job_name or launcher>-<run id>."""
    k = job.cluster.k8s
    return str(k.name or f"{job.cluster.job_name or DEFAULT_JOB_NAME}-{job.run_id}")


def expectations(job: SubmitJob) -> k8s_check.Expect:
    """What the manifests must agree with, from the composed config."""
    k = job.cluster.k8s
    restarts = int(k.max_restarts)  # the memory tier's default follows torchrun's restarts
    world = job.nodes * job.procs_per_node
    points = job.points or [job.cfg]
    need = max(shm_need(p, job.procs_per_node, world, restarts) for p in points)
    memory = int(k8s_check.parse_quantity(k.memory, "cluster.k8s.memory"))
    return k8s_check.Expect(
        nodes=job.nodes,
        procs_per_node=job.procs_per_node,
        gpus_per_node=int(job.cluster.gpus_per_node),
        gpu_resource=str(k.gpu_resource),
        shm_need=need,
        process_memory=memory,
        rdzv_port=int(job.cluster.rdzv_port),
        security=str(k.security),
        guaranteed=bool(k.guaranteed),
        rdma_resource=str(k.rdma_resource) if k.rdma_resource else None,
    )


def without_default_tier(job: SubmitJob, expect: k8s_check.Expect) -> k8s_check.Expect:
    """`expect` with the memory tier's share left out of /dev/shm where cluster.k8s.shm_size
    cannot hold it and trainer.memory_checkpoint_interval is left to its default: the
    trainer turns the tier off at the start of each pod (launcher.train.job.memory_tier),
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


def shm_size_limit(job: SubmitJob, need: int) -> str:
    """/dev/shm's sizeLimit: cluster.k8s.shm_size, or the loaders' need plus the margin."""
    k = job.cluster.k8s
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
    margin = k8s_check.parse_quantity(k.shm_margin, "cluster.k8s.shm_margin")
    return k8s_check.format_bytes(int(need + margin))


def build(job: SubmitJob, shm_size: str, process_memory: int) -> list[tuple[str, dict]]:
    """(file name, object) pairs for cluster.k8s.kind, in the order kubectl applies them."""
    k = job.cluster.k8s
    name = name_of(job)
    if k.kind == "job":
        service_name = name
        endpoint = f"{name}-0.{service_name}:{job.cluster.rdzv_port}"
        pod = pod_template(job, endpoint, shm_size, process_memory)
        pod["spec"] = {"subdomain": service_name, **pod["spec"]}
        return [("service.yaml", service(job, service_name)), ("job.yaml", indexed_job(job, pod))]
    if k.kind == "jobset":
        rjob = JOBSET_REPLICATED_JOB
        endpoint = f"{name}-{rjob}-0-0.{name}:{job.cluster.rdzv_port}"
        pod = pod_template(job, endpoint, shm_size, process_memory)
        return [("jobset.yaml", jobset(job, pod))]
    endpoint = f"{name}-master-0:{job.cluster.rdzv_port}"
    pod = pod_template(job, endpoint, shm_size, process_memory, container="pytorch")
    return [("pytorchjob.yaml", pytorchjob(job, pod))]


def metadata(job: SubmitJob, name: str | None = None, component: str = "trainer") -> dict:
    """The workload's metadata: its labels, and Kueue's queue label with gang=kueue."""
    meta: dict = {"name": name or name_of(job)}
    if job.cluster.k8s.namespace:
        meta["namespace"] = str(job.cluster.k8s.namespace)
    meta["labels"] = labels(job, component)
    return meta


def workload_metadata(job: SubmitJob) -> dict:
    meta = metadata(job)
    k = job.cluster.k8s
    if k.gang == "kueue":
        meta["labels"][KUEUE_QUEUE_LABEL] = str(k.queue)
    return meta


def labels(job: SubmitJob, component: str = "trainer") -> dict[str, str]:
    """User labels, then the recommended app.kubernetes.io ones (the Service selects the
    pods by the instance label)."""
    own = {
        "app.kubernetes.io/name": "launcher",
        _instance_label(job): name_of(job),
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": "launcher",
    }
    return {**{str(k): str(v) for k, v in job.cluster.k8s.labels.items()}, **own}


def _instance_label(job: SubmitJob) -> str:
    return "app.kubernetes.io/instance"


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
            "selector": {_instance_label(job): name_of(job)},
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
    if k.ttl_after_finished_s is not None:
        spec["ttlSecondsAfterFinished"] = int(k.ttl_after_finished_s)
    if k.gang == "kueue" and not restarts_owned_by_jobset:
        spec["suspend"] = True  # Kueue unsuspends it once the whole job is admitted
    spec["template"] = pod
    return spec


def indexed_job(job: SubmitJob, pod: dict) -> dict:
    meta = workload_metadata(job)
    if job.cluster.k8s.gang == "volcano":
        meta["annotations"] = {VOLCANO_MIN_MEMBER: str(job.nodes)}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": job_spec(job, pod)}


def jobset(job: SubmitJob, pod: dict) -> dict:
    """The same Indexed Job as the only replicated Job of a JobSet, which makes the
    headless Service itself (named after the JobSet). As in JobSet's own PyTorch example the
    inner Job has backoffLimit 0 and the JobSet restarts the whole set (maxRestarts); a Job
    failed by its podFailurePolicy (exit 2, 3, 4) fails the JobSet without a restart."""
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
        "failurePolicy": {"maxRestarts": restart_budget(job), "rules": jobset_rules(job)},
    }
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


def restart_budget(job: SubmitJob) -> int:
    """Whole-job restarts (JobSet, PyTorchJob): the per-node budget times the nodes, as a
    plain Job's per-index limits add up."""
    return int(job.cluster.k8s.backoff_limit_per_node) * job.nodes


def pytorchjob(job: SubmitJob, pod: dict) -> dict:
    """Kubeflow's PyTorchJob: a Master and nodes-1 Workers, each with its own Service made
    by the training operator. restartPolicy ExitCode: the operator restarts a pod that exited
    with 128 or more (a signal, and the 143 of a checkpointed stop) and fails the job on
    1-127, so bad input, a non-finite loss and out of memory (2, 3, 4), but also a crash (1),
    a hang (5) and a stop without a checkpoint (7), end it without a retry."""
    k = job.cluster.k8s
    # Running: when the job ends (a failure included), the pods still running are deleted,
    # so no Worker holds its GPUs; the finished ones stay for their logs.
    run_policy: dict = {"backoffLimit": restart_budget(job), "cleanPodPolicy": "Running"}
    deadline = deadline_s(job)
    if deadline:
        run_policy["activeDeadlineSeconds"] = deadline
    if k.ttl_after_finished_s is not None:
        run_policy["ttlSecondsAfterFinished"] = int(k.ttl_after_finished_s)
    if k.gang == "kueue":
        run_policy["suspend"] = True
    if k.gang == "volcano":
        policy: dict = {"minAvailable": job.nodes}
        if k.queue:
            policy["queue"] = str(k.queue)
        run_policy["schedulingPolicy"] = policy
    replicas = {"Master": {"replicas": 1, "restartPolicy": "ExitCode", "template": pod}}
    if job.nodes > 1:
        replicas["Worker"] = {
            "replicas": job.nodes - 1,
            "restartPolicy": "ExitCode",
            "template": copy.deepcopy(pod),  # a copy: YAML would write an anchor otherwise
        }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": workload_metadata(job),
        "spec": {"runPolicy": run_policy, "pytorchReplicaSpecs": replicas},
    }


def pod_template(
    job: SubmitJob, endpoint: str, shm_size: str, process_memory: int, container: str = CONTAINER
) -> dict:
    """The pod every node runs: one container, /dev/shm in memory, the run dir on the PVC."""
    k = job.cluster.k8s
    shm_bytes = int(k8s_check.parse_quantity(shm_size, "cluster.k8s.shm_size"))
    memory_limit = k8s_check.format_bytes(process_memory + shm_bytes)
    command, args = container_command(job, endpoint)
    main: dict = {
        "name": container,
        "image": str(k.image),
        "imagePullPolicy": image_pull_policy(job),
    }
    if job.cluster.workdir:
        main["workingDir"] = str(job.cluster.workdir)
    main["command"] = command
    main["args"] = args
    main["env"] = container_env(job)
    main["ports"] = [
        {
            "name": PYTORCHJOB_PORT_NAME if k.kind == "pytorchjob" else "rdzv",
            "containerPort": int(job.cluster.rdzv_port),
        }
    ]
    main["resources"] = resources(job, memory_limit)
    security = container_security(job)
    if security:
        main["securityContext"] = security
    main["volumeMounts"] = [
        {"name": SHM_VOLUME, "mountPath": k8s_check.SHM_PATH},
        {"name": RUNS_VOLUME, "mountPath": str(job.run_root)},
    ]
    if k.security == "restricted":
        main["volumeMounts"] += [
            {"name": HOME_VOLUME, "mountPath": HOME_DIR},
            {"name": TMP_VOLUME, "mountPath": TMP_DIR},
        ]
    spec: dict = {"restartPolicy": "Never"}
    if k.kind == "pytorchjob":
        del spec["restartPolicy"]  # the operator sets it from the replica's restartPolicy
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
    if k.node_selector:
        spec["nodeSelector"] = {str(a): str(b) for a, b in k.node_selector.items()}
    if k.tolerations:
        spec["tolerations"] = OmegaConf.to_container(k.tolerations, resolve=True)
    affinity = OmegaConf.to_container(k.affinity, resolve=True) if k.affinity else {}
    refused = read_bad_hosts(job.run_dir)  # the burn-in gates of this run's earlier pods
    if refused:
        affinity = without_nodes(affinity, refused)
    if affinity:
        spec["affinity"] = affinity
    spec["containers"] = [main]
    spec["volumes"] = [
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": shm_size}},
        {"name": RUNS_VOLUME, "persistentVolumeClaim": {"claimName": str(k.runs_pvc)}},
    ]
    if k.security == "restricted":
        spec["volumes"] += [
            {"name": HOME_VOLUME, "emptyDir": {"sizeLimit": str(k.home_size)}},
            {"name": TMP_VOLUME, "emptyDir": {"sizeLimit": str(k.tmp_size)}},
        ]
    # No service-mesh sidecar: it would hold the pod open after training ends, and the
    # rendezvous and NCCL traffic must not go through a proxy (label: current Istio; the
    # annotation: older releases).
    meta: dict = {"labels": {**labels(job), ISTIO_INJECT: "false"}}
    annotations = {ISTIO_INJECT: "false"}
    if k.gang == "volcano" and k.queue:
        annotations[VOLCANO_QUEUE] = str(k.queue)
    annotations.update({str(a): str(b) for a, b in k.annotations.items()})
    meta["annotations"] = annotations
    return {"metadata": meta, "spec": spec}


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


def container_command(job: SubmitJob, endpoint: str) -> tuple[list[str], list[str]]:
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
    rank_var = NODE_RANK[k.kind]
    if not job.cluster.setup:
        argv = [a.replace("$(", "$$(").replace(RANK_PLACEHOLDER, f"$({rank_var})") for a in argv]
        return argv[:front], argv[front:]
    script = ["set -e", *map(str, job.cluster.setup)]
    line = " ".join(shlex.quote(a) for a in argv).replace(RANK_PLACEHOLDER, f'"${rank_var}"')
    script.append(f"exec {line}")
    return ["/bin/sh", "-c"], ["\n".join(script).replace("$(", "$$(")]


def container_env(job: SubmitJob) -> list[dict]:
    """The `nccl` group's and cluster.env's variables; the W&B key only through a Secret."""
    k = job.cluster.k8s
    env = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    # The node, as the burn-in gate names a slow one (and the next render excludes it).
    env.append({"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
    if k.security == "restricted":
        env.append({"name": "HOME", "value": HOME_DIR})
    env += [{"name": name, "value": value} for name, value in job.env().items()]
    # torchrun's agent lets its workers checkpoint this long after SIGTERM (its default is
    # 30 s), ending before the kubelet's SIGKILL at terminationGracePeriodSeconds.
    shutdown = int(k.termination_grace_s) - SHUTDOWN_MARGIN_S
    env.append({"name": "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "value": str(shutdown)})
    if k.wandb_secret:
        ref = {"name": str(k.wandb_secret), "key": str(k.wandb_secret_key)}
        # A run that logs online must not start without its key; others start without it.
        if job.cfg.logger.mode != "online":
            ref["optional"] = True
        env.append({"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": ref}})
    return env


def to_yaml(obj: dict, job: SubmitJob) -> str:
    header = (
        "# Rendered by `python -m launcher.submit k8s` for run "
        f"{job.run_id}; re-render rather than edit.\n"
        "# Every field is explained in k8s/README.md and docs/kubernetes.md.\n"
    )
    header += "".join(f"# {line}\n" for line in notes(job))
    return header + yaml.safe_dump(obj, sort_keys=False, default_flow_style=False, width=1000)


def deadline_s(job: SubmitJob) -> int | None:
    """cluster.time_limit in seconds, for activeDeadlineSeconds."""
    limit = job.cluster.time_limit
    return time_limit_s(str(limit)) if limit is not None else None
