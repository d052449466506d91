"""What a failure costs, measured: 16 ranks as 4 torchrun agents x 4 under a schedule of faults.

    python benchmarks/goodput.py [--minutes 15] [--every 180] [--nodes 4] [--per-node 4]
                                 [--out goodput.json] [overrides...]

One job of the default model (DataLoader workers on) runs as `--nodes` agents of
`python -m launcher.torchrun` (a c10d rendezvous on this machine, each agent its own process
tree and its own memory-tier folder, as separate nodes' /dev/shm are), with the memory tier
and its peer copies on, both checkpoint intervals `auto`, `trainer.mtbf_h` the schedule's
fault rate and `trainer.memory_loss_mtbf_h` ten times it (every fault here restarts from
memory; the durable interval is set as if one in ten did not). Every `--every` seconds (the
first half an interval in) one fault, in this order, round and round:

- replaced: a node's agent and everything below it SIGKILLed, a new agent started for it at
  once with an empty memory folder (a spare node; it joins the rendezvous last);
- sigstop: one rank frozen (SIGSTOP): the hang watchdog's case;
- preemption: SIGTERM to every node's agent (the scheduler preempting the job): every rank
  checkpoints and the job ends with 143; the benchmark requeues it (all agents again, the
  same memory folders);
- device_error: a rank raises an uncorrectable ECC error (fault.kind=device_error, armed at
  the launch before, at the step the fault's slot comes to);
- lost: a node's agent SIGKILLed and not replaced: the job must end within 60 s with exit 8
  naming the node's ranks; the benchmark requeues it with a new node.

Per fault: when it happened, when the job noticed (the first log line of a rank that
reacted), the time from the fault to the first step completed after it, the steps redone
(the last step completed before it, less the step the job resumed from) against the memory
tier's interval then, and the wall time lost (from the fault until the run is one step past
where it was, less one step's time). Goodput = the steps the run kept x the median step time
/ the wall time from the first launch to the last step. When each step completed is when its
metrics.jsonl record appeared (one a step: trainer.log_interval=1), polled every 50 ms.

The table goes to docs/benchmarks.md with the machine's load, which this prints.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from launcher.runtime.process_tree import kill_tree

KINDS = ("replaced", "sigstop", "preemption", "device_error", "lost")
JOB = [
    "trainer.global_batch_size=16",
    "trainer.micro_batch_size=1",
    "trainer.max_steps=1000000",  # the schedule's stop ends it
    "trainer.lr_decay_steps=100000",
    "trainer.log_interval=1",
    "trainer.eval_interval=0",
    "trainer.checkpoint_interval=auto",
    "trainer.memory_checkpoint_interval=auto",
    "trainer.memory_checkpoint_peer=true",
    "watchdog.min_s=10",  # the hang allowance (the default's 60 s would dominate a hang)
    "data.max_bytes=400000",
    "data.bpe_vocab_size=512",
]
# The durable interval follows the failures that lose the memory tier: none of the schedule's
# does (each restarts from memory), so the benchmark says one failure in ten would.
MEMORY_LOSS = 10
FAULT_RANK = 5  # the frozen rank and the device error's (on node 1)
INJECTED = "fault.kind=device_error: injecting at step"  # the rank's line as it raises it
REACTIONS = ("lost a peer rank", "stopping: rank", "hang: ", "error: rank", "received SIGTERM")
# A rank log's line: "2026-12-06 03:33:50,655 [rank 0] INFO launcher: ..."
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) \[rank (\d+)\]")


@dataclass
class Fault:
    kind: str
    at: float  # wall clock
    last_step: int = 0  # the last step completed before it
    detected_s: float | None = None
    next_step_s: float | None = None
    resumed_from: int | None = None
    steps_redone: int | None = None
    memory_interval: int | None = None
    lost_s: float | None = None
    ended: str = ""  # what the job did: restarted in place, ended (code) and requeued
    notes: list[str] = field(default_factory=list)


class Steps(threading.Thread):
    """When each metrics.jsonl record appeared: [(time, step)], in order."""

    def __init__(self, path: Path):
        super().__init__(daemon=True)
        self.path, self.seen, self.stopped = path, [], threading.Event()
        self._offset = 0

    def run(self) -> None:
        while not self.stopped.wait(0.05):
            try:
                if self.path.stat().st_size < self._offset:  # a resume cut the redone steps
                    self._offset = self.path.stat().st_size
                with open(self.path) as f:
                    f.seek(self._offset)
                    chunk = f.read()
            except FileNotFoundError:
                continue
            lines = chunk.split("\n")
            done, partial = lines[:-1], lines[-1]
            self._offset += len(chunk) - len(partial)
            now = time.time()
            for line in done:
                record = json.loads(line) if line.strip() else {}
                if "loss" in record:
                    self.seen.append((now, int(record["step"])))

    def last_step(self) -> int:
        return self.seen[-1][1] if self.seen else 0

    def step_rate(self, window: int = 20) -> float:
        recent = self.seen[-window:]
        if len(recent) < 2 or recent[-1][0] <= recent[0][0]:
            return 1.0
        return (recent[-1][1] - recent[0][1]) / (recent[-1][0] - recent[0][0])


class Job:
    """The job's agents: started, killed, replaced, requeued, as a scheduler would."""

    def __init__(self, root: Path, shm: Path, nodes: int, per_node: int, overrides: list[str],
                 every: float):  # fmt: skip
        self.root, self.shm, self.nodes, self.per_node = root, shm, nodes, per_node
        self.every = every
        self.run_dir = root / "g"
        self.overrides = overrides
        self.generation = [0] * nodes  # a replaced node gets a new (empty) memory folder
        self.agents: list[subprocess.Popen | None] = [None] * nodes
        self.launches = 0
        self.launched_at = 0.0
        self.extra: list[str] = []
        self.endpoint = ""

    def args(self, node: int) -> list[str]:
        memory = self.shm / f"node{node}-{self.generation[node]}"
        return [*JOB, *self.overrides, *self.extra, f"run.root={self.root}", "run.id=g",
                f"trainer.memory_checkpoint_dir={memory}"]  # fmt: skip

    def start(self, node: int) -> None:
        rdzv = [f"--nnodes={self.nodes}", f"--nproc_per_node={self.per_node}",
                "--rdzv-backend=c10d", f"--rdzv-endpoint={self.endpoint}", "--rdzv-id=goodput",
                f"--rdzv-conf=is_host={int(node == 0)}", "--max-restarts=20"]  # fmt: skip
        cmd = [sys.executable, "-m", "launcher.torchrun", *rdzv, "-m", "launcher.train"]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
        out = open(self.root / f"agent{node}.txt", "a")  # noqa: SIM115 - the agent holds it
        self.agents[node] = subprocess.Popen(
            [*cmd, *self.args(node)], env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    def launch(self) -> None:
        """Every node's agent (a first launch or a requeue: a fresh rendezvous)."""
        self.launches += 1
        self.launched_at = time.time()
        self.endpoint = f"127.0.0.1:{free_port()}"
        for node in range(self.nodes):
            self.start(node)

    def kill(self, node: int) -> None:
        agent = self.agents[node]
        if agent is not None and agent.poll() is None:
            kill_tree(agent.pid)
            agent.wait()

    def replace(self, node: int) -> None:
        self.kill(node)
        self.generation[node] += 1
        self.start(node)

    def ended(self) -> bool:
        return all(a is None or a.poll() is not None for a in self.agents)

    def codes(self) -> list[int | None]:
        return [a.poll() if a is not None else None for a in self.agents]

    def stop(self) -> None:
        for agent in self.agents:
            if agent is not None and agent.poll() is None:
                agent.send_signal(signal.SIGTERM)
        deadline = time.time() + 120
        while not self.ended() and time.time() < deadline:
            time.sleep(0.2)
        for node in range(self.nodes):
            self.kill(node)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_pid(run_dir: Path, rank: int) -> int | None:
    """The pid of rank `rank` now: the last one its log names (each attempt logs its own)
    that still runs."""
    text = (run_dir / "logs" / f"rank{rank}.log").read_text()
    pids = re.findall(rf"rank {rank}/\d+ \(local \d+, pid (\d+)\)", text)
    return int(pids[-1]) if pids and Path(f"/proc/{pids[-1]}").exists() else None


def log_lines(run_dir: Path, since: float) -> list[tuple[float, int, str]]:
    """(time, rank, line) of every rank's log line at or after `since`, in time order."""
    out = []
    for path in (run_dir / "logs").glob("rank*.log"):
        for line in path.read_text(errors="replace").splitlines():
            m = LOG_TIME.match(line)
            if not m:
                continue
            when = dt.datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S").timestamp() + int(m[2]) / 1e3
            if when >= since:
                out.append((when, int(m[3]), line))
    return sorted(out)


def memory_interval(run_dir: Path, before: float) -> int | None:
    """The memory tier's interval in force at `before` (the cadence's last line then)."""
    found = None
    for when, rank, line in log_lines(run_dir, 0.0):
        if rank == 0 and when <= before:
            m = re.search(r"memory_checkpoint_interval=auto: every (\d+) steps", line)
            found = int(m[1]) if m else found
            if "memory_checkpoint_interval=auto: the first save" in line:
                found = found or 2
    return found


def wait_until(predicate, timeout: float, poll: float = 0.1) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(poll)
    return predicate()


def inject(kind: str, job: Job, steps: Steps, every: float) -> Fault:
    """Carry out one fault; returns its record, with when it happened."""
    fault = Fault(kind, time.time(), steps.last_step())
    if kind == "replaced":
        job.replace(2)  # a middle node: its replacement joins the rendezvous last
    elif kind == "sigstop":
        wait_until(lambda: worker_pid(job.run_dir, FAULT_RANK) is not None, every)
        fault.at = time.time()
        os.kill(worker_pid(job.run_dir, FAULT_RANK), signal.SIGSTOP)
    elif kind == "preemption":
        for agent in job.agents:
            agent.send_signal(signal.SIGTERM)
    elif kind == "device_error":  # armed at the launch before: fires at its step by itself
        # When the rank raised it, from its log: the step it was armed at comes when the
        # pace says, which may be before this slot (the requeue ran faster than the pace
        # that armed it) or after.
        armed = int(re.search(r"fault.step=(\d+)", " ".join(job.extra))[1])
        wait_until(lambda: injected_at(job) is not None, every * 2)
        fault.at, fault.last_step = injected_at(job) or time.time(), armed - 1
    elif kind == "lost":
        job.kill(3)
    return fault


def injected_at(job: Job) -> float | None:
    """When a rank of the job's last launch logged that it raised the armed device error."""
    lines = log_lines(job.run_dir, job.launched_at)
    return next((when for when, _, line in lines if INJECTED in line), None)


def measure(fault: Fault, job: Job, steps: Steps, timeout: float) -> None:
    """Follow the job from the fault to its first step after resuming: requeue it when it
    ends (a preemption, a lost node), as the scheduler would."""
    run_dir = job.run_dir
    if fault.kind in ("preemption", "lost") or job.ended():
        start = time.time()
        ended = wait_until(job.ended, timeout)
        codes = sorted({c for c in job.codes() if c is not None})
        fault.ended = f"ended with {codes} after {time.time() - start + (start - fault.at):.0f} s"
        if not ended:
            fault.notes.append("the job did not end by itself")
            job.stop()
        if fault.kind == "lost":
            job.generation[3] += 1  # the requeue gets a new node in its place
        job.extra = [x for x in job.extra if not x.startswith("fault.")]
        if fault.kind == "preemption":  # the device error's slot comes next: arm it
            steps_to = int(steps.step_rate() * job.every) + steps.last_step() + 30
            job.extra = ["fault.kind=device_error", f"fault.rank={FAULT_RANK}",
                         f"fault.step={steps_to}"]  # fmt: skip
        job.launch()
    else:
        fault.ended = "restarted in place (torchrun)"
    resumed = wait_until(lambda: resume_line(run_dir, fault.at) is not None, timeout, poll=0.5)
    if not resumed:
        fault.notes.append("no resume seen")
        return
    resumed_at, fault.resumed_from = resume_line(run_dir, fault.at)
    reacted = [w for w, _, line in log_lines(run_dir, fault.at)
               if any(r in line for r in REACTIONS)]  # fmt: skip
    if reacted:
        fault.detected_s = max(0.0, min(reacted) - fault.at)
    target = fault.resumed_from + 1
    wait_until(lambda: first_record(steps.seen, resumed_at, target) is not None, timeout)
    after = [(w, s) for w, s in steps.seen if w > fault.at]
    next_at = first_record(steps.seen, resumed_at, target)
    if next_at is None:
        fault.notes.append("no step after the resume")
        return
    fault.next_step_s = next_at - fault.at
    fault.last_step = max([fault.last_step] + [s for w, s in after if w < next_at])
    fault.steps_redone = max(0, fault.last_step - fault.resumed_from)
    fault.memory_interval = memory_interval(run_dir, fault.at)
    past = fault.last_step + 1
    wait_until(lambda: any(w > fault.at and s >= past for w, s in steps.seen), timeout)
    back = next((w for w, s in steps.seen if w > fault.at and s >= past), None)
    if back is not None:
        fault.lost_s = back - fault.at - step_time(steps)


def resume_line(run_dir: Path, since: float) -> tuple[float, int] | None:
    """(when, step) of rank 0's first "resumed from step" line at or after `since`."""
    for when, rank, line in log_lines(run_dir, since):
        m = re.search(r"resumed from step (\d+)", line)
        if rank == 0 and m:
            return when, int(m[1])
    return None


def first_record(seen: list[tuple[float, int]], resumed_at: float, step: int) -> float | None:
    """When `step`'s record first appeared after the resume: the first step the restarted
    job completed. A record of that step number written before the resume is the step that
    was in flight at the fault (a frozen rank's peers can still log it), not a recovery."""
    return next((w for w, s in seen if w > resumed_at and s == step), None)


def step_time(steps: Steps) -> float:
    """The median time between two consecutive steps' records."""
    pairs = zip(steps.seen, steps.seen[1:], strict=False)
    gaps = [b[0] - a[0] for a, b in pairs if b[1] == a[1] + 1]
    return statistics.median(gaps) if gaps else 0.0


def table(faults: list[Fault], summary: dict | None) -> str:
    lines = [
        "| # | fault | detected | to the next step | steps redone | memory interval | wall time "
        "lost | then |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]

    def s(x):
        return "-" if x is None else f"{x:.1f} s"

    for i, f in enumerate(faults, 1):
        lines.append(
            f"| {i} | {f.kind} | {s(f.detected_s)} | {s(f.next_step_s)} | "
            f"{'-' if f.steps_redone is None else f.steps_redone} | "
            f"{'-' if f.memory_interval is None else f.memory_interval} | {s(f.lost_s)} | "
            f"{f.ended}{'; ' + '; '.join(f.notes) if f.notes else ''} |"
        )
    if summary is None:
        return "\n".join(lines)
    lines += [
        "",
        f"{summary['steps']} steps kept in {summary['wall_s']:.0f} s of wall time, a step "
        f"{summary['step_s'] * 1e3:.0f} ms (median): goodput {summary['goodput']:.1%}; "
        f"{summary['nodes']} agents x {summary['per_node']} ranks, a fault every "
        f"{summary['every_s']:.0f} s; load average {summary['load_before']} before, "
        f"{summary['load_after']} after",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--every", type=float, default=180.0, help="seconds between faults")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--per-node", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the run directory")
    args, overrides = parser.parse_known_args()
    load_before = " ".join(f"{x:.1f}" for x in os.getloadavg())
    root = Path(tempfile.mkdtemp(prefix="goodput-"))
    shm = Path(tempfile.mkdtemp(prefix="goodput-", dir="/dev/shm"))
    mtbf_h = args.every / 3600
    rates = [f"trainer.mtbf_h={mtbf_h:g}", f"trainer.memory_loss_mtbf_h={MEMORY_LOSS * mtbf_h:g}"]
    job = Job(root, shm, args.nodes, args.per_node, [*rates, *overrides], args.every)
    steps = Steps(job.run_dir / "metrics.jsonl")
    steps.start()
    faults: list[Fault] = []
    started = time.time()
    try:
        job.launch()
        if not wait_until(lambda: steps.last_step() >= 1, 600):
            print(f"no step within 10 minutes; see {root}/agent*.txt", file=sys.stderr)
            return 1
        first = steps.seen[0][0]  # the schedule's clock starts at the first step
        end = started + args.minutes * 60
        slot = 0
        while True:
            at = first + (slot + 0.5) * args.every
            if at >= end:
                break
            time.sleep(max(0.0, at - time.time()))
            kind = KINDS[slot % len(KINDS)]
            print(f"{time.time() - started:6.0f} s: {kind}", flush=True)
            fault = inject(kind, job, steps, args.every)
            measure(fault, job, steps, timeout=300)
            faults.append(fault)
            print(table([fault], None).splitlines()[-1], flush=True)
            slot += 1
        time.sleep(max(0.0, end - time.time()))
        last_at = steps.seen[-1][0] if steps.seen else time.time()
        job.stop()
    finally:
        steps.stopped.set()
        for node in range(job.nodes):
            job.kill(node)
    summary = {
        "steps": steps.last_step(),
        "wall_s": last_at - started,
        "step_s": step_time(steps),
        "nodes": args.nodes,
        "per_node": args.per_node,
        "every_s": args.every,
        "load_before": load_before,
        "load_after": " ".join(f"{x:.1f}" for x in os.getloadavg()),
    }
    summary["goodput"] = summary["steps"] * summary["step_s"] / summary["wall_s"]
    print(table(faults, summary))
    if args.out:
        record = {"summary": summary, "faults": [asdict(f) for f in faults]}
        args.out.write_text(json.dumps(record, indent=1))
    shutil.rmtree(shm, ignore_errors=True)
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"run directory kept: {job.run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
