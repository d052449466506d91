"""Start real trainer processes the way users do, with hard timeouts against hangs."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from launcher import warm_start
from launcher.runtime import process_tree

# Small and fast on 2 CPU cores, while still exercising accumulation (2 micro-steps per
# rank at world size 2), evaluation and checkpoints. No report.png: drawing it is about a
# second of CPU at the end of every run, some 300 runs in the suite; the shared DDP run and
# strategy sweep draw theirs (tests/reference_runs.py), read by test_person_sees.py.
FAST = [
    "trainer.max_steps=12",
    "trainer.global_batch_size=8",
    "trainer.micro_batch_size=2",
    "trainer.seq_len=64",
    "trainer.warmup_steps=3",
    "trainer.log_interval=1",
    "trainer.eval_interval=6",
    "trainer.eval_batches=2",
    "trainer.checkpoint_interval=6",
    "data.max_bytes=400000",
    "data.bpe_vocab_size=512",
    "data.num_workers=0",
    "data.persistent_workers=false",
    "run.report=false",
]

# FAST with the DataLoader as users run it (the defaults: 2 workers per rank, persistent,
# pinned where there is a GPU). Fault, stop and resume tests use this: a defect that only
# shows with workers on (SIGTERM reaching them) hid behind FAST's num_workers=0 once.
FAST_USER_LOADER = [o for o in FAST if not o.startswith(("data.num_workers", "data.persistent"))]

LAUNCH_TIMEOUT = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def refuse_in_unit_tier() -> None:
    """The fast tier starts no process: a unit test that reaches here is misfiled (tests/tiers.py
    reads the source to decide; name the launching helper in PROCESS_NAMES)."""
    if os.environ.get("LAUNCHER_TEST_TIER") == "unit":
        raise AssertionError("a test of the unit tier started a process (see tests/tiers.py)")


def base_env(**extra: str) -> dict:
    env = dict(os.environ)
    env.pop("RANK", None)
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


def torchrun_cmd(
    args: list[str],
    *,
    nproc: int = 2,
    extra_args=(),
    module: str = "launcher.train",
    runner: str = "torch.distributed.run",
) -> list[str]:
    """`torchrun --standalone --nproc_per_node=N [extra] -m MODULE args...`; with
    runner="launcher.torchrun", the front door that exits with the job's code."""
    return [
        sys.executable,
        "-m",
        runner,
        "--standalone",
        f"--nproc_per_node={nproc}",
        *extra_args,
        "-m",
        module,
        *args,
    ]


