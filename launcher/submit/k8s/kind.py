"""What a Kubernetes kind (`cluster.k8s.kind`) declares: a module per kind holds one `Kind`,
and the renderer (launcher.submit.k8s) builds the same pod for each, asks the kind for its
rendezvous endpoint, wraps the pod in the kind's objects and has the kind check them. The
kinds are the `launcher.k8s_kinds` entry points (the built-in ones in the launcher's
pyproject.toml, another package's in its own): a new kind is its module and its doc.
docs/architecture.md, "Adding a Kubernetes kind"."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from launcher.submit.job import SubmitJob
from launcher.submit.k8s_check import Expect

CONTAINER = "trainer"


def _no_lines(_job: SubmitJob) -> list[str]:
    return []


def _nothing_after(_kubectl: str, _job: SubmitJob) -> str | None:
    return None


@dataclass(frozen=True)
class Kind:
    name: str
    # (job) -> host:port of node 0, where every torchrun rendezvouses
    endpoint: Callable[[SubmitJob], str]
    # (job, pod template) -> [(file name, object)], in the order kubectl applies them
    objects: Callable[[SubmitJob, dict], list[tuple[str, dict]]]
    # (the rendered objects, what they must agree with): raise ConfigError, one line naming
    # the object and the field, on what schema validation cannot see (its workload's shape,
    # its pods through launcher.submit.k8s_check.check_pod, the rendezvous endpoint)
    check: Callable[[list[dict], Expect], None]
    node_rank: str = "JOB_COMPLETION_INDEX"  # the variable its pods know their node rank by
    container: str = CONTAINER  # the training container's name
    port_name: str = "rdzv"  # the rendezvous port's name
    # the pod says restartPolicy: Never (False: the kind's operator sets it)
    pod_restart_policy: bool = True
    needs: Callable[[SubmitJob], list[str]] = _no_lines  # notes: what must exist besides
    remove: Callable[[SubmitJob], list[str]] = _no_lines  # notes: how its objects are removed
    # (kubectl, job) -> a line to print once `kubectl apply` made the objects
    after_apply: Callable[[str, SubmitJob], str | None] = _nothing_after
