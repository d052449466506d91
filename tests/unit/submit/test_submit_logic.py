"""What `python -m launcher.submit` renders and refuses, for every cluster, without a cluster:
the CPU request each renderer computes (secrets: test_secret_checks.py), values Hydra would
retype refused in every key that becomes shell text, the files a run reads checked at
submit where this host sees them, and what a container job mounts. tests/cluster/ shows the
same on a real Slurm cluster and in pods."""

from __future__ import annotations

import copy
import json
import os
import re
import time
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from launcher.checkpoint.protocol import CheckpointWriter
from launcher.config import ConfigError, compose
from launcher.config.backends import backends
from launcher.config.model_shape import GPT2_VOCAB, param_count
from launcher.config.schema import ClusterBase
from launcher.model.build import build_model
from launcher.plan.forecast import checkpoint_bytes
from launcher.submit import k8s, k8s_check, pod_security, slurm
from launcher.submit.__main__ import main as submit_main
from launcher.submit.job import prepare
from launcher.submit.node_memory import PROCESS_MARGIN, node_memory

from launch import FAST
from submit_render import SHAPE, render

TARGETS = ("slurm", "k8s")


def refused(target: str, tmp_path: Path, capsys, *overrides: str) -> str:
    """The one error line a --dry-run prints; asserts exit 2 and that nothing was written."""
    err = refused_in(tmp_path / "runs", "bad", capsys, *overrides, target=target)
    assert not (tmp_path / "runs" / "bad").exists()
    return err


def refused_in(root: Path, run_id: str, capsys, *overrides: str, target="k8s") -> str:
    """The one error line of a --dry-run into run.root=`root`, run.id=`run_id`."""
    args = [*FAST, *SHAPE[target], f"run.root={root}", f"run.id={run_id}", *overrides]
    code = submit_main([target, "--dry-run", *args])
    out, err = capsys.readouterr()
    assert code == 2 and out == "", err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert not (root / run_id / "submit").exists()
    return err


def pod_container(files: dict[str, str]) -> dict:
    job = yaml.safe_load(files["job.yaml"])
    return job["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize(
    "overrides, cpus",
    [
        ([], 1),  # FAST: one process, no DataLoader workers
        (["cluster.procs_per_node=2", "data.num_workers=3"], 8),  # 2 x (1 + 3)
    ],
)
def test_cpus_per_node_are_requested_by_every_renderer(tmp_path, overrides, cpus):
    """Slurm's --cpus-per-task (on the job and again on srun, which no longer inherits
    it) and the pod's CPU request are the same figure: each rank and each of its workers."""
    script = render("slurm", tmp_path / "s", *overrides)["job.sbatch"]
    assert f"#SBATCH --cpus-per-task={cpus}\n" in script
    assert f"srun --nodes=1 --ntasks-per-node=1 --cpus-per-task={cpus} " in script
    pod = pod_container(render("k8s", tmp_path / "k", *overrides))
    assert pod["resources"]["requests"]["cpu"] == str(cpus)


def test_given_cpus_are_kept_and_too_few_warned(tmp_path, capsys):
    over = ["cluster.procs_per_node=2", "data.num_workers=1"]
    script = render("slurm", tmp_path, *over, "cluster.slurm.cpus_per_task=3")["job.sbatch"]
    assert "#SBATCH --cpus-per-task=3\n" in script
    assert "--cpus-per-task=3 --cpu-bind=cores --wait" in script
    err = capsys.readouterr().err
    assert "warning: cluster.slurm.cpus_per_task=3 is less than the 4 CPUs" in err
    script = render("slurm", tmp_path, *over, "cluster.slurm.cpus_per_task=16", run_id="big")
    assert "#SBATCH --cpus-per-task=16\n" in script["job.sbatch"]
    assert "warning" not in capsys.readouterr().err
    gpus = render("slurm", tmp_path, "cluster.gpus_per_node=2", run_id="gpu")["job.sbatch"]
    assert "#SBATCH --gpus-per-node=2\n#SBATCH --cpus-per-task=2\n" in gpus


