"""`python -m launcher.submit k8s`: the experiment as an Indexed Job and a headless Service.

One pod per node runs one torchrun. The pods find each other through the Service: an
Indexed Job with `spec.subdomain` gives pod <i> the hostname `<name>-<i>` and the DNS name
`<name>-<i>.<service>`, so every torchrun rendezvouses at `<name>-0.<service>:<port>`, with
its completion index as node rank. /dev/shm is a memory-backed emptyDir sized from the same
computation the trainer's preflight uses (launcher.plan.memory.shm_need), and the container's
memory limit holds it on top of what the processes get (node_memory, shared with Slurm's
--mem). `cluster.k8s.kind` renders the same pod as a JobSet, a Kubeflow PyTorchJob or a
Kubeflow Trainer v2 TrainJob instead: each kind is a module declaring a `Kind` (kind.py)
with its objects and their check, found as a `launcher.k8s_kinds` entry point (`kinds()`);
the pod is pod.py's, the checks of cluster.k8s.* checks.py's, the names and labels
names.py's. See docs/kubernetes.md.

Each pod runs `python -m launcher.torchrun`, which exits with the job's contract code
(launcher/resilience/exit_codes.py); the failure policies act on it: bad input, a non-finite
loss and out of memory fail the job at once, a crash or a hang is retried within a per-node budget,
and a disruption (preemption, eviction, drain) is not counted at all.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

import yaml
from omegaconf import DictConfig

from launcher.config import ConfigError, plugins
from launcher.resilience import bad_hosts
from launcher.submit import k8s_check, stop_time
from launcher.submit.job import SubmitJob
from launcher.submit.k8s.checks import (
    MIN_VERSION,
    check_options,
    expectations,
    pod_memory,
    shm_size_limit,
    without_default_tier,
)
from launcher.submit.k8s.kind import Kind
from launcher.submit.k8s.names import INSTANCE_LABEL, name_of
from launcher.submit.k8s.pod import floating, pinned, pod_template, without_nodes

# What tests and the burn-in docs reach through this module.
__all__ = [
    "kinds",
    "MIN_VERSION",
    "expectations",
    "notes",
    "rehearse",
    "render",
    "submit",
    "without_nodes",
]

ENTRY_POINTS = "launcher.k8s_kinds"  # modules whose KIND is a Kind


def kinds() -> dict[str, Kind]:
    """cluster.k8s.kind's options, by name: the launcher's own, then other packages'."""
    return plugins.by_name(plugins.loaded(ENTRY_POINTS, "KIND"), "Kubernetes kind")


def render(job: SubmitJob) -> dict[str, str]:
    """The manifests as {file name: YAML text}, checked; raise ConfigError on bad input."""
    k, declared = job.cluster.k8s, kinds()
    if k.kind not in declared:
        raise ConfigError(f"cluster.k8s.kind={k.kind}: not one of {', '.join(declared)}")
    check_options(job)
    memory = pod_memory(job)
    expect = without_default_tier(job, expectations(job, memory))
    shm_size = shm_size_limit(job, dataclasses.replace(memory, shm_need=expect.shm_need))
    kind = declared[k.kind]
    objects = build(job, kind, shm_size, expect.process_memory)
    k8s_check.check([obj for _, obj in objects], expect, kind)
    return {filename: to_yaml(obj, job) for filename, obj in objects}


def build(job: SubmitJob, kind: Kind, shm_size: str, process_memory: int):
    """(file name, object) pairs of `kind`, in the order kubectl applies them."""
    pod = pod_template(job, kind, kind.endpoint(job), shm_size, process_memory)
    return kind.objects(job, pod)


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
    after = kinds()[job.cluster.k8s.kind].after_apply(kubectl, job)
    if after:
        applied += "\n" + after
    follow = f"follow it: kubectl logs{ns} -f --prefix -l {INSTANCE_LABEL}={name_of(job)}"
    return f"{applied}\n{follow}"


def notes(job: SubmitJob) -> list[str]:
    """What must exist before the manifests can run, and how the objects are removed."""
    k = job.cluster.k8s
    kind = kinds()[k.kind]
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
    if job.cluster.secrets:
        names = [str(n) for n in job.cluster.secrets]
        literals = " ".join(f'--from-literal={n}="${n}"' for n in names)
        lines.append(
            f"needs: Secret {k.env_secret} with key(s) {', '.join(names)} (cluster.secrets: "
            f"kubectl create secret generic {k.env_secret} {literals}{ns_flag})"
        )
    if not pinned(str(k.image)) and not floating(str(k.image)):
        lines.append(
            f"image: cluster.k8s.image={k.image} is a tag, which names a build only until it "
            "is pushed again (a later pod would run the new one, nodes that pulled it keep "
            "theirs); pin a digest (repo/launcher@sha256:...) for a long run"
        )
    refused = bad_hosts.read(job.run_dir)
    if refused:
        lines.append(
            f"excluded: node(s) {', '.join(refused)}, kept off by this run "
            f"({job.run_dir / bad_hosts.FILE}: burn-in refusals, hang culprits, device errors, "
            "stragglers; docs/faults.md)"
        )
    lines += kind.needs(job)
    if k.gang == "kueue":
        lines.append(f"needs: Kueue with a LocalQueue {k.queue} in {ns}")
    if k.gang == "volcano":
        lines.append("needs: Volcano (1.12 or later for a plain Job's group-min-member)")
    return lines + kind.remove(job)


def rehearse(seen, k: DictConfig, key: str, write: stop_time.WriteTime) -> None:
    """launcher.rehearse's cluster case: the grace period holds the stop checkpoint's
    write, and a replaced pod re-rendezvouses, a limited number of times."""
    seen.ok(
        f"termination_grace_s={k.termination_grace_s} holds the {write.seconds:.1f} s "
        f"stop checkpoint ({write.why})"
    )
    seen.require(k.max_restarts >= 1, f"{key}.max_restarts=0: a replaced pod ends the job")
    seen.ok(f"restarts limited to torchrun --max-restarts={k.max_restarts}, "
            f"{k.backoff_limit_per_node} failed pods per node")  # fmt: skip


def to_yaml(obj: dict, job: SubmitJob) -> str:
    header = (
        "# Rendered by `python -m launcher.submit k8s` for run "
        f"{job.run_id}; re-render rather than edit.\n"
        "# Every field is explained in k8s/README.md and docs/kubernetes.md.\n"
    )
    header += "".join(f"# {line}\n" for line in notes(job))
    return header + yaml.safe_dump(obj, sort_keys=False, default_flow_style=False, width=1000)
