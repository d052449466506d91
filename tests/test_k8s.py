"""Kubernetes: the rendered manifests, checked, schema-validated, and run as pods.

There is no cluster here. The manifests are validated against Kubernetes' own OpenAPI
schemas (kubernetes-validate --strict, offline), the renderer's checks are exercised on
broken manifests, and the Indexed Job's pods are run the way Kubernetes would run them
(tests/pods.py: one network namespace, hostname and /dev/shm per pod, the container's
command and environment exactly as rendered): they rendezvous and train into one run
directory, and a killed pod, started again, rejoins and the run resumes from its checkpoint.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from launcher.config import ConfigError
from launcher.preflight import shm_need
from launcher.submit import k8s, k8s_check
from launcher.submit.__main__ import main
from launcher.submit.job import prepare

from launch import FAST, losses, summary
from pods import IndexedJobPods, can_run_pods

REPO = Path(__file__).resolve().parent.parent
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
REGENERATE = "LAUNCHER_UPDATE_EXAMPLES=1 python -m pytest tests/test_k8s.py -k example"


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
    assert spec["podFailurePolicy"]["rules"][0]["action"] == "Ignore"
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"]
    assert pod["subdomain"] == svc["metadata"]["name"] == "launcher-example"
    c = pod["containers"][0]
    assert c["command"] == ["torchrun"]
    assert "--nnodes=2" in c["args"] and "--node-rank=$(JOB_COMPLETION_INDEX)" in c["args"]
    assert "--rdzv-endpoint=launcher-example-0.launcher-example:29500" in c["args"]
    res = c["resources"]
    assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"] == 8
    # /dev/shm: the loaders' need on 8 ranks plus the 1 GiB margin, held by the memory limit.
    need = shm_need(job.cfg) * 8
    shm = pod["volumes"][0]
    assert shm["emptyDir"] == {
        "medium": "Memory",
        "sizeLimit": k8s_check.format_bytes(need + 2**30),
    }
    memory = k8s_check.parse_quantity(res["limits"]["memory"], "limit")
    assert memory == 64 * 2**30 + k8s_check.parse_quantity(shm["emptyDir"]["sizeLimit"], "shm")
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


def test_manifests_pass_kubernetes_validate_strict(tmp_path):
    """Every kind, with every optional field set, against Kubernetes 1.37's schemas."""
    full = [
        "cluster.nodes=2",
        "cluster.gpus_per_node=8",
        "trainer.global_batch_size=64",
        "+exp=bucket_sweep",
        "logger=wandb",
        "logger.mode=online",
        "nccl=infiniband",
        f"run.root={tmp_path / 'runs'}",
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
    ]
    sweep = render_into(tmp_path / "sweep", full)
    sweep_job = objects(sweep)["Job"]
    container = sweep_job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["/bin/sh", "-c"]
    assert (
        "exec torchrun" in container["args"][0]
        and '"$JOB_COMPLETION_INDEX"' in container["args"][0]
    )
    assert {"name": "NCCL_IB_DISABLE", "value": "0"} in container["env"]
    key = next(e for e in container["env"] if e["name"] == "WANDB_API_KEY")
    assert key == {
        "name": "WANDB_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}},
    }
    assert sweep_job["spec"]["activeDeadlineSeconds"] == 86400
    for kind in ("jobset", "pytorchjob"):
        render_into(
            tmp_path / kind, [*EXAMPLE[:3], f"run.root={tmp_path}", f"cluster.k8s.kind={kind}"]
        )
    files = sorted(str(p) for p in tmp_path.glob("*/*.yaml")) + sorted(
        str(p) for p in EXAMPLE_DIR.glob("*.yaml")
    )
    assert len(files) == 6
    tool = shutil.which("kubernetes-validate", path=str(Path(sys.executable).parent))
    proc = subprocess.run(
        [tool, "--strict", "-k", "1.37.0", *files], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    passed = [ln for ln in proc.stdout.splitlines() if "passed" in ln]
    assert len(passed) == 4, proc.stdout  # Job and Service twice; the CRDs only warn
    assert "no schema" in proc.stdout + proc.stderr or "JobSet" in proc.stdout + proc.stderr


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
            "cluster.k8s.shm_size=16Mi is less than the 64Mi",
        ),
        (["cluster.k8s.name=Bad_Name"], "metadata.name='Bad_Name' is not a valid DNS label"),
        ([f"cluster.job_name={'x' * 60}"], "is not a valid DNS label"),
        (["cluster.gpus_per_node=6"], "trainer.global_batch_size=64 is not divisible"),
        (["cluster.k8s.kind=deployment"], "cluster.k8s.kind=deployment: not one of"),
        (["cluster.k8s.memory=lots"], "cluster.k8s.memory='lots': not a Kubernetes quantity"),
        (["+cluster.env.WANDB_API_KEY=abc"], "WANDB_API_KEY is a secret written into the manifest"),
    ],
    ids=["shm", "name", "long-name", "gpus-vs-batch", "kind", "quantity", "secret"],
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
        "beside /dev/shm's sizeLimit 65Gi, less than cluster.k8s.memory=64Gi",
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
    "completions": (_break("Job spec completions", 3), "spec.completions=3, expected 2"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_checks_name_the_broken_field(example, case):
    job, files = example
    broken, expected = BROKEN[case]
    objs = copy.deepcopy(objects(files))
    broken(objs)
    with pytest.raises(ConfigError) as err:
        k8s_check.check(list(objs.values()), k8s.expectations(job))
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


def rendered_pods(tmp_path: Path, run_id: str) -> IndexedJobPods:
    reason = can_run_pods()
    if reason:
        pytest.skip(f"cannot run pods here: {reason}")
    job = prepare("k8s", [*POD_RUN, f"run.root={tmp_path / 'runs'}", f"run.id={run_id}",
                          f"cluster.workdir={tmp_path}"])  # fmt: skip
    paths = job.write(k8s.render(job))
    objs = {yaml.safe_load(p.read_text())["kind"]: yaml.safe_load(p.read_text()) for p in paths}
    venv_bin = Path(sys.executable).parent
    image_env = {  # what the container image itself provides
        "PATH": f"{venv_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "LAUNCHER_CACHE_DIR": os.environ["LAUNCHER_CACHE_DIR"],
    }
    state = tmp_path / f"pods-{run_id}"
    state.mkdir()
    return IndexedJobPods(objs["Job"], objs["Service"], image_env, tmp_path, state)


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
    assert sorted(p.name for p in (run_dir / "logs").iterdir()) == ["rank0.log", "rank1.log"]
    env = yaml.safe_load((run_dir / "env.json").read_text())
    # The trainer saw the pod's hostname and a /dev/shm of the rendered sizeLimit.
    assert env["hostname"] in ("launcher-ref-0", "launcher-ref-1")
    size = cluster.pod_spec["volumes"][0]["emptyDir"]["sizeLimit"]
    assert env["shm"]["size_bytes"] == k8s_check.parse_quantity(size, "shm") == 2**20
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