@pytest.mark.parametrize("target", TARGETS)
def test_a_variable_that_only_contains_a_secret_word_is_not_refused(tmp_path, target):
    files = render(target, tmp_path, "+cluster.env.TOKENIZERS_PARALLELISM=false_")
    assert "TOKENIZERS_PARALLELISM" in "".join(files.values())


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    "override, typed",
    [
        ("cluster.setup=[false]", "bool False"),
        ("+cluster.env.DEBUG=true", "bool True"),
        ("+cluster.env.SCALE=1e3", "float 1000.0"),
        ("+cluster.env.RATIO=1.50", "float 1.5"),
        ("+cluster.env.STEPS=1_000", "int 1000"),
    ],
)
def test_values_hydra_retypes_are_refused_in_shell_text(tmp_path, capsys, target, override, typed):
    err = refused(target, tmp_path, capsys, override)
    assert f"error: {override}: Hydra reads a value here as the {typed}" in err
    assert "quote it to keep it as typed" in err


@pytest.mark.parametrize(("target", "given", "wait"), [
    ("slurm", (), "5"),  # nothing replaces a node inside an allocation: end soon
    ("slurm", ("+cluster.env.LAUNCHER_LOST_NODE_S=45",), "45"),  # the user's wins
    ("k8s", (), "900"),  # a pod is rescheduled: wait the rendezvous timeout
])  # fmt: skip
def test_a_lost_nodes_wait_is_the_schedulers(tmp_path, target, given, wait):
    """How long the other nodes wait for a lost node's replacement before ending with 8
    (LAUNCHER_LOST_NODE_S, launcher.resilience.node_presence): what the scheduler can do."""
    files = render(target, tmp_path, *given)
    if target == "slurm":
        text = "".join(files.values())
        assert re.findall(r"^export LAUNCHER_LOST_NODE_S=(.*)$", text, re.M) == [wait]
    else:
        assert {"name": "LAUNCHER_LOST_NODE_S", "value": wait} in pod_container(files)["env"]


@pytest.mark.parametrize("target", TARGETS)
def test_quoted_shell_text_is_written_as_typed(tmp_path, target):
    files = render(
        target,
        tmp_path,
        'cluster.setup=["false || true"]',
        "+cluster.env.DEBUG='true'",
        "+cluster.env.UMASK='0022'",
        "+cluster.env.THREADS=4",
    )
    text = "".join(files.values())
    assert "False" not in text and "false || true" in text
    if target == "slurm":
        assert "export DEBUG=true\nexport UMASK=0022\nexport THREADS=4\n" in text
    else:
        env = pod_container(files)["env"]
        assert {"name": "UMASK", "value": "0022"} in env
        assert {"name": "THREADS", "value": "4"} in env


@pytest.mark.parametrize("target", TARGETS)
def test_files_the_run_reads_are_checked_at_submit(tmp_path, capsys, target):
    """Where this host sees the file system (its top folder exists here), a missing data
    file, pretrained folder or tokenizer is refused now, not after the queue wait."""
    missing = tmp_path / "data" / "gone.txt"
    cases = [
        (
            ["data=text_files", f"data.paths=[{missing}]"],
            f"data.paths: no file matches '{missing}'",
        ),
        ([f"model.init_from={tmp_path}/nope"], f"model.init_from={tmp_path}/nope: no such folder"),
        ([f"data.tokenizer={tmp_path}/tok.tiktoken"], "data.tokenizer="),
        ([f"resume={tmp_path}/old-run"], f"resume={tmp_path}/old-run: no complete checkpoint"),
    ]
    for overrides, words in cases:
        err = refused(target, tmp_path, capsys, *overrides)
        assert words in err and "(checked at submit: the job would fail on the nodes)" in err


@pytest.mark.parametrize("target", TARGETS)
def test_files_on_a_file_system_this_host_lacks_are_left_to_the_nodes(tmp_path, target):
    text = "".join(
        render(target, tmp_path, "data=text_files", "data.paths=[/no-such-fs/a/*.txt]").values()
    )
    assert "data.paths=[/no-such-fs/a/*.txt]" in text


def test_a_relative_data_path_is_checked_under_the_workdir(tmp_path, capsys):
    work = tmp_path / "work"
    (work / "corpus").mkdir(parents=True)
    (work / "corpus" / "a.txt").write_text("text\n")
    common = ["data=text_files", f"cluster.workdir={work}"]
    render("slurm", tmp_path, *common, "data.paths=[corpus/*.txt]")
    capsys.readouterr()
    err = refused("slurm", tmp_path, capsys, *common, "data.paths=[corpus/*.md]")
    assert "data.paths: no file matches 'corpus/*.md'" in err


