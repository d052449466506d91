"""A real two-node Slurm cluster on this one machine, for tests (and by hand).

Debian's Slurm is built with MULTIPLE_SLURMD, so one `slurmctld` and two `slurmd -N n1|n2`
(distinct ports, spool and pid files templated with %n) make a two-node cluster on
127.0.0.1. Everything lives under one private directory with its own `slurm.conf`, found by
the clients through SLURM_CONF, so nothing in /etc/slurm is touched. What needs root:
starting `munged` (if none runs), the daemons, and `127.0.0.1 n1 n2` in /etc/hosts (the
rendered job reaches its first node by name, as on a real cluster).

    python tests/slurm_cluster.py start   # prints the `export SLURM_CONF=...` to use
    python tests/slurm_cluster.py stop

A start first removes whatever an earlier start left behind: every process that carries
this cluster's SLURM_CONF in its environment (daemons, step daemons, job processes), and the
controller's saved state.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from launch import explain
from paths import REPO

PACKAGES = ("slurm-wlm", "slurmctld", "slurmd", "slurm-client", "munge")
NODES = ("n1", "n2")
PARTITION = "debug"
BASE = Path(os.environ.get("LAUNCHER_SLURM_DIR", f"/tmp/launcher-slurm-{os.getuid()}"))
MUNGE_SOCKET = Path("/run/munge/munge.socket.2")
# A requeued job may start again once its previous start's credential has expired.
CRED_EXPIRE_S = 10


class ClusterUnavailable(RuntimeError):
    """Slurm cannot run here; the message says why and what to install."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def missing_requirements() -> str | None:
    """Why this machine cannot run the test cluster, or None."""
    tools = ("slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "munged")
    absent = [t for t in tools if shutil.which(t) is None and not Path(f"/usr/sbin/{t}").exists()]
    if absent:
        return (
            f"Slurm is not installed ({', '.join(absent)} missing): "
            f"apt-get install --no-install-recommends {' '.join(PACKAGES)}"
        )
    if os.geteuid() != 0:
        return "the test Slurm cluster runs its daemons as root; run the Slurm tests as root"
    return None


class SlurmCluster:
    """Start with `start()`, use `env()` for every client call, end with `stop()`."""

    def __init__(self, base: Path = BASE, nodes: tuple[str, ...] = NODES, cpus: int | None = None):
        """`nodes` slurmd daemons (names that resolve to this machine), each declaring `cpus`
        CPUs (default: this machine's; slurmd takes a figure above it, config_overrides)."""
        self.base = base
        self.nodes = nodes
        self.cpus = cpus or max(os.cpu_count() or 1, 2)
        self.conf = base / "slurm.conf"
        self.procs: list[subprocess.Popen] = []
        self.started_munge = False
        self.hostname = socket.gethostname().split(".")[0]

    def env(self, **extra: str) -> dict:
        """The environment for sbatch/squeue/scontrol and for the jobs (sbatch exports it)."""
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf)
        env.update(extra)
        return env

    def start(self, timeout: float = 60) -> None:
        why = missing_requirements()
        if why:
            raise ClusterUnavailable(why)
        self._remove_leftovers()
        _ensure_hosts(self.nodes)
        self.started_munge = _ensure_munge()
        (self.base / "state").mkdir(parents=True)
        for node in self.nodes:
            (self.base / "spool" / node).mkdir(parents=True)
        self.conf.write_text(self._config())
        env = self.env()
        log = open(self.base / "daemons.out", "ab")  # noqa: SIM115 - shared by the daemons
        self.procs.append(
            subprocess.Popen(
                ["slurmctld", "-D", "-i", "-f", str(self.conf)],
                env=env,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        )
        for node in self.nodes:
            self.procs.append(
                subprocess.Popen(
                    ["slurmd", "-D", "-N", node, "-f", str(self.conf)],
                    env=env,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                )
            )
        self._wait_idle(timeout)

    def _config(self) -> str:
        b = self.base
        ctld_port = _free_port()
        lines = [
            "ClusterName=launchertest",
            f"SlurmctldHost={self.hostname}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            # A requeued job may start again once the credential of its previous run has
            # expired (default 120 s); the tests do not wait that long.
            f"AuthInfo=cred_expire={CRED_EXPIRE_S}",
            f"StateSaveLocation={b}/state",
            f"SlurmdSpoolDir={b}/spool/%n",
            f"SlurmctldPidFile={b}/slurmctld.pid",
            f"SlurmdPidFile={b}/slurmd-%n.pid",
            f"SlurmctldLogFile={b}/slurmctld.log",
            f"SlurmdLogFile={b}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",
            "MpiParams=ports=12000-12999",  # srun --resv-ports (cluster.slurm.resv_ports)
            "MailProg=/bin/true",
            "JobRequeue=1",
            "ReturnToService=2",
            "SchedulerParameters=batch_sched_delay=0",
            "SlurmdParameters=config_overrides",
            "KillWait=30",
            "MinJobAge=600",
        ]
        memory = _memory_mib()  # each node is this machine: --mem is checked against it
        for node in self.nodes:
            lines.append(
                f"NodeName={node} NodeHostname={self.hostname} NodeAddr=127.0.0.1 "
                f"Port={_free_port()} CPUs={self.cpus} RealMemory={memory} State=UNKNOWN"
            )
        lines.append(
            f"PartitionName={PARTITION} Nodes={','.join(self.nodes)} Default=YES "
            "MaxTime=INFINITE State=UP OverSubscribe=NO"
        )
        return "\n".join(lines) + "\n"

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        out = ""
        while time.monotonic() < deadline:
            dead = [p.args[0] for p in self.procs if p.poll() is not None]
            if dead:
                raise ClusterUnavailable(
                    f"{', '.join(dead)} exited at start; see {self.base}/*.log and daemons.out"
                )
            proc = subprocess.run(
                ["sinfo", "-h", "-N", "-o", "%N %t"],
                env=self.env(),
                capture_output=True,
                text=True,
            )
            out = proc.stdout.strip()
            states = dict(line.split() for line in out.splitlines() if line.strip())
            if all(states.get(n) == "idle" for n in self.nodes):
                return
            time.sleep(0.3)
        raise ClusterUnavailable(f"nodes not idle after {timeout:.0f} s: {out!r}")

    def stop(self) -> None:
        """Cancel every job, stop the daemons, and kill whatever the jobs left running."""
        if self.conf.exists():
            subprocess.run(
                ["scancel", "--full", "--user", "root"],
                env=self.env(),
                capture_output=True,
                timeout=30,
            )
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()
        _kill_marked(self.conf)
        if self.started_munge:  # only the munged this cluster started
            pid = Path("/run/munge/munged.pid")
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid.read_text()), signal.SIGTERM)
            self.started_munge = False

    def _remove_leftovers(self) -> None:
        _kill_marked(self.conf)
        if self.base.exists():
            shutil.rmtree(self.base)
        self.base.mkdir(parents=True)


