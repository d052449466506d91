"""A node lost and not replaced ends the job with exit 8 and one line naming its ranks
(launcher.resilience.node_presence, docs/faults.md): two `launcher.torchrun` agents of one
rank each as two nodes, one restart allowed; node 1's whole tree is SIGKILLed and nothing
takes its place. Node 0's rank fails in its next collective, its agent waits in the
rendezvous for a second node, and its front door ends the job once LAUNCHER_LOST_NODE_S
have passed since its rank ended: the contract's exit code, the line, summary.json, and
the last checkpoint whole. Node 1 may die before its first heartbeat (its rank trains for
a second or two before the kill): then the line names its rank as never heard from. (At
16 ranks and with the wait's default, benchmarks/goodput.py's `lost` case times the same
end.)"""

from __future__ import annotations

import re
import time

from launcher.resilience import exit_codes

from launch import (
    FAST_USER_LOADER,
    finish,
    kill_tree,
    losses,
    start_agents,
    summary,
    wait_for,
)

WAIT_S = 3  # LAUNCHER_LOST_NODE_S: no replacement is coming


def test_a_lost_node_not_replaced_ends_the_job_with_8_naming_its_ranks(tmp_path, monkeypatch):
    monkeypatch.setenv("LAUNCHER_LOST_NODE_S", str(WAIT_S))
    run_dir = tmp_path / "runs" / "n"
    args = [*FAST_USER_LOADER, "trainer.max_steps=400", "trainer.checkpoint_interval=4",
            f"run.root={run_dir.parent}", f"run.id={run_dir.name}"]  # fmt: skip
    outputs = [tmp_path / f"node{i}.txt" for i in (0, 1)]
    agents, _ = start_agents(
        args, outputs, nproc=1, rdzv_id="lost", extra_args=["--max-restarts=1"]
    )
    try:
        wait_for(lambda: (run_dir / "checkpoints" / "latest").exists() and max(losses(run_dir),
                 default=0) >= 5, agents[0])  # fmt: skip
        kill_tree(agents[1].pid)
        agents[1].wait()
        killed_at = time.monotonic()
        out = finish(agents[0], outputs[0])
        took = time.monotonic() - killed_at
    finally:
        for agent in agents:
            if agent.poll() is None:
                kill_tree(agent.pid)
    assert agents[0].returncode == exit_codes.NODE_LOST, out[-3000:]
    (line,) = [ln for ln in out.splitlines() if ln.startswith("launcher.torchrun: lost node")]
    waited = re.fullmatch(
        r"launcher\.torchrun: lost node (\S+ \(ranks 1, its heartbeat stopped|never heard "
        r"from \(ranks 1, no heartbeat from it in 4 s of its attempt)\): no node took "
        r"its place within (\d+) s \(LAUNCHER_LOST_NODE_S\); exit code 8 \(node lost\): a "
        r"requeue or restart on a full set of nodes resumes from the last checkpoint",
        line,
    )
    assert waited and int(waited[2]) >= WAIT_S, line
    assert took <= 60, took  # the bound: the job ends within a minute of the loss
    s = summary(run_dir)
    assert s["exit_code"] == exit_codes.NODE_LOST and s["status"].startswith("failed: lost node")
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    assert (run_dir / "checkpoints" / latest).is_dir()  # the last complete checkpoint stands
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".")]
