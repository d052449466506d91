"""16 ranks of the default job on this machine (docs/scale.md): one torchrun of 16 processes,
four torchrun agents of 4 ranks each as four nodes (a c10d rendezvous on localhost, each
agent its own process tree and session), and a job of 4 nodes x 4 tasks on a real Slurm
cluster of four slurmd on this machine (tests/slurm_cluster.py).

Five launches, each read by several tests: the uninterrupted 16-rank run (the reference);
the Slurm job, which must equal it;
the 4 x 4 agents preempted as one node is (SIGTERM to one agent); its resume on 4 ranks; and
back on 4 x 4 agents with the memory tier and its peer copies on, each agent its own memory
folder (as separate nodes' /dev/shm are), where an agent's whole tree is SIGKILLed twice (a
lost node, replaced by a new agent with an empty folder, as a scheduler would): first node 1,
whose replacement joins the rendezvous last, so that ranks 4-15 all land on other nodes than
the ones that wrote their folders, and the tier still restores its newer step (found by node
and step, moved where each rank loads it); then node 3 with every node's memory gone, and the
durable checkpoint does. Every step's loss is the uninterrupted run's: exactly at 16 ranks,
within REORDERED after 4 ranks.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
from pathlib import Path

import pytest
from slurm_cluster import BASE, ClusterUnavailable, SlurmCluster, submit, wait_until_done

from launcher.resilience import exit_codes
from launcher.runtime import process_tree

from launch import (
    FAST_USER_LOADER,
    LAUNCH_TIMEOUT,
    explain,
    finish,
    is_rank,
    kill_tree,
    launch_words,
    losses,
    metrics,
    start_agents,
    summary,
    torchrun,
    wait_for,
)
from reference import REORDERED

RANKS, NODES = 16, 4
STEPS = 24
DURABLE = 12  # trainer.checkpoint_interval: the durable checkpoints, and each leg's end
MEMORY = 2  # trainer.memory_checkpoint_interval of the last leg
# The default job (DataLoader workers on) shrunk: one sequence per rank, so the global batch
# of 16 is one micro-step at 16 ranks and four at 4; the LR schedule fixed by lr_decay_steps,
# so a leg that ends early takes the same LR at every step as the uninterrupted run.
SCHEDULE = [
    *FAST_USER_LOADER,
    f"trainer.max_steps={STEPS}",
    f"trainer.lr_decay_steps={STEPS}",
    "trainer.global_batch_size=16",
    "trainer.micro_batch_size=1",
    f"trainer.checkpoint_interval={DURABLE}",
    "trainer.eval_interval=1000",
]


def reached(run_dir: Path, step: int):
    def check() -> bool:
        path = run_dir / "metrics.jsonl"
        return path.exists() and any(r.get("step", 0) >= step for r in metrics(run_dir))

    return check


def agents_run(args, tmp: Path, name: str, extra_args=(), per_node=lambda i: []):
    """Four agents of one job: (agents, their output files, start node i again)."""
    outputs = [tmp / f"{name}.agent{i}.txt" for i in range(NODES)]
    agents, again = start_agents(
        args, outputs, nproc=RANKS // NODES, rdzv_id=name, extra_args=extra_args,
        per_node=per_node,
    )  # fmt: skip
    return agents, outputs, again


@contextlib.contextmanager
def no_leftovers(agents):
    """Whatever happens, no agent (nor a rank or loader worker below it) outlives the
    fixture: the ranks run in sessions of their own, which killing an agent leaves."""
    try:
        yield
    finally:
        for agent in agents:
            if agent.poll() is None:  # an ended agent's pid may be another process's now
                kill_tree(agent.pid)


def ended(agents, outputs) -> list[tuple[int, str]]:
    """(exit code, output) of each agent, once all have ended."""
    texts = [finish(a, out) for a, out in zip(agents, outputs, strict=True)]
    return [(a.returncode, text) for a, text in zip(agents, texts, strict=True)]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("scale")


@pytest.fixture(scope="module")
def plain(root):
    """`torchrun --standalone --nproc_per_node=16` of the schedule, uninterrupted."""
    proc = torchrun([*SCHEDULE, f"run.root={root / 'plain'}", "run.id=p"], nproc=RANKS)
    return proc, root / "plain" / "p"


@pytest.fixture(scope="module")
def slurm_job(root):
    """The schedule as `python -m launcher.submit slurm cluster.nodes=4
    cluster.procs_per_node=4` on a cluster of four slurmd (12 CPUs each: a rank and its two
    loader workers each take one): (scontrol's view at the end, the run dir, the output)."""
    nodes = tuple(f"n{i}" for i in range(1, NODES + 1))
    cluster = SlurmCluster(BASE.with_name(f"{BASE.name}-scale"), nodes=nodes, cpus=12)
    try:
        cluster.start()
    except ClusterUnavailable as exc:
        cluster.stop()
        pytest.skip(f"no Slurm cluster: {exc}")
    try:
        # --mem: the plan's host memory for 4 tiny-model ranks a node (mem_per_process=null)
        shape = [f"cluster.nodes={NODES}", f"cluster.procs_per_node={RANKS // NODES}"]
        job_id, run_dir = submit(cluster, root / "slurm", "s", [*shape, *SCHEDULE])
        state = wait_until_done(cluster, job_id, run_dir, LAUNCH_TIMEOUT)
        return state, run_dir, (run_dir / "submit" / f"slurm-{job_id}.out").read_text()
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def preempted(root):
    """The schedule on 4 agents x 4 ranks; once step 3 is logged, node 2's agent gets
    SIGTERM (a preemption of that node): {"codes", "outputs", "run_dir", "stop"}."""
    run_dir = root / "agents" / "a"
    args = [*SCHEDULE, f"run.root={run_dir.parent}", f"run.id={run_dir.name}"]
    agents, outputs, _ = agents_run(args, root, "preempted")
    with no_leftovers(agents):
        wait_for(reached(run_dir, 3), agents[0], timeout=LAUNCH_TIMEOUT)
        agents[2].send_signal(signal.SIGTERM)
        codes, texts = zip(*ended(agents, outputs), strict=True)
    return {"codes": codes, "outputs": texts, "run_dir": run_dir, "stop": summary(run_dir)["steps"]}


@pytest.fixture(scope="module")
def at_four(preempted):
    """The preempted run resumed by one torchrun of 4 ranks, for 3 steps."""
    run_dir, stop = preempted["run_dir"], preempted["stop"]
    args = [*SCHEDULE, f"run.root={run_dir.parent}", f"run.id={run_dir.name}"]
    proc = torchrun([*args, f"trainer.max_steps={stop + 3}"], nproc=4, runner="launcher.torchrun")
    return proc, stop + 3


def first_kill_step(after: int) -> int:
    """The first memory step past `after` that the next durable checkpoint is at least two
    steps behind: the agent is killed once it is sealed (a step later), before that durable
    one could be written, so the tier holds the newer step."""
    step = after + 1 + (after + 1) % MEMORY
    while (-step) % DURABLE < 2 * MEMORY:
        step += MEMORY
    return step


def held_everywhere(shm: Path, step: int, copies=range(0)):
    """Every rank's folder of `step` sealed in some node's memory, and the peer copies of
    the ranks `copies` too (launcher.checkpoint.memory: <node folder>/rank<r>/, peer/rank<r>/)."""
    name = f"step_{step:08d}"

    def check() -> bool:
        own = all(any(shm.glob(f"*/launcher-*/rank{r}/{name}/meta.json")) for r in range(RANKS))
        peer = all(any(shm.glob(f"*/launcher-*/peer/rank{r}/{name}/meta.json")) for r in copies)
        return own and peer

    return check


def workers_gone(run_dir: Path) -> bool:
    """No rank of the run is alive (the survivors' agents, and their fork servers on a warm
    start, wait in the rendezvous)."""
    return not any(_is_rank_of(int(p.name), run_dir.parent) for p in Path("/proc").glob("[0-9]*"))


def _is_rank_of(pid: int, root: Path) -> bool:
    """A rank (or its loader worker) of the run under `root`: not an agent, nor what
    multiprocessing starts beside a warm start's ranks (the agent's fork server, its
    resource tracker), which live as long as the agent."""
    if f"run.root={root}" not in (launch_words(pid) or []):
        return False
    return is_rank(pid) or is_rank(process_tree.parent_of(pid))


def lose_node(agents, again, run_dir: Path, node: int, then=lambda: None):
    """SIGKILL node `node`'s agent and everything below it, wait until the survivors'
    ranks are gone, run `then`, and start a new agent for the node."""
    kill_tree(agents[node].pid)
    agents[node].wait()
    wait_for(lambda: workers_gone(run_dir), agents[0], timeout=LAUNCH_TIMEOUT)
    then()
    agents[node] = again(node)


@pytest.fixture(scope="module")
def back_at_sixteen(preempted, at_four, root):
    """The run back on 4 agents x 4 ranks (--max-restarts=2) to its end, the memory tier
    every 2 steps with peer copies, each node its own memory folder. Node 1 is lost once the
    tier sealed the step `first_kill_step` names and the peers hold nodes 1's and 2's copies
    (the ones the restore reads); its new
    agent (a new, empty folder) joins the rendezvous last. After the restart resumed, node 3
    is lost once the tier sealed a step four or more later, and this time every node's memory
    is removed before its new agent starts."""
    run_dir, (_, resumed) = preempted["run_dir"], at_four
    args = [*SCHEDULE, f"run.root={run_dir.parent}", f"run.id={run_dir.name}"]
    args += [f"trainer.memory_checkpoint_interval={MEMORY}", "trainer.memory_checkpoint_peer=true"]
    shm, generation = root / "shm", [0] * NODES

    def memory_of(node: int) -> list[str]:
        return [f"trainer.memory_checkpoint_dir={shm / f'node{node}-{generation[node]}'}"]

    def replaced(node: int):
        def then():
            generation[node] += 1

        return then

    agents, outputs, again = agents_run(args, root, "back", ["--max-restarts=2"], memory_of)
    first = first_kill_step(resumed)
    assert first + 3 * MEMORY < STEPS, f"the 4-rank leg ended at {resumed}: too late for two losses"
    with no_leftovers(agents):  # the list holds the replacements too
        # The peer copies the restore reads: node 1's (lost) and node 2's (its ranks rerun on
        # node 3, which holds their copies). Each rank seals its own folder, then its copy
        # travels: a sealed folder says nothing of the copies.
        copied = range(RANKS // NODES, 3 * RANKS // NODES)
        wait_for(held_everywhere(shm, first, copied), agents[0], timeout=LAUNCH_TIMEOUT)
        lose_node(agents, again, run_dir, 1, replaced(1))
        # The step it restored: `first`, or a step after it whose copies had all arrived too
        # in the moment between the look above and the kill (a copy leaves as soon as its
        # rank has sealed the step). The second loss comes two saves past it.
        wait_for(lambda: restored_step(run_dir) is not None, agents[0], timeout=LAUNCH_TIMEOUT)
        restored = restored_step(run_dir)
        second = restored + 2 * MEMORY
        while second % DURABLE == 0:  # a durable step: the tier does not write it
            second += MEMORY
        assert second < STEPS, f"restored step {restored}: too late for a second loss"
        wait_for(held_everywhere(shm, second), agents[0], timeout=LAUNCH_TIMEOUT)

        def every_nodes_memory_gone():
            shutil.rmtree(shm)
            replaced(3)()

        lose_node(agents, again, run_dir, 3, every_nodes_memory_gone)
        outcomes = ended(agents, outputs)
    return {
        "outcomes": outcomes,
        "run_dir": run_dir,
        "resumed": resumed,
        "first": first,
        "restored": restored,
        "second": second,
        "log": (run_dir / "logs" / "rank0.log").read_text(),
    }


def restored_step(run_dir: Path) -> int | None:
    """The step the restart after node 1's loss restored from the peers' copies, once rank 0
    has said it."""
    log = run_dir / "logs" / "rank0.log"
    found = re.search(r"memory tier: step (\d+) restored for rank\(s\) 4-11", log.read_text())
    return int(found[1]) if found else None


def test_sixteen_processes_train_into_one_run_directory(plain):
    proc, run_dir = plain
    assert proc.returncode == 0, explain(proc)
    assert [p.name for p in run_dir.parent.iterdir() if p.name != "latest"] == ["p"]
    logs = sorted(p.name for p in (run_dir / "logs").glob("rank*.log"))
    assert logs == sorted(f"rank{r}.log" for r in range(RANKS))
    records = [r for r in metrics(run_dir) if "loss" in r]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    # Aggregated over every rank: the global batch's tokens, the slowest of 16 named.
    assert all(r["tokens"] == r["step"] * 16 * 64 for r in records)
    slowest = {r["step_time_s/slowest_rank"] for r in records}
    assert slowest <= set(range(RANKS)) and len(slowest) > 1, slowest
    s = summary(run_dir)
    assert (s["status"], s["steps"], s["world_size"]) == ("completed", STEPS, RANKS)


def test_slurm_4_nodes_x_4_tasks_train_the_same_run(plain, slurm_job):
    state, run_dir, out = slurm_job
    assert state["JobState"] == "COMPLETED" and state["ExitCode"] == "0:0", out[-3000:]
    assert f"nodes n[1-{NODES}]" in out
    assert [p.name for p in run_dir.parent.iterdir() if p.name != "latest"] == ["s"]
    for rank in range(RANKS):  # four ranks on each node
        log = (run_dir / "logs" / f"rank{rank}.log").read_text()
        assert f"rank {rank}/{RANKS} (local {rank % (RANKS // NODES)}," in log
    (codes,) = (run_dir / "logs" / "node_codes").iterdir()
    assert {p.name: p.read_text() for p in codes.iterdir()} == {
        f"n{i}": "0\n" for i in range(1, NODES + 1)
    }
    assert summary(run_dir)["world_size"] == RANKS
    assert losses(run_dir) == losses(plain[1])  # the same 16 ranks, the same sums


def test_a_preempted_node_stops_every_rank_with_a_checkpoint(preempted):
    run_dir, stop = preempted["run_dir"], preempted["stop"]
    for code, out in zip(preempted["codes"], preempted["outputs"], strict=True):
        assert code == exit_codes.STOPPED, out
        assert "Traceback" not in out, out
    assert summary(run_dir)["status"] == "stopped"
    assert 3 <= stop < STEPS
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"step_{stop:08d}"
    for rank in range(RANKS):
        assert "ended with code 143" in (run_dir / "logs" / f"rank{rank}.log").read_text()
    runs = [p for p in run_dir.parent.iterdir() if p.name != "latest"]  # runs/latest: a link
    assert len(runs) == 1  # four agents, one run directory


def test_resumed_at_4_then_16_ranks_the_losses_are_the_uninterrupted_runs(
    plain, preempted, at_four, back_at_sixteen
):
    four, _ = at_four
    assert four.returncode == 0, explain(four)
    assert f"resumed from step {preempted['stop']}" in four.stderr
    assert "world size changed from 16 to 4 rank(s)" in four.stderr
    for code, out in back_at_sixteen["outcomes"]:
        assert code == 0, out
    straight = losses(plain[1])
    got = losses(preempted["run_dir"])
    assert got.keys() == straight.keys()
    stop = preempted["stop"]
    assert {s: got[s] for s in range(1, stop + 1)} == {s: straight[s] for s in range(1, stop + 1)}
    for step in range(stop + 1, STEPS + 1):
        assert got[step] == pytest.approx(straight[step], rel=REORDERED), step
    assert summary(preempted["run_dir"])["world_size"] == RANKS


def test_a_lost_node_whose_replacement_comes_last_resumes_from_the_memory_tier(back_at_sixteen):
    """The new agent for node 1 joined last: it runs ranks 12-15, and nodes 2 and 3 run
    4-7 and 8-11, so no rank but 0-3 finds its folder where it was written. The restart
    still resumes from the tier's newer step: 4-11 from the peer copies their new nodes
    hold, 12-15 moved from the node that wrote them."""
    first, step, log = (back_at_sixteen[k] for k in ("first", "restored", "log"))
    assert first <= step <= first + 2 * MEMORY and (step - first) % MEMORY == 0, (first, step)
    durable = max(s for s in (back_at_sixteen["resumed"], step // DURABLE * DURABLE))
    line = f"memory tier: step {step} is newer than the durable step_{durable:08d}"
    assert line in log, log[-3000:]
    restored = (
        f"memory tier: step {step} restored for rank(s) 4-11 from their peers' copies and "
        "rank(s) 12-15 from the node that held them"
    )
    assert restored in log.split(line, 1)[0], log[-3000:]
    assert f"resumed from step {step}" in log.split(line, 1)[1]


def test_a_lost_nodes_memory_gone_falls_back_to_the_durable_checkpoint(back_at_sixteen):
    """The tier's folder removed with the node: the restart finds no step newer than the
    durable checkpoint, resumes from it, and redoes the steps since (the losses are still
    the uninterrupted run's, above)."""
    first, second, log = (back_at_sixteen[k] for k in ("restored", "second", "log"))
    after_first = log.split(f"resumed from step {first}", 1)[1]
    durable = max(first // DURABLE * DURABLE, back_at_sixteen["resumed"])
    durable = max(durable, second // DURABLE * DURABLE)
    assert f"resumed from step {durable}" in after_first, after_first[-3000:]
    last = after_first.split(f"resumed from step {durable}", 1)[0]
    lost = max(int(s) for s in re.findall(rf"step (\d+)/{STEPS}", last)) - durable
    assert lost >= second - durable  # the steps redone: what the lost memory held
    assert "memory tier: step" not in after_first.split(f"resumed from step {durable}")[0]
    assert summary(back_at_sixteen["run_dir"])["steps"] == STEPS