def submit(cluster: SlurmCluster, root: Path, run_id: str, overrides, *extra: str, env=None):
    """`python -m launcher.submit slurm` of `overrides`, for real (`env`: more of the
    submitting shell's variables): (job id, run dir). The rendezvous port is the default
    one, derived from the job id."""
    venv = [f"cluster.slurm.venv={sys.prefix}"] if sys.prefix != sys.base_prefix else []
    cmd = [sys.executable, "-m", "launcher.submit", "slurm", *overrides, *venv,
           f"cluster.workdir={REPO}", f"run.root={root}", f"run.id={run_id}", *extra]  # fmt: skip
    proc = subprocess.run(
        cmd, env=cluster.env(**(env or {})), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, explain(proc)
    found = re.search(r"submitted Slurm job (\d+); run dir (\S+);", proc.stdout)
    assert found, proc.stdout
    assert proc.stdout.splitlines()[0] == str(root / run_id / "submit" / "job.sbatch")
    return found.group(1), Path(found.group(2))


def job_state(cluster: SlurmCluster, job_id: str) -> dict[str, str]:
    out = subprocess.run(
        ["scontrol", "-o", "show", "job", job_id],
        env=cluster.env(),
        capture_output=True,
        text=True,
    ).stdout
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def wait_until_done(cluster: SlurmCluster, job_id: str, run_dir: Path, timeout: float):
    """Poll until the job has ended. A requeued job waits (BeginTime) until its previous
    start's credential has expired; once that has (`cred_expire` in the test slurm.conf),
    it is let start at once rather than at Slurm's next scheduling pass. Earlier, Slurm
    would kill it ("Job credential revoked")."""
    deadline = time.monotonic() + timeout
    pending_since = None
    while time.monotonic() < deadline:
        state = job_state(cluster, job_id)
        if state.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            return state
        if state.get("JobState") == "PENDING" and state.get("Reason") == "BeginTime":
            pending_since = pending_since or time.monotonic()
            if time.monotonic() - pending_since > CRED_EXPIRE_S + 2:
                subprocess.run(
                    ["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env=cluster.env()
                )
        time.sleep(0.5)
    output = "\n".join(p.read_text()[-3000:] for p in (run_dir / "submit").glob("slurm-*.out"))
    raise AssertionError(f"job {job_id} did not end in {timeout} s:\n{output}")


def _kill_marked(conf: Path) -> None:
    """Kill every process whose environment names this cluster's slurm.conf: the daemons,
    slurmstepd, and the jobs' processes (they inherit SLURM_CONF from sbatch)."""
    marker = f"SLURM_CONF={conf}".encode()
    for _ in range(20):
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if marker in environ.split(b"\0"):
                pids.append(int(entry.name))
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)


def _memory_mib() -> int:
    """This machine's memory in MiB (/proc/meminfo's MemTotal), as slurmd reports it."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return 4000


def _ensure_hosts(names: tuple[str, ...]) -> None:
    """The node names must resolve (the job reaches its first node by name)."""
    unresolved = []
    for name in names:
        try:
            socket.gethostbyname(name)
        except OSError:
            unresolved.append(name)
    if unresolved:
        with open("/etc/hosts", "a") as hosts:
            hosts.write(f"127.0.0.1 {' '.join(unresolved)}  # launcher test Slurm nodes\n")


def _munge_works() -> bool:
    if not MUNGE_SOCKET.exists():
        return False
    cred = subprocess.run(["munge", "-n"], capture_output=True)
    if cred.returncode:
        return False
    return subprocess.run(["unmunge"], input=cred.stdout, capture_output=True).returncode == 0


def _ensure_munge() -> bool:
    """Start munged as the munge user unless one already answers (Slurm authenticates with
    it); True if it was started here."""
    if _munge_works():
        return False
    run_dir = MUNGE_SOCKET.parent
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.chown(run_dir, "munge", "munge")
    subprocess.run(
        ["runuser", "-u", "munge", "--", "munged", "--force"], check=True, capture_output=True
    )
    for _ in range(50):
        if _munge_works():
            return True
        time.sleep(0.1)
    raise ClusterUnavailable("munged did not start (Slurm's authentication); see /var/log/munge")


if __name__ == "__main__":
    cluster = SlurmCluster()
    if sys.argv[1:] == ["start"]:
        cluster.start()
        print(f"export SLURM_CONF={cluster.conf}")
    elif sys.argv[1:] == ["stop"]:
        cluster.stop()
    else:
        sys.exit("usage: python tests/slurm_cluster.py {start,stop}")
