"""What the memory tier's peer copies cost the training loop: the tier with copies to the
next node's memory against the tier without them, side by side, on agents as nodes.

    python benchmarks/peer_copy.py [--nodes 4] [--per-node 4] [--pairs 2] [--steps 160]
                                   [--interval 10] [--skip 20] [--out FILE] [overrides...]

Each pair launches the same job twice as `--nodes` agents of `python -m launcher.torchrun`
x `--per-node` ranks on this machine (a c10d rendezvous, each agent its own memory folder
in /dev/shm, as nodes are), a memory checkpoint every `--interval` steps: once without peer
copies (`trainer.memory_checkpoint_peer=false`), once with them, in alternating order. What
the saves cost the loop comes from the trainer's own metrics.jsonl: past the first `--skip`
steps, the gaps between consecutive steps' records, (mean - median) x the interval, the
time the steps around a save take beyond an ordinary step, per save. The copies' own cost
is the difference of the two sides. The verdict is the medians over the pairs; exit 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from goodput import free_port  # benchmarks/ is on the path

JOB = [
    "trainer.global_batch_size=16",
    "trainer.micro_batch_size=1",
    "trainer.log_interval=1",
    "trainer.eval_interval=0",
    "trainer.checkpoint_interval=0",
    "trainer.lr_decay_steps=100000",
    "run.report=false",
    "data.max_bytes=400000",
    "data.bpe_vocab_size=512",
]
SIDES = {"saves": "false", "peers": "true"}


def launch(args: argparse.Namespace, peer: str, root: Path, shm: Path) -> float:
    """One launch of the job; the saves' cost per save on the loop, in seconds."""
    endpoint = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    agents = []
    for node in range(args.nodes):
        cmd = [sys.executable, "-m", "launcher.torchrun", f"--nnodes={args.nodes}",
               f"--nproc_per_node={args.per_node}", "--rdzv-backend=c10d",
               f"--rdzv-endpoint={endpoint}", "--rdzv-id=peer-copy",
               f"--rdzv-conf=is_host={int(node == 0)}", "-m", "launcher.train", *JOB,
               f"trainer.max_steps={args.steps}",
               f"trainer.memory_checkpoint_interval={args.interval}",
               f"trainer.memory_checkpoint_peer={peer}", *args.overrides,
               f"run.root={root}", "run.id=g",
               f"trainer.memory_checkpoint_dir={shm / str(node)}"]  # fmt: skip
        out = open(root / f"agent{node}.txt", "w")  # noqa: SIM115 - the agent holds it
        agents.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT))
    codes = [agent.wait() for agent in agents]
    if any(codes):
        sys.exit(f"peer_copy: a launch ended with {codes}; its agents' output: {root}")
    elapsed = {}
    for line in (root / "g" / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "loss" in record:
            elapsed[record["step"]] = record["elapsed_s"]
    gaps = [elapsed[s] - elapsed[s - 1] for s in range(args.skip + 1, args.steps + 1)]
    return (statistics.mean(gaps) - statistics.median(gaps)) * args.interval


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=4, help="agents, each a node")
    parser.add_argument("--per-node", type=int, default=4, help="ranks per agent")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=160)
    parser.add_argument("--interval", type=int, default=10, help="steps between saves")
    parser.add_argument("--skip", type=int, default=20, help="steps left out at the start")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args, args.overrides = parser.parse_known_args()
    shm_root = "/dev/shm" if os.path.isdir("/dev/shm") else None
    rows = []
    for pair in range(args.pairs):
        order = list(SIDES) if pair % 2 == 0 else list(SIDES)[::-1]
        row = {"pair": pair + 1, "order": " then ".join(order)}
        for side in order:
            root = Path(tempfile.mkdtemp(prefix="peer-copy-"))
            shm = Path(tempfile.mkdtemp(prefix="peer-copy-", dir=shm_root))
            try:
                row[side] = launch(args, SIDES[side], root, shm)
            finally:
                shutil.rmtree(shm, ignore_errors=True)
            shutil.rmtree(root, ignore_errors=True)
        rows.append(row)
    print(f"{args.nodes} agents x {args.per_node} ranks, a memory checkpoint every "
          f"{args.interval} steps, steps {args.skip + 1}-{args.steps}; "
          "ms a save on the loop:")  # fmt: skip
    print("| pair | order | saves | peers | the copies |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['pair']} | {r['order']} | {r['saves'] * 1e3:.0f} | {r['peers'] * 1e3:.0f} "
              f"| {(r['peers'] - r['saves']) * 1e3:.0f} |")  # fmt: skip
    saves = statistics.median(r["saves"] for r in rows)
    copies = statistics.median(r["peers"] - r["saves"] for r in rows)
    print(f"median of {len(rows)} pair(s): a save {saves * 1e3:.0f} ms, its peer copy "
          f"{copies * 1e3:.0f} ms more")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "save_s": saves, "copy_s": copies}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
