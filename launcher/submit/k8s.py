"""`python -m launcher.submit k8s`: the experiment as an Indexed Job and a headless Service.

One pod per node runs one torchrun. The pods find each other through the Service: an
Indexed Job with `spec.subdomain` gives pod <i> the hostname `<name>-<i>` and the DNS name
`<name>-<i>.<service>`, so every torchrun rendezvouses at `<name>-0.<service>:<port>`, with
its completion index as node rank. /dev/shm is a memory-backed emptyDir sized from the same
computation the trainer's preflight uses (launcher.preflight.shm_need), and the container's
memory limit holds it on top of what the processes get. `cluster.k8s.kind` renders the same
pod as a JobSet or a Kubeflow PyTorchJob instead. See docs/kubernetes.md.
"""

from __future__ import annotations

import copy
import shlex
import shutil
import subprocess
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from launcher.config import ConfigError
from launcher.preflight import shm_need
from launcher.submit import k8s_check
from launcher.submit.job import SubmitJob

KINDS = ("job", "jobset", "pytorchjob")
CONTAINER = "trainer"
SHM_VOLUME = "dshm"
RUNS_VOLUME = "runs"
RANK_PLACEHOLDER = "@NODE_RANK@"
# What each kind's pods know their node rank by (Kubernetes expands $(VAR) in args).
NODE_RANK = {"job": "JOB_COMPLETION_INDEX", "jobset": "JOB_COMPLETION_INDEX", "pytorchjob": "RANK"}
JOBSET_REPLICATED_JOB = "node"
PYTORCHJOB_PORT_NAME = "pytorchjob-port"  # the port the training operator's Services expose


def render(job: SubmitJob) -> dict[str, str]:
    """The manifests as {file name: YAML text}, checked; raise ConfigError on bad input."""
    k = job.cluster.k8s
    if k.kind not in KINDS:
        raise ConfigError(f"cluster.k8s.kind={k.kind}: not one of {', '.join(KINDS)}")
    expect = expectations(job)
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
    follow = f"follow it: kubectl logs{ns} -f --prefix -l {_instance_label(job)}={name_of(job)}"
    return f"{proc.stdout.strip()}\n{follow}"


def name_of(job: SubmitJob) -> str:
    """The objects' name: cluster.k8s.name, else <cluster.job_name>-<run id>."""
    return str(job.cluster.k8s.name or f"{job.cluster.job_name}-{job.run_id}")


def expectations(job: SubmitJob) -> k8s_check.Expect:
    """What the manifests must agree with, from the composed config."""
    k = job.cluster.k8s
    need = max(shm_need(point) for point in (job.points or [job.cfg])) * job.procs_per_node
    memory = int(k8s_check.parse_quantity(k.memory, "cluster.k8s.memory"))
    return k8s_check.Expect(
        nodes=job.nodes,
        procs_per_node=job.procs_per_node,
        gpus_per_node=int(job.cluster.gpus_per_node),
        gpu_resource=str(k.gpu_resource),
        shm_need=need,
        process_memory=memory,
        rdzv_port=int(job.cluster.rdzv_port),
    )


def shm_size_limit(job: SubmitJob, need: int) -> str:
    """/dev/shm's sizeLimit: cluster.k8s.shm_size, or the loaders' need plus the margin."""
    k = job.cluster.k8s
    if k.shm_size is not None:
        size = k8s_check.parse_quantity(k.shm_size, "cluster.k8s.shm_size")
        if size < need:
            raise ConfigError(
                f"cluster.k8s.shm_size={k.shm_size} is less than the "
                f"{k8s_check.format_bytes(need)} this config's DataLoader workers need per pod "
                f"(data.num_workers x data.prefetch_factor x batch x {job.procs_per_node} "
                "processes, see docs/shared-memory.md); raise it, leave it null to have it "
                "computed, or lower data.num_workers / data.prefetch_factor"
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


def metadata(job: SubmitJob, name: str | None = None) -> dict:
    meta: dict = {"name": name or name_of(job)}
    if job.cluster.k8s.namespace:
        meta["namespace"] = str(job.cluster.k8s.namespace)
    meta["labels"] = labels(job)
    return meta


def labels(job: SubmitJob) -> dict[str, str]:
    """User labels, then the two the Service selects the pods by."""
    own = {"app.kubernetes.io/name": "launcher", _instance_label(job): name_of(job)}
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
        "metadata": metadata(job, service_name),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {_instance_label(job): name_of(job)},
            "ports": [{"name": "rdzv", "port": port, "targetPort": port}],
        },
    }


def job_spec(job: SubmitJob, pod: dict) -> dict:
    """An Indexed Job's spec: one pod per node, each replaced when it fails."""
    k = job.cluster.k8s
    spec: dict = {
        "completionMode": "Indexed",
        "completions": job.nodes,
        "parallelism": job.nodes,
        "backoffLimit": int(k.backoff_limit),
        # A preempted or evicted pod (DisruptionTarget) is replaced without being counted:
        # the replacement rejoins the rendezvous and the run resumes from its checkpoint.
        "podFailurePolicy": {
            "rules": [
                {
                    "action": "Ignore",
                    "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                }
            ]
        },
    }
    deadline = _seconds(job.cluster.time_limit)
    if deadline:
        spec["activeDeadlineSeconds"] = deadline
    if k.ttl_after_finished_s is not None:
        spec["ttlSecondsAfterFinished"] = int(k.ttl_after_finished_s)
    spec["template"] = pod
    return spec


def indexed_job(job: SubmitJob, pod: dict) -> dict:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(job),
        "spec": job_spec(job, pod),
    }


