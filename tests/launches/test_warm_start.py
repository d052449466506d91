"""`python -m launcher.torchrun`'s warm start (launcher.warm_start), launched: every rank of
every attempt is a fork of one fork server, the agent's child, and the run is the run a cold
start trains; the fork server's imports touch no device and start no Python thread."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from launcher import warm_start
from launcher.runtime import process_tree
from launcher.runtime.process_tree import FORK_SERVER

from launch import (
    FAST,
    base_env,
    checkpointed,
    finish,
    free_port,
    launch_words,
    losses,
    run_dir_of,
    start,
    start_agent,
    summary,
    torchrun_cmd,
    wait_for,
    worker_pid,
)
from reference_runs import LONG


class RankWatch(threading.Thread):
    """Every rank process of a launch seen while it runs, as the agent's front door finds
    them (`process_tree.workers`): {rank pid: its parent}, each rank's command (its command
    line and, forked, the training command in its environment), each parent's parent."""

    def __init__(self, agent: int):
        super().__init__(daemon=True)
        self.agent = agent
        self.ranks: dict[int, int] = {}
        self.commands: dict[int, str] = {}
        self.grandparents: dict[int, int] = {}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.05):
            for pid in process_tree.workers(self.agent):
                parent = self.ranks.setdefault(pid, process_tree.parent_of(pid))
                self.commands.setdefault(pid, " ".join(launch_words(pid) or []))
                self.grandparents.setdefault(parent, process_tree.parent_of(parent))


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_a_restart_forks_its_ranks_from_the_same_warm_server(long_run, tmp_path, warm):
    """A rank SIGKILLed after the step-20 checkpoint; torchrun restarts the attempt. Warm
    (the default): the four rank processes of the two attempts are children of one fork
    server, the agent's child, which imported torch once; cold (LAUNCHER_WARM_START=0):
    the agent's children, each its own `python -u -m launcher.train`. Either way, every
    logged loss is the uninterrupted reference run's, exactly."""
    output = tmp_path / "out.txt"
    root = tmp_path / "runs"
    args = [*LONG, "trainer.memory_checkpoint_interval=0", f"run.root={root}"]
    cmd = torchrun_cmd(args, extra_args=["--max-restarts=1"], runner="launcher.torchrun")
    proc = start(cmd, output, env=base_env(**{warm_start.ENV: "1" if warm else "0"}))
    watch = RankWatch(proc.pid)
    watch.start()
    try:
        wait_for(checkpointed(root, 20), proc)
        run_dir = run_dir_of(root)
        os.kill(worker_pid(run_dir, 1), signal.SIGKILL)
        out = finish(proc, output)
    finally:
        watch.done.set()
        watch.join()
    assert proc.returncode == 0, out
    assert "resumed from step 20" in (run_dir / "logs" / "rank0.log").read_text()
    assert summary(run_dir)["steps"] == 60
    assert losses(run_dir) == losses(long_run)
    parents = set(watch.ranks.values())
    assert len(watch.ranks) == 4, watch.commands  # two attempts of two ranks, no loader worker
    if warm:
        (server,) = parents  # one fork server for every attempt: torch imported once
        assert server != proc.pid and watch.grandparents[server] == proc.pid, watch.grandparents
    else:
        assert parents == {proc.pid}, watch.ranks
    assert "Traceback" not in out and "RuntimeWarning" not in out, out
    # which launch a rank belongs to: its command line (a warm rank's is its agent's: the
    # fork server it comes from is a fork of the agent, no interpreter of its own)
    for command in watch.commands.values():
        assert "-m launcher.train" in command and f"run.root={root}" in command, command
        assert ("launcher.torchrun" in command) is warm, command
        assert FORK_SERVER.decode() not in command, command