def torchrun(
    overrides: list[str],
    *,
    nproc: int = 2,
    extra_args: list[str] = (),
    env=None,
    timeout: int = LAUNCH_TIMEOUT,
    cwd: Path | None = None,
    runner: str = "launcher.torchrun",
) -> subprocess.CompletedProcess:
    """A launch to its end. By default through `python -m launcher.torchrun`, which forks
    its ranks from one warm fork server: 5 CPU-seconds a 2-rank launch where plain torchrun
    takes 10-12 (each rank imports torch again), measured; the suite's cost is its number
    of launches. Plain torchrun, the README's own command, is `runner="torch.distributed.run"`
    (the DDP and strategy reference runs, the README's default job in CI, a restart
    without the warm start)."""
    refuse_in_unit_tier()
    cmd = torchrun_cmd(overrides, nproc=nproc, extra_args=extra_args, runner=runner)
    return subprocess.run(
        cmd, env=env or base_env(), capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


def python_train(
    overrides: list[str], *, env=None, timeout: int = LAUNCH_TIMEOUT
) -> subprocess.CompletedProcess:
    refuse_in_unit_tier()
    cmd = [sys.executable, "-m", "launcher.train", *overrides]
    return subprocess.run(
        cmd, env=env or base_env(), capture_output=True, text=True, timeout=timeout
    )


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in metrics(run_dir) if "loss" in r}


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def analyze_cli(run_dir: Path) -> subprocess.CompletedProcess:
    """`python -m launcher.analyze RUN_DIR --no-wandb`, as a user runs it after a job."""
    return subprocess.run(
        [sys.executable, "-m", "launcher.analyze", str(run_dir), "--no-wandb"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def explain(proc: subprocess.CompletedProcess) -> str:
    out, err = proc.stdout[-4000:], proc.stderr[-6000:]
    return f"exit {proc.returncode}\n--- stdout\n{out}\n--- stderr\n{err}"


def start(cmd: list[str], output, env=None) -> subprocess.Popen:
    """Output goes to a file: an unread pipe fills up and blocks the launch."""
    refuse_in_unit_tier()
    out = open(output, "w")  # noqa: SIM115 - the child holds it; closed with the test
    return subprocess.Popen(
        cmd,
        env=env or base_env(),
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def wait_for(predicate, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"launch ended early (exit {proc.returncode})")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError("timed out waiting")
        time.sleep(0.02)


def finish(proc: subprocess.Popen, output) -> str:
    try:
        proc.wait(timeout=LAUNCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    return output.read_text()


def run_dir_of(root):
    dirs = [p for p in root.iterdir() if p.is_dir() and not p.is_symlink()] if root.is_dir() else []
    return dirs[0] if len(dirs) == 1 else None


def checkpointed(root, step: int):
    def check():
        run = run_dir_of(root)
        latest = run and run / "checkpoints" / "latest"
        return bool(latest and latest.exists() and int(latest.read_text().strip()[5:]) >= step)

    return check


def start_torchrun(overrides, output, *extra_args, runner="launcher.torchrun") -> subprocess.Popen:
    return start(torchrun_cmd(overrides, extra_args=extra_args, runner=runner), output)


def stop_once_checkpointed(args, root, step: int, output, sig=signal.SIGTERM) -> tuple[int, str]:
    """Launch through launcher.torchrun, send `sig` to it (as Slurm or the kubelet would)
    once a checkpoint of `step` or later exists under `root`, wait: (exit code, output)."""
    proc = start_torchrun(args, output)
    wait_for(checkpointed(root, step), proc)
    os.kill(proc.pid, sig)
    out = finish(proc, output)
    return proc.returncode, out


def start_agent(
    args: list[str],
    output,
    *,
    nodes: int,
    nproc: int,
    endpoint: str,
    rdzv_id: str,
    host: bool,
    extra_args=(),
) -> subprocess.Popen:
    """One node's torchrun agent (the launcher.torchrun front door) of a `nodes`-node job
    whose agents meet at a c10d rendezvous on `endpoint`: its own process tree and session,
    as on a node of its own. `host` says whether it holds the rendezvous' store (one agent
    must; the others then do not try).

    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: with torch's default (the round-0 rank-0 agent's
    store shared by later rounds), an agent started for a lost node waits for the workers'
    store address that no agent publishes again, and the others wait for it: the restart
    hangs until a 60 s store timeout fails the job (torch 2.13, docs/scale.md)."""
    rdzv = [f"--nnodes={nodes}", f"--nproc_per_node={nproc}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}",
            f"--rdzv-conf=is_host={int(host)}", *extra_args]  # fmt: skip
    cmd = [sys.executable, "-m", "launcher.torchrun", *rdzv, "-m", "launcher.train", *args]
    return start(cmd, output, base_env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1"))


def start_agents(
    args: list[str], outputs: list[Path], *, nproc: int, rdzv_id: str, extra_args=(),
    per_node=lambda i: [],
):  # fmt: skip
    """len(outputs) agents of one job on this machine, as that many nodes (start_agent):
    (the agents, a function that starts node i's agent again, as a replaced node would).
    `per_node(i)`: overrides of node i's agent alone, asked at each start (a node's own
    memory folder: a replacement's is a new one).

    The rendezvous orders nodes by their address, then by their agent's pid: on one machine
    by pid, which wraps (pid_max 32768 here), so a replacement's place came out first or
    last by chance. Each first start is `--local-addr=127.0.0.1`, each replacement
    127.0.0.2 (loopback too): a replacement comes last, as a new node whose name sorts after
    the others' would."""
    endpoint = f"127.0.0.1:{free_port()}"
    started: set[int] = set()

    def agent(i: int) -> subprocess.Popen:
        address = "127.0.0.2" if i in started else "127.0.0.1"
        started.add(i)
        return start_agent(
            [*args, *per_node(i)], outputs[i], nodes=len(outputs), nproc=nproc,
            endpoint=endpoint, rdzv_id=rdzv_id, host=i == 0,
            extra_args=[*extra_args, f"--local-addr={address}"],
        )  # fmt: skip

    return [agent(i) for i in range(len(outputs))], agent


def tree_of(pid: int) -> list[int]:
    """`pid` and every live process below it (a torchrun agent: its ranks, their loader
    workers), whatever session each is in."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo.extend(children.get(tree[-1], []))
    return tree


def kill_tree(pid: int) -> None:
    """SIGKILL a process and everything below it at once, as a node that is lost."""
    for member in tree_of(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)


def launch_words(pid: int) -> list[str] | None:
    """The words of the command a process belongs to: its command line (a warm start's
    ranks and fork server are forks of their agent: the agent's), and for a fork server
    that multiprocessing started as an interpreter of its own and its ranks (its command
    line), the training command in their environment (launcher.warm_start); None once it
    is gone or a zombie."""
    proc = Path(f"/proc/{pid}")
    try:
        if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return None
        words = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        environ = (proc / "environ").read_bytes().decode(errors="replace").split("\0")
    except (OSError, IndexError):
        return None
    prefix = f"{warm_start.COMMAND_ENV}="
    warm = next((v[len(prefix) :] for v in environ if v.startswith(prefix)), "")
    return words + shlex.split(warm)


AGENTS = ("launcher.torchrun", "torch.distributed.run", "torchrun")


def is_agent(pid: int) -> bool:
    """A torchrun agent: its command runs torchrun (or the front door), and its parent's
    does not (a warm start's fork server is a fork of the agent, with its command line)."""
    words = launch_words(pid) or []
    parent = launch_words(process_tree.parent_of(pid)) or []
    return any(a in words or (words and words[0].endswith(a)) for a in AGENTS) and words != parent


def is_rank(pid: int) -> bool:
    """A rank process of a torchrun launch: one of the processes its agent runs (the
    agent's children, or its fork server's: launcher.runtime.process_tree.workers), never
    the agent, its fork server, its resource tracker or a rank's loader worker."""
    parent = process_tree.parent_of(pid)
    return any(
        agent and is_agent(agent) and pid in process_tree.workers(agent)
        for agent in (parent, process_tree.parent_of(parent))
    )


def processes_of(root: Path) -> list[int]:
    """Every live process whose command names `root` (agents, ranks, their forked loader
    workers): the launch's own, whatever session or process group they are in."""
    mine = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and f"run.root={root}" in (launch_words(int(entry.name)) or []):
            mine.append(int(entry.name))
    return mine


def none_left(root: Path, within_s: float) -> list[int]:
    deadline = time.monotonic() + within_s
    while (left := processes_of(root)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def worker_pid(run_dir: Path, rank: int) -> int:
    """The pid rank `rank` logged last (each attempt of a torchrun restart logs its own)."""
    text = (run_dir / "logs" / f"rank{rank}.log").read_text()
    return int(re.findall(r"pid (\d+)\)", text)[-1])


def sweep_of_points(conf: Path, points: dict[str, list[str]], group: str = "point") -> list[str]:
    """Points of one multirun launch that may differ in any key: conf/<group>/<name>.yaml
    holds each point's whole command line (`strategy=fsdp2`, a config group, as its
    defaults list's override); the arguments that run them all, in the order given, each
    into `<run.id>/<group>=<name>/`. Put no key a point sets on the command line: it wins."""
    from omegaconf import OmegaConf

    (conf / group).mkdir(parents=True)
    for name, overrides in points.items():
        choices = [o for o in overrides if o.split("=")[0] in GROUPS]
        values = OmegaConf.from_dotlist([o for o in overrides if o not in choices])
        defaults = "".join(f"  - override /{o.replace('=', ': ', 1)}\n" for o in choices)
        head = f"defaults:\n{defaults}" if defaults else ""
        body = f"# @package _global_\n{head}{OmegaConf.to_yaml(values)}"
        (conf / group / f"{name}.yaml").write_text(body)
    return ["--config-dir", str(conf), "-m", f"+{group}={','.join(points)}"]


# The config groups a point may choose (conf/'s folders).
GROUPS = ("strategy", "model", "data", "logger", "profiler", "nccl", "cluster")