def jobset(job: SubmitJob, pod: dict) -> dict:
    """The same Indexed Job as the only replicated Job of a JobSet, which makes the
    headless Service itself (named after the JobSet)."""
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": metadata(job),
        "spec": {
            "network": {
                "enableDNSHostnames": True,
                "publishNotReadyAddresses": True,
                "subdomain": name_of(job),
            },
            "failurePolicy": {"maxRestarts": int(job.cluster.k8s.backoff_limit)},
            "replicatedJobs": [
                {
                    "name": JOBSET_REPLICATED_JOB,
                    "replicas": 1,
                    "template": {"spec": job_spec(job, pod)},
                }
            ],
        },
    }


def pytorchjob(job: SubmitJob, pod: dict) -> dict:
    """Kubeflow's PyTorchJob: a Master and nodes-1 Workers, each with its own Service made
    by the training operator; ExitCode restarts a pod killed by a signal (exit >= 128)."""
    k = job.cluster.k8s
    run_policy: dict = {"backoffLimit": int(k.backoff_limit), "cleanPodPolicy": "None"}
    deadline = _seconds(job.cluster.time_limit)
    if deadline:
        run_policy["activeDeadlineSeconds"] = deadline
    if k.ttl_after_finished_s is not None:
        run_policy["ttlSecondsAfterFinished"] = int(k.ttl_after_finished_s)
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
        "metadata": metadata(job),
        "spec": {"runPolicy": run_policy, "pytorchReplicaSpecs": replicas},
    }


def pod_template(
    job: SubmitJob, endpoint: str, shm_size: str, process_memory: int, container: str = CONTAINER
) -> dict:
    """The pod every node runs: one container, /dev/shm in memory, the run dir on the PVC."""
    k = job.cluster.k8s
    shm_bytes = int(k8s_check.parse_quantity(shm_size, "cluster.k8s.shm_size"))
    memory_limit = k8s_check.format_bytes(process_memory + shm_bytes)
    gpus = int(job.cluster.gpus_per_node)
    requests: dict = {"cpu": str(k.cpu), "memory": memory_limit}
    limits: dict = {"memory": memory_limit}
    if gpus:
        requests[str(k.gpu_resource)] = gpus
        limits[str(k.gpu_resource)] = gpus
    command, args = container_command(job, endpoint)
    main: dict = {
        "name": container,
        "image": str(k.image),
        "imagePullPolicy": str(k.image_pull_policy),
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
    main["resources"] = {"requests": requests, "limits": limits}
    main["volumeMounts"] = [
        {"name": SHM_VOLUME, "mountPath": k8s_check.SHM_PATH},
        {"name": RUNS_VOLUME, "mountPath": str(job.run_root)},
    ]
    spec: dict = {"restartPolicy": "Never"}
    if k.kind == "pytorchjob":
        del spec["restartPolicy"]  # the operator sets it from the replica's restartPolicy
    spec["terminationGracePeriodSeconds"] = int(k.termination_grace_s)
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
    if k.affinity:
        spec["affinity"] = OmegaConf.to_container(k.affinity, resolve=True)
    spec["containers"] = [main]
    spec["volumes"] = [
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": shm_size}},
        {"name": RUNS_VOLUME, "persistentVolumeClaim": {"claimName": str(k.runs_pvc)}},
    ]
    meta: dict = {"labels": labels(job)}
    if k.annotations:
        meta["annotations"] = {str(a): str(b) for a, b in k.annotations.items()}
    return {"metadata": meta, "spec": spec}


def container_command(job: SubmitJob, endpoint: str) -> tuple[list[str], list[str]]:
    """(command, args): torchrun itself, or a shell running cluster.setup first.

    The node rank is `$(VAR)`, which Kubernetes expands from the container's environment;
    a literal `$(` in an override is escaped as `$$(` so Kubernetes leaves it alone.
    """
    k = job.cluster.k8s
    argv = job.torchrun_argv(endpoint, RANK_PLACEHOLDER)
    extra = [
        f"--max-restarts={int(k.max_restarts)}",
        f"--rdzv-conf=join_timeout={int(k.rdzv_timeout_s)}",
    ]
    argv = [argv[0], *extra, *argv[1:]]
    rank_var = NODE_RANK[k.kind]
    if not job.cluster.setup:
        argv = [a.replace("$(", "$$(").replace(RANK_PLACEHOLDER, f"$({rank_var})") for a in argv]
        return [argv[0]], argv[1:]
    script = ["set -e", *map(str, job.cluster.setup)]
    line = " ".join(shlex.quote(a) for a in argv).replace(RANK_PLACEHOLDER, f'"${rank_var}"')
    script.append(f"exec {line}")
    return ["/bin/sh", "-c"], ["\n".join(script).replace("$(", "$$(")]


def container_env(job: SubmitJob) -> list[dict]:
    """The `nccl` group's and cluster.env's variables; the W&B key only through a Secret."""
    env = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    env += [{"name": name, "value": value} for name, value in job.env().items()]
    k = job.cluster.k8s
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
    return header + yaml.safe_dump(obj, sort_keys=False, default_flow_style=False, width=1000)


def _seconds(limit: str | None) -> int | None:
    """cluster.time_limit ([D-]HH:MM:SS) in seconds, for activeDeadlineSeconds."""
    if not limit:
        return None
    text = str(limit)
    days, _, clock = text.rpartition("-")
    try:
        h, m, s = (int(p) for p in clock.split(":"))
        total = int(days or 0) * 86400 + h * 3600 + m * 60 + s
    except ValueError:
        total = -1
    if total <= 0:
        raise ConfigError(f"cluster.time_limit={text}: not [D-]HH:MM:SS; e.g. 1-12:00:00")
    return total