def test_the_fork_servers_imports_touch_no_device_and_start_no_thread():
    """What the fork server imports (launcher.warm_preload) before every rank is forked from
    it: no torch.cuda call (a CUDA context, or the driver initialised by a device count,
    does not survive a fork: each forked rank would fail its first CUDA call), one Python
    thread (a thread's lock held at the fork is held for good in the child), the stop
    signals ignored (the server must outlive them: the agent reads its ranks' ends from it),
    its imports frozen with the collector off, and the ranks' config composed once for all
    of them (front_door.compose_ahead). On this CPU-only machine the calls are counted at
    torch.cuda's door, where a GPU build's would go too."""
    probe = """
import json, threading, torch, torch.cuda
calls = []
for name in ("is_available", "device_count", "init", "_lazy_init", "current_device",
             "get_device_properties", "set_device", "synchronize"):
    real = getattr(torch.cuda, name)
    setattr(torch.cuda, name, lambda *a, _n=name, _r=real, **k: calls.append(_n) or _r(*a, **k))
import launcher.warm_preload
import gc, signal
from launcher.runtime.process_tree import GROUP_SIGNALS
ignored = all(signal.getsignal(s) is signal.SIG_IGN for s in GROUP_SIGNALS)
from launcher.train.front_door import COMPOSED_AHEAD
print(json.dumps({"calls": calls, "threads": threading.active_count(), "ignored": ignored,
                  "collecting": gc.isenabled(), "frozen": gc.get_freeze_count(),
                  "composed": [list(k) for k in COMPOSED_AHEAD]}))
"""
    command = {warm_start.COMMAND_ENV: "-m launcher.train trainer.max_steps=3"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=base_env(**command), timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["calls"] == [] and found["threads"] == 1, found
    assert not found["collecting"] and found["frozen"] > 250_000, found
    assert found["ignored"], found  # the stop signals a scheduler sends the whole step
    assert found["composed"] == [["trainer.max_steps=3"]], found


def test_the_fork_server_imports_while_the_agent_waits_in_the_rendezvous(tmp_path):
    """One agent of a two-node job, its peer never started: it waits in the rendezvous, and
    its fork server (the child that imports the trainer once) is up already, before any
    rank could start; a stop signal ends the agent, and the server with it."""
    output = tmp_path / "agent.txt"
    proc = start_agent([f"run.root={tmp_path / 'runs'}"], output, nodes=2, nproc=1,
                       endpoint=f"127.0.0.1:{free_port()}", rdzv_id="early", host=True)  # fmt: skip

    def server() -> int | None:
        """The agent's child that is a fork of it, with its command line (the fork server:
        launcher.warm_start.start_server)."""
        own = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        for pid in process_tree.children(proc.pid):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/cmdline").read_bytes() == own:
                    return pid
        return None

    try:
        wait_for(lambda: server() is not None, proc, timeout=120)
        found = server()
        assert not (tmp_path / "runs").exists()  # no rank started: the rendezvous waits
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    out = output.read_text()
    assert "Traceback" not in out, out
    deadline = time.monotonic() + 30
    while Path(f"/proc/{found}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{found}").exists(), f"fork server {found} outlived its agent"


def test_a_warm_rank_takes_torchruns_thread_default(tmp_path):
    """Without OMP_NUM_THREADS, torchrun gives each of several ranks one intra-op thread;
    a warm rank's OpenMP took its count when its fork server imported torch, so the server
    starts under torchrun's defaults: env.json (rank 0's) says 1 thread, not the machine's
    cores (2 here, what an early server started without them gave)."""
    env = base_env()
    env.pop("OMP_NUM_THREADS")
    output = tmp_path / "out.txt"
    cmd = torchrun_cmd([*FAST, "trainer.max_steps=2", f"run.root={tmp_path / 'runs'}"],
                       runner="launcher.torchrun")  # fmt: skip
    proc = start(cmd, output, env=env)
    out = finish(proc, output)
    assert proc.returncode == 0, out
    env_json = json.loads((run_dir_of(tmp_path / "runs") / "env.json").read_text())
    assert env_json["threads"] == {"intra_op": 1, "OMP_NUM_THREADS": "1"}, env_json["threads"]