def test_a_missing_venv_is_refused(tmp_path, capsys):
    err = refused("slurm", tmp_path, capsys, f"cluster.slurm.venv={tmp_path}/venv")
    assert f"cluster.slurm.venv={tmp_path}/venv: {tmp_path}/venv/bin/activate does not exist" in err


def test_the_warning_during_setup_and_a_failed_srun_are_named_truthfully(tmp_path):
    script = render("slurm", tmp_path)["job.sbatch"]
    assert (
        'echo "launcher: $stop during setup: training did not start and wrote no checkpoint; '
        'exit code 143"'
    ) in script
    during = script.index('if [ -n "$stop" ]; then')
    assert during < script.index("  srun --nodes") < script.index("training ended with exit code")
    assert "failed before any rank wrote a log: see srun's lines above" in script


def test_container_mounts_name_and_workdir(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("LAUNCHER_CACHE_DIR", str(cache))
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("")
    image = "nvcr.io#nvidia/pytorch:24.05-py3"
    over = [f"cluster.slurm.container_image={image}", f"cluster.slurm.venv={venv}"]
    script = render("slurm", tmp_path / "runs", *over)["job.sbatch"]
    srun = next(line for line in script.splitlines() if line.lstrip().startswith("srun "))
    mounts = re.search(r"--container-mounts=(\S+)", srun).group(1).strip("'").split(",")
    home = Path.home().resolve()
    want = [Path.cwd().resolve(), (tmp_path / "runs").resolve(), cache.resolve(), home, venv]
    want = [p for p in want if not any(p != q and p.is_relative_to(q) for q in want)]
    assert mounts == [f"{p}:{p}" for p in want]
    assert f"  {{ mkdir -p {cache}\n  }} || setup_failed" in script  # a mount's source exists
    name = re.search(r"--container-name=(\S+)", srun).group(1)
    assert re.fullmatch(r"launcher-[0-9a-f]{12}", name)
    # The nodes' codes are read where the launcher is installed: in the job's container.
    aggregate = next(ln for ln in script.splitlines() if "launcher.resilience.exit_codes" in ln)
    assert aggregate.startswith(
        f"  code=$(srun --nodes=1 --ntasks=1 --container-image={image} --container-name={name} "
    )
    # Apptainer/Singularity: the image run by the runtime on each node and for the codes.
    sif = tmp_path / "launcher.sif"
    app = render(
        "slurm",
        tmp_path / "runs",
        f"cluster.slurm.container_image={sif}",
        "cluster.slurm.container_runtime=apptainer",
        run_id="r5",
    )["job.sbatch"]
    assert "--container-image" not in app
    binds = "--bind " + re.search(r"--bind (\S+)", app).group(1)
    run = f"apptainer exec {binds} --pwd {Path.cwd()} {sif} python -m "
    assert f"--wait=60 \\\n    {run}launcher.torchrun \\\n" in app
    assert f"code=$({run}launcher.resilience.exit_codes " in app
    # One name per image: a requeue and a later job reuse it; another image gets another.
    again = render("slurm", tmp_path / "runs", *over, run_id="r2")["job.sbatch"]
    assert f"--container-name={name} " in again
    other = render(
        "slurm", tmp_path / "runs", "cluster.slurm.container_image=ubuntu:24.04", run_id="r3"
    )
    assert f"--container-name={name} " not in other["job.sbatch"]
    mine = render("slurm", tmp_path / "runs", *over, "cluster.slurm.container_name=pt", run_id="r4")
    assert "--container-name=pt " in mine["job.sbatch"]


@pytest.mark.parametrize("target", TARGETS)
def test_a_shell_brace_variable_is_refused_with_the_escape(tmp_path, capsys, target):
    """`${VAR}` is OmegaConf's interpolation: unescaped it failed with a traceback."""
    err = refused(target, tmp_path, capsys, 'cluster.setup=["echo ${HOME}"]')
    assert "error: cluster.setup[0]: ${...} is read as a config interpolation here" in err
    files = render(target, tmp_path, 'cluster.setup=["echo \\${HOME}/x"]')
    assert "echo ${HOME}/x" in "".join(files.values())


def k8s_pod(files: dict[str, str]) -> dict:
    return yaml.safe_load(files["job.yaml"])["spec"]["template"]["spec"]


# Each rule of Pod Security 'restricted' (launcher.submit.pod_security), broken once.
PSS_BREAKS = {
    "host network": (lambda p: p.update(hostNetwork=True), "spec.hostNetwork: must not be true"),
    "hostPath": (
        lambda p: p["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
        "spec.volumes[4]: hostPath volumes are not allowed",
    ),
    "privileged": (
        lambda p: p["containers"][0]["securityContext"].update(privileged=True),
        "securityContext.privileged: must not be true",
    ),
    "escalation": (
        lambda p: p["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"),
        "securityContext.allowPrivilegeEscalation: must be false",
    ),
    "capability": (
        lambda p: p["containers"][0]["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]),
        "capabilities.add: SYS_ADMIN breaks baseline or restricted",
    ),
    "no drop": (
        lambda p: p["containers"][0]["securityContext"].pop("capabilities"),
        "capabilities.drop: must include ALL",
    ),
    "root": (
        lambda p: p["securityContext"].update(runAsUser=0),
        "runAsUser must not be 0",
    ),
    "may be root": (
        lambda p: p["securityContext"].pop("runAsNonRoot"),
        "runAsNonRoot must be true",
    ),
    "unconfined": (
        lambda p: p["securityContext"].update(seccompProfile={"type": "Unconfined"}),
        "seccompProfile.type must be RuntimeDefault or Localhost",
    ),
    "host port": (
        lambda p: p["containers"][0]["ports"][0].update(hostPort=29500),
        "hostPort 29500 is not allowed",
    ),
    "sysctl": (
        lambda p: p["securityContext"].update(sysctls=[{"name": "kernel.msgmax", "value": "1"}]),
        "kernel.msgmax is not a safe sysctl",
    ),
}


@pytest.mark.parametrize("case", list(PSS_BREAKS))
def test_pod_security_restricted_rules_each_catch_their_break(tmp_path, case):
    """The default pod passes every rule; each broken field is named, and the renderer's
    own check refuses the manifest with it."""
    job = prepare("k8s", [*FAST, *SHAPE["k8s"], f"run.root={tmp_path}", "run.id=p"])
    files = k8s.render(job)
    pod = k8s_pod(files)
    assert pod_security.violations(pod) == []
    breaks, words = PSS_BREAKS[case]
    broken = copy.deepcopy(pod)
    breaks(broken)
    found = pod_security.violations(broken)
    assert len(found) == 1 and words in found[0], found
    objs = [yaml.safe_load(text) for text in files.values()]
    jb = next(o for o in objs if o["kind"] == "Job")
    jb["spec"]["template"]["spec"] = broken
    with pytest.raises(ConfigError, match="Pod Security 'restricted'"):
        k8s_check.check(objs, k8s.expectations(job), k8s.kinds()["job"])


def test_root_is_the_explicit_opt_out(tmp_path):
    pod = k8s_pod(render("k8s", tmp_path, "cluster.k8s.security=root"))
    c = pod["containers"][0]
    assert "securityContext" not in pod and "securityContext" not in c
    assert [v["name"] for v in pod["volumes"]] == ["dshm", "runs"]
    assert all(e["name"] != "HOME" for e in c["env"])


def test_restricted_with_rdma_warns_that_the_namespace_must_be_privileged(tmp_path, capsys):
    render("k8s", tmp_path, "cluster.k8s.rdma_resource=rdma/ib")
    err = capsys.readouterr().err
    assert "warning: cluster.k8s.rdma_resource=rdma/ib adds the IPC_LOCK capability" in err


def test_the_state_size_estimate_is_the_models_own_parameter_count():
    """param_count from the shape equals the parameters of the model built."""
    for model in ("gpt2-tiny", "gpt2"):
        cfg = prepare("k8s", [f"model={model}", "cluster.gpus_per_node=0"], check_paths=False).cfg
        built = build_model(cfg.model, GPT2_VOCAB)
        assert param_count(cfg.model) == sum(p.numel() for p in built.parameters()), model


@pytest.mark.parametrize("target", TARGETS)
def test_a_stop_too_short_for_the_models_checkpoint_is_refused(tmp_path, capsys, target):
    """gpt2-xl's weights and AdamW state with the run's 512-token BPE, 1.47e9 x 12 bytes
    (and torch.save's entries), written by rank 0 alone, do not fit into the default grace
    (120 s) or warning lead (300 s) at 50 MB/s a writing rank; faster storage, given, does."""
    key, xl = f"cluster.{target}", ["model=gpt2-xl", "data.tokenizer=bpe"]
    err = refused(target, tmp_path, capsys, *xl, f"{key}.checkpoint_write_mb_s=50")
    cfg = compose([*FAST, *SHAPE[target], *xl])
    size = checkpoint_bytes(cfg, 1)["per_rank"]
    assert size == pytest.approx(param_count(replace_vocab(cfg, 512)) * 12, rel=1e-4)
    assert (
        f"is too short to stop with a checkpoint: a {size / 50e6:.0f} s checkpoint write "
        f"({size / 1e9:.2f} GB of model and optimizer state on the largest writing rank "
        f"(gpt2-xl, launcher.plan) at {key}.checkpoint_write_mb_s=50 a writing rank)"
    ) in err
    render(target, tmp_path, *xl, f"{key}.checkpoint_write_mb_s=1000")


def replace_vocab(cfg, vocab: int):
    model = cfg.model.copy()
    model.vocab_size = vocab
    return model


def test_the_runs_own_last_checkpoint_time_is_used(tmp_path, capsys):
    """A run that has checkpointed before: its meta.json's write time (written by the real
    CheckpointWriter, here a save that takes 1.5 s) is what the grace must hold."""
    run_dir = tmp_path / "runs" / "again"

    def slow_write(folder: Path) -> None:
        (folder / "model_rank0.pt").write_bytes(b"x" * 1000)
        time.sleep(1.5)

    writer = CheckpointWriter(run_dir / "checkpoints", is_main=True, barrier=lambda: None, keep=2)
    writer.save(7, slow_write, {})
    err = refused_in(tmp_path / "runs", "again", capsys, "cluster.k8s.termination_grace_s=11")
    assert "a 2 s checkpoint write (the run's last checkpoint (step_00000007) took 1.5" in err


NO_TIME = "cluster.time_limit=00:00:30 (30 s) leaves no time"


LIMITS = [
    ("k8s", ["cluster.time_limit=00:00:30"], NO_TIME),
    ("k8s", ["cluster.time_limit=2"], "(120 s) leaves no time to train: it is no longer than"),
    (
        "k8s",
        [
            "cluster.time_limit=01:00:00",
            "cluster.k8s.step_time_s=20",
            "trainer.checkpoint_interval=200",
        ],
        "cluster.k8s.step_time_s=20.0 = 4000 s, but only 3600 s remain before the deadline",
    ),
    ("slurm", ["cluster.time_limit=00:00:30"], NO_TIME),
    ("k8s", ["cluster.k8s.version=1.28"], "cluster.k8s.version=1.28: the manifests need 1.29"),
    ("k8s", ["cluster.k8s.version=latest"], "cluster.k8s.version=latest: not a Kubernetes"),
]


@pytest.mark.parametrize("target, overrides, words", LIMITS)
def test_time_limits_and_versions_every_renderer_refuses(
    tmp_path, capsys, target, overrides, words
):
    assert words in refused(target, tmp_path, capsys, *overrides)


def test_the_script_carries_no_override_and_only_its_user_reads_it(tmp_path):
    """The trainer's overrides reach the ranks through a 0600 file the script writes (its
    path in LAUNCHER_ARGS_FILE), not through srun's argument list; --export names what the
    job gets of the submitting shell."""
    from launcher.runtime.args_file import ARGS_FILE_ENV, with_args_file

    over = ["trainer.max_steps=7", "cluster.slurm.export=[MY_DATA_DIR]", "cluster.nodes=2"]
    script = render("slurm", tmp_path, *over)["job.sbatch"]
    path = tmp_path / "r" / "submit" / "job.sbatch"
    assert path.stat().st_mode & 0o777 == 0o600
    step = script.split("  srun ")[1].split(" &\n")[0]
    assert "-m launcher.train" in step and "trainer.max_steps" not in step
    args = script.split("<<'LAUNCHER_ARGS'\n")[1].split("\nLAUNCHER_ARGS\n")[0]
    want = ["cluster=slurm", *FAST, f"run.root={tmp_path}", "run.id=r", *over]
    assert sorted(json.loads(args)) == sorted(want)
    assert f'export {ARGS_FILE_ENV}="$run_dir/submit/args.$SLURM_JOB_ID.json"' in script
    assert "umask 077" in script.split("srun ")[0]
    export = re.search(r"#SBATCH --export=(\S+)", script).group(1).split(",")
    assert export[:3] == ["PATH", "HOME", "USER"] and export[-1] == "MY_DATA_DIR"
    (tmp_path / "a.json").write_text(args)
    os.environ[ARGS_FILE_ENV] = str(tmp_path / "a.json")
    try:
        assert with_args_file(["--cfg", "job"]) == [*json.loads(args), "--cfg", "job"]
    finally:
        del os.environ[ARGS_FILE_ENV]
    assert with_args_file(["x=1"]) == ["x=1"]


def test_reserved_ports_and_module_init(tmp_path):
    script = render(
        "slurm", tmp_path, "cluster.slurm.resv_ports=true", "cluster.slurm.modules=[cuda/12.4]"
    )["job.sbatch"]
    assert "--wait=60 --resv-ports=1 \\\n    bash -c 'exec \"${@//@PORT@/" in script
    assert '--rdzv-endpoint="$head_node:@PORT@"' in script
    setup = script.split("\n(\n")[1].split("\n) &\n")[0]
    assert setup.splitlines()[0].startswith("  type module >/dev/null 2>&1 || for init in ")
    assert "  { module load cuda/12.4\n  } || setup_failed $? 'module load cuda/12.4'" in setup


@pytest.mark.parametrize(
    "target, override",
    [("slurm", "cluster.slurm.mem_per_process=100M"), ("k8s", "cluster.k8s.memory=100Mi")],
)
def test_a_process_memory_below_the_plans_need_is_refused(tmp_path, capsys, target, override):
    """A rank's process alone is 0.4 GB (launcher.plan.host): a node asking less for its
    processes would be killed for memory at start-up; one line, exit 2, nothing written."""
    err = refused(target, tmp_path, capsys, override)
    assert err.startswith(f"error: {override}")
    assert "GiB the job's processes need on a node (launcher.plan: 1 rank(s)" in err
    assert err.rstrip().endswith("leave it null to have it sized from the plan")


def test_memory_is_the_pod_arithmetic_or_the_whole_node(tmp_path, capsys):
    """--mem is node_memory's sum, as the pod's memory limit: the plan's host memory for 8
    processes with its margin, the /dev/shm need, a 1 GiB margin (Slurm does not restart
    workers: the pod, here, neither). exclusive=true asks for whole nodes (--mem=0); a mem
    below /dev/shm's need is refused."""
    gpu = ["cluster.gpus_per_node=8", "trainer.global_batch_size=32", "data.num_workers=2"]
    script = render("slurm", tmp_path, *gpu)["job.sbatch"]
    pod = pod_container(render("k8s", tmp_path / "k", *gpu, "cluster.k8s.max_restarts=0"))
    mib = k8s_check.parse_quantity(pod["resources"]["limits"]["memory"], "memory") / 2**20
    assert f"#SBATCH --mem={int(mib)}M\n" in script and "--exclusive" not in script
    job = prepare("slurm", [*FAST, *gpu, f"run.root={tmp_path}", "run.id=m"])
    need = slurm.job_memory(job)
    assert need == node_memory(job, 0, 2**30)
    assert need.processes == int(need.processes_need * (1 + PROCESS_MARGIN))
    assert int(mib) == -(-need.total // 2**20) and need.shm_need > 0
    whole = render("slurm", tmp_path, *gpu, "cluster.slurm.exclusive=true", run_id="x")
    assert "#SBATCH --mem=0\n" in whole["job.sbatch"]
    assert "#SBATCH --exclusive\n" in whole["job.sbatch"]
    capsys.readouterr()
    err = refused("slurm", tmp_path, capsys, *gpu, "cluster.slurm.mem=100M")
    assert "error: cluster.slurm.mem=100M is less than the" in err
    err = refused("slurm", tmp_path, capsys, "cluster.slurm.mem_per_process=lots")
    assert "cluster.slurm.mem_per_process='lots': not a size sbatch takes" in err


# The front door's own arguments, each one line and exit 2, nothing written (its keys' bad
# values: the tables above, tests/unit/submit/test_secret_checks.py, tests/cluster/).
FRONT_DOOR = [
    ([], "error: give a target: python -m launcher.submit {k8s,slurm"),
    (["pbs", "--dry-run"], "error: unknown target 'pbs'; use one of: k8s, slurm"),
    (["slurm", "--dry-run", "--bogus"], "error: --bogus: not a flag this command takes"),
    (["k8s", "--dry-run", "--tune", "+exp=bucket_sweep"], "error: --tune tunes one experiment"),
    (["slurm", "--dry-run", "cluster=k8s"], "error: cluster=k8s does not match `submit slurm`"),
    (["slurm", "--dry-run", "cluster.nodes=0"], "error: cluster.nodes=0: must be at least 1"),
    (["slurm", "--dry-run", "run.id=../x"], "error: run.id=../x holds a path separator"),
]


@pytest.mark.parametrize(
    ("argv", "words"), FRONT_DOOR, ids=[" ".join(a) or "none" for a, _ in FRONT_DOOR]
)
def test_the_front_door_refuses_its_own_arguments_in_one_line(tmp_path, capsys, argv, words):
    argv = [*argv, f"run.root={tmp_path}"] if argv else argv
    assert submit_main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith(words), err
    assert list(tmp_path.iterdir()) == []


def test_every_cluster_fills_the_same_defaults_for_the_same_overrides(tmp_path):
    """One source of defaults: each backend's option file (conf/cluster/<name>.yaml) names
    its backend and sets none of the keys the clusters share (k8s.yaml's gpus_per_node: 8
    made `cluster.nodes=2` a CPU job on Slurm and 16 GPUs on Kubernetes); the keys of the
    same meaning in each section have the same defaults; and the same overrides render the
    same job shape on each: nodes, processes, GPUs and CPUs per node."""
    shared = [f.name for f in fields(ClusterBase) if f.name != "name"]
    local = compose(["cluster=local"]).cluster
    for name in backends():
        cluster = compose([f"cluster={name}"]).cluster
        assert {k: cluster[k] for k in shared} == {k: local[k] for k in shared}, name
    s, k = compose(["cluster=slurm"]).cluster.slurm, compose(["cluster=k8s"]).cluster.k8s
    assert slurm.slurm_bytes(s.shm_margin, "") == k8s_check.parse_quantity(k.shm_margin, "")
    for key in ("checkpoint_write_mb_s", "checkpoint_write_s", "step_time_s"):
        assert s[key] == k[key], key
    for overrides in (
        [],
        ["cluster.nodes=2", "data.num_workers=2"],
        ["cluster.nodes=2", "cluster.gpus_per_node=4", "trainer.global_batch_size=32"],
    ):
        args = [*FAST, f"run.root={tmp_path}", *overrides]
        jobs = {name: prepare(name, args) for name in ("slurm", "k8s")}
        shapes = {
            name: (j.nodes, j.procs_per_node, j.world_size, j.cluster.gpus_per_node, j.cpu_need)
            for name, j in jobs.items()
        }
        assert shapes["slurm"] == shapes["k8s"], overrides
        script = render("slurm", tmp_path / "s", *overrides, run_id=str(len(overrides)))
        pod = pod_container(render("k8s", tmp_path / "k", *overrides, run_id=str(len(overrides))))
        nodes, procs, world, gpus, cpus = shapes["slurm"]
        assert f"#SBATCH --cpus-per-task={cpus}\n" in script["job.sbatch"]
        assert pod["resources"]["requests"]["cpu"] == str(cpus)
        assert pod["resources"]["requests"].get("nvidia.com/gpu", 0) == gpus
        assert (f"#SBATCH --gpus-per-node={gpus}\n" in script["job.sbatch"]) == bool(gpus)


def test_a_remote_apptainer_image_is_converted_once_into_a_shared_sif(tmp_path):
    """`apptainer exec docker://...` would pull and convert the image on every node at every
    start: the batch shell converts it once, into a SIF under run.root that every node sees
    (built under a name of its own, then renamed; skipped when it is there), and every node,
    the codes' reader, a requeue and a later run of the image use that file."""
    image = "docker://nvcr.io/nvidia/pytorch:24.05-py3"
    over = ["cluster.slurm.container_runtime=apptainer", f"cluster.slurm.container_image={image}"]
    script = render("slurm", tmp_path, *over, run_id="a")["job.sbatch"]
    (sif,) = set(re.findall(r"\S+\.images/pytorch_24\.05-py3-[0-9a-f]{12}\.sif(?=[ ;])", script))
    assert sif.startswith(f"{tmp_path}/.images/")
    setup = script.split("setup_env=$(mktemp)")[1].split("declare -px")[0]
    build = f'apptainer build --force {sif}.job"$SLURM_JOB_ID" {image} && '
    assert setup.count(f"\n  {{ [ -s {sif} ]") == 1 and build in setup  # one setup line
    assert f"[ -s {sif} ] || {{ mkdir -p {tmp_path}/.images && " in setup
    assert f'mv -f {sif}.job"$SLURM_JOB_ID" {sif}; }}' in setup
    runs = [ln for ln in script.splitlines() if "apptainer exec" in ln]
    assert len(runs) == 2 and all(f" {sif} python -m launcher." in ln for ln in runs)
    assert image not in "".join(runs)
    later = render("slurm", tmp_path, *over, run_id="b")["job.sbatch"]
    assert f" {sif} python -m launcher.torchrun" in later  # the same file for another run
    local = render("slurm", tmp_path, *over[:1], f"cluster.slurm.container_image={sif}",
                   run_id="c")["job.sbatch"]  # fmt: skip
    assert "apptainer build" not in local  # a .sif given is run as it is


@pytest.mark.parametrize(
    "image, said",
    [
        ("launcher:0.1.0", "note: image: cluster.k8s.image=launcher:0.1.0 is a tag, which names"),
        ("repo/launcher@sha256:" + "ab" * 32, None),  # a digest pins: nothing to say
    ],
)
def test_only_a_digest_pins_an_image(tmp_path, capsys, image, said):
    """A tag names what was last pushed under it: the render says so in one note (in the
    manifest's header too); a digest pins the build, and nothing is said."""
    files = render("k8s", tmp_path, f"cluster.k8s.image={image}")
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if line.startswith("note: image:")]
    assert notes == ([] if said is None else [notes[0]]) and (
        said is None or notes[0].startswith(said)
    )
    assert ("# image: " in files["job.yaml"]) == (said is not None)


def test_pods_spread_over_zones_are_warned_about(tmp_path, capsys):
    """Spreading a training job's pods over zones puts its all-reduce on the slowest links."""
    render("k8s", tmp_path, "cluster.k8s.topology_spread_key=topology.kubernetes.io/zone")
    assert "warning: cluster.k8s.topology_spread_key=topology.kubernetes.io/zone spreads the " \
        "pods over zones" in capsys.readouterr().err  # fmt: skip
    render("k8s", tmp_path, "cluster.k8s.topology_spread_key=kubernetes.io/hostname", run_id="h")
    assert "warning" not in capsys.readouterr().err


def test_ephemeral_storage_is_limited_as_requested(tmp_path):
    """security=restricted: the emptyDirs and the container's own disk, requested and limited
    at one sum, so a runaway write evicts this pod rather than fill the node's disk."""
    pod = pod_container(render("k8s", tmp_path, "cluster.k8s.disk_margin=3Gi"))
    res = pod["resources"]
    assert res["requests"]["ephemeral-storage"] == res["limits"]["ephemeral-storage"] == "15Gi"


@pytest.mark.parametrize(("bind", "ok"), [("cores", True), ("none", True), ("sideways", False)])
def test_the_cpu_binding_is_stated(tmp_path, capsys, bind, ok):
    """srun states its binding (cluster.slurm.cpu_bind) rather than leave it to the site."""
    if not ok:
        err = refused("slurm", tmp_path, capsys, f"cluster.slurm.cpu_bind={bind}")
        assert f"cluster.slurm.cpu_bind={bind}: not one of cores, threads, sockets" in err
        return
    script = render("slurm", tmp_path, f"cluster.slurm.cpu_bind={bind}")["job.sbatch"]
    assert f" --cpu-bind={bind} --wait=60" in script
