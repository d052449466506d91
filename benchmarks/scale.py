"""How the launcher's costs grow with the number of ranks: the same job at 2, 4, 8, 16 ranks.

    python benchmarks/scale.py [--ranks 2,4,8,16] [--steps 30] [--out scale.json] [overrides...]

Per world size, one `launcher.torchrun --standalone` of the job, its resume (10 more steps,
the same run directory), and a bare DDP loop of the same model at the same world size
(benchmarks/overhead.py's bare loop, each rank its share of the batch), then a table:

- start-up: from the launch to the loop's first step (when the first metrics.jsonl record
  appears, less the loop's own `elapsed_s` in it);
- step and overhead: the trainer's seconds per step over its logged window against the bare
  loop's over the same window: the difference is what the launcher adds per step at that
  world size;
- run directory: files and bytes it holds at the end;
- reads: the files each rank opens and the folders it lists per log interval, counted by an
  audit hook (`sys.addaudithook`: Python's `open`, `os.listdir`, `os.scandir` events) in
  every rank (not its DataLoader workers), over the window between the first and the last
  metrics record; the most any rank did, and which files; and the same before the loop
  began (start-up), imports left out;
- checkpoint and resume: the final checkpoint's span (a rank's first file event under
  `checkpoints/` to its last; the longest of any rank) and the resume's (a rank's first
  read of the resumed checkpoint's files to its last, its meta.json left out).

The last lines are the growth of each figure from the smallest world size to the largest,
against the growth of the number of ranks (seconds first divided by the growth of the ranks'
share of the machine's cores): what grows faster is a defect (docs/scale.md).
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# One sequence per rank at 16 ranks; logging every 5 steps; one checkpoint, at the end;
# the DataLoader as users run it.
DEFAULTS = [
    "trainer.global_batch_size=16",
    "trainer.micro_batch_size=1",
    "trainer.seq_len=64",
    "trainer.log_interval=5",
    "trainer.eval_interval=100000",
    "data.max_bytes=400000",
    "data.bpe_vocab_size=512",
]
RESUME_STEPS = 10
PROBE_DIR = "LAUNCHER_SCALE_PROBE"  # where each probed rank writes its events
AUDITED = ("open", "os.listdir", "os.scandir")


def code_path(path: str) -> bool:
    """Files a rank opens to import code: not the launcher's work, and done before step 1."""
    return path.endswith((".py", ".pyc", ".so", ".pth")) or "site-packages" in path


def probe(argv: list[str]) -> None:
    """Run as a rank under torchrun: record every open and listing with its time, run the
    trainer (`python -m launcher.train argv`), write the record at exit."""
    events: list[tuple[float, str, str]] = []

    def hook(event: str, args: tuple) -> None:
        if event in AUDITED and args and isinstance(args[0], str | os.PathLike):
            path = os.fspath(args[0])
            if not code_path(path):
                events.append((time.time(), event, path))

    out = Path(os.environ[PROBE_DIR]) / f"rank{os.environ['RANK']}.json"
    sys.addaudithook(hook)
    sys.argv = ["launcher.train", *argv]
    try:
        runpy.run_module("launcher.train", run_name="__main__", alter_sys=True)
    finally:
        out.write_text(json.dumps(events))


def bare(argv: list[str]) -> None:
    """Run as a rank under torchrun: the bare DDP loop; rank 0 prints its seconds per step."""
    import torch.distributed as dist

    sys.path.insert(0, str(HERE))
    from overhead import bare_per_step

    dist.init_process_group("gloo")
    per_step = bare_per_step(argv, rank=dist.get_rank(), world_size=dist.get_world_size())
    if dist.get_rank() == 0:
        print(f"BARE {per_step}")
    dist.destroy_process_group()


def torchrun(ranks: int, *args: str, env: dict | None = None, out=None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "launcher.torchrun", "--standalone"]
    cmd += [f"--nproc_per_node={ranks}", *args]
    return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)


def records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines if line.endswith("}")]


def launch(ranks: int, overrides: list[str], run_dir: Path, log: Path) -> dict:
    """One probed launch: when each metrics record appeared, each rank's events, its code."""
    probes = Path(tempfile.mkdtemp(prefix="probe-", dir=run_dir.parent))
    env = {**os.environ, "OMP_NUM_THREADS": "1", PROBE_DIR: str(probes)}
    args = [*overrides, f"run.root={run_dir.parent}", f"run.id={run_dir.name}"]
    before = len(records(run_dir))  # a resume appends to the records of the launch before
    started = time.time()
    seen: dict[int, float] = {}
    with open(log, "a") as out:
        proc = torchrun(ranks, __file__, "--probe", *args, env=env, out=out)
        while proc.poll() is None:
            for r in records(run_dir)[before + len(seen) :]:
                seen[r["step"]] = time.time() - started
            time.sleep(0.01)
    if proc.returncode != 0:
        raise SystemExit(f"the {ranks}-rank launch failed (exit {proc.returncode}); see {log}")
    ranks_events = {
        int(p.stem[4:]): [(t - started, e, path) for t, e, path in json.loads(p.read_text())]
        for p in probes.glob("rank*.json")
    }
    first = min(seen)
    record = next(r for r in records(run_dir)[before:] if r["step"] == first)
    loop_start = seen[first] - record["elapsed_s"]
    return {"seen": seen, "events": ranks_events, "startup_s": loop_start}


def per_interval_reads(run: dict, run_dir: Path) -> tuple[float, dict]:
    """The most events any rank had per log interval inside the logged window, and that
    rank's events by kind and file (the run directory's paths relative to it)."""
    # To the last record but one: the last is seen a poll late, when the final checkpoint
    # may have begun.
    steps = sorted(run["seen"])[:-1]
    t0, t1 = run["seen"][steps[0]], run["seen"][steps[-1]]
    intervals = len(steps) - 1
    worst, worst_events = -1, []
    for events in run["events"].values():
        inside = [(e, p) for t, e, p in events if t0 < t <= t1]
        if len(inside) > worst:
            worst, worst_events = len(inside), inside
    kinds: dict[str, int] = {}
    for event, path in worst_events:
        name = os.path.relpath(path, run_dir) if path.startswith(str(run_dir)) else path
        kinds[f"{event} {name}"] = kinds.get(f"{event} {name}", 0) + 1
    return worst / max(intervals, 1), kinds


def startup_reads(run: dict) -> tuple[int, dict]:
    """The most files any rank opened or folders it listed before the loop began, and that
    rank's by folder."""
    events = max(run["events"].values(), key=lambda ev: sum(t < run["startup_s"] for t, *_ in ev))
    folders: dict[str, int] = {}
    for t, event, path in events:
        if t < run["startup_s"]:
            key = f"{event} {os.path.dirname(path)}/"
            folders[key] = folders.get(key, 0) + 1
    return sum(folders.values()), folders


def longest_span(run: dict, counts) -> float:
    """The longest span any rank spent between its first and its last file event that
    `counts(path)`. Per rank: ranks start seconds apart on a shared machine, and a span over
    all of them would measure that."""
    spans = []
    for events in run["events"].values():
        marks = [t for t, _, path in events if counts(path)]
        if marks:
            spans.append(max(marks) - min(marks))
    return max(spans) if spans else float("nan")


def directory_size(run_dir: Path) -> tuple[int, int]:
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def bare_step(ranks: int, overrides: list[str], steps: int, log: Path) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc_per_node={ranks}", __file__, "--bare", *overrides,
         f"trainer.max_steps={steps}"],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    with open(log, "a") as out:
        out.write(proc.stdout + proc.stderr)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("BARE ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"the {ranks}-rank bare loop failed (exit {proc.returncode}); see {log}")
    return float(lines[0].split()[1])


def measure(ranks: int, overrides: list[str], steps: int, root: Path, log: Path) -> dict:
    run_dir = root / f"ranks{ranks}"
    fresh = launch(ranks, [*overrides, f"trainer.max_steps={steps}"], run_dir, log)
    elapsed = {r["step"]: r["elapsed_s"] for r in records(run_dir)}
    first, last = min(elapsed), max(elapsed)
    step_s = (elapsed[last] - elapsed[first]) / (last - first)
    files, size = directory_size(run_dir)
    reads, kinds = per_interval_reads(fresh, run_dir)
    # The final checkpoint: every file event under checkpoints/ (the fresh launch has no
    # other); the resume: the reading of that checkpoint's files, its meta.json left out
    # (rank 0 reads it first, seconds earlier, to decide what to resume).
    checkpoint_s = longest_span(fresh, lambda p: p.startswith(str(run_dir / "checkpoints")))
    resumed_from = str(run_dir / "checkpoints" / f"step_{steps:08d}")

    def payload(path: str) -> bool:
        return path.startswith(resumed_from) and not path.endswith("meta.json")

    resumed = launch(ranks, [*overrides, f"trainer.max_steps={steps + RESUME_STEPS}"], run_dir, log)
    opened, by_folder = startup_reads(fresh)
    bare_s = bare_step(ranks, overrides, steps, log)
    return {
        "ranks": ranks,
        "startup_s": fresh["startup_s"],
        "step_s": step_s,
        "bare_step_s": bare_s,
        "overhead_s": step_s - bare_s,
        "files": files,
        "bytes": size,
        "startup_reads": opened,
        "startup_reads_by_folder": by_folder,
        "reads_per_interval": reads,
        "reads": kinds,
        "checkpoint_s": checkpoint_s,
        "resume_s": longest_span(resumed, payload),
        "resume_reads": max(
            sum(payload(p) for _, _, p in events) for events in resumed["events"].values()
        ),
    }


COLUMNS = (
    ("ranks", "ranks", "{:d}"),
    ("startup_s", "start-up s", "{:.1f}"),
    ("step_s", "step ms", "{:.1f}", 1e3),
    ("bare_step_s", "bare ms", "{:.1f}", 1e3),
    ("overhead_s", "overhead ms", "{:+.1f}", 1e3),
    ("files", "run dir files", "{:d}"),
    ("bytes", "run dir MB", "{:.2f}", 1e-6),
    ("startup_reads", "start-up reads/rank", "{:d}"),
    ("reads_per_interval", "reads/rank/interval", "{:.1f}"),
    ("checkpoint_s", "checkpoint s", "{:.2f}"),
    ("resume_s", "resume s", "{:.2f}"),
    ("resume_reads", "resume reads/rank", "{:d}"),
)


def table(rows: list[dict]) -> str:
    head = "| " + " | ".join(c[1] for c in COLUMNS) + " |"
    lines = [head, "|" + "|".join("-" * (len(c[1]) + 2) for c in COLUMNS) + "|"]
    for row in rows:
        cells = []
        for key, name, fmt, *scale in COLUMNS:
            value = row[key] * scale[0] if scale else row[key]
            cells.append(fmt.format(value).rjust(len(name)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


COUNTS = ("files", "bytes", "startup_reads", "reads_per_interval", "resume_reads")
SECONDS = ("startup_s", "checkpoint_s", "resume_s")


def growth(rows: list[dict], cores: int) -> str:
    """Each figure's growth from the first world size to the last, against the ranks'.

    Counts are compared as they are. Seconds are divided by the growth of the CPU share
    first: W ranks on `cores` cores each get min(1, cores / W) of one, so work that is the
    same on every rank takes W / cores times longer once W passes the cores, and only
    what grows beyond that is the launcher's."""
    a, b = rows[0], rows[-1]
    ranks = b["ranks"] / a["ranks"]
    share = max(1, b["ranks"] / cores) / max(1, a["ranks"] / cores)
    out = [f"growth {a['ranks']} -> {b['ranks']} ranks (x{ranks:g}; CPU share per rank / {share:g}"
           f" on {cores} cores):"]  # fmt: skip
    for key in (*COUNTS, *SECONDS):
        if a[key] > 0:
            factor = b[key] / a[key]
            own = factor / share if key in SECONDS else factor
            per_share = f" (x{own:.2f} per CPU share)" if key in SECONDS else ""
            flag = "  FASTER THAN THE RANKS" if own > ranks else ""
            out.append(f"  {key}: x{factor:.2f}{per_share}{flag}")
    return "\n".join(out)


def main() -> int:
    if sys.argv[1:2] == ["--probe"]:
        return probe(sys.argv[2:]) or 0
    if sys.argv[1:2] == ["--bare"]:
        return bare(sys.argv[2:]) or 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="2,4,8,16", help="world sizes, comma-separated")
    parser.add_argument("--steps", type=int, default=30, help="steps of the fresh launch")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    overrides = [*DEFAULTS, *args.overrides]
    overrides += [f"trainer.checkpoint_interval={args.steps}"]  # the end's only
    rows = []
    with tempfile.TemporaryDirectory(prefix="scale-") as tmp:
        root, log = Path(tmp), Path(tmp) / "launches.log"
        world_sizes = [int(r) for r in args.ranks.split(",")]
        # Imports, the token cache and the tokenizer warm before anything is timed.
        launch(world_sizes[0], [*overrides, "trainer.max_steps=1"], root / "warm", log)
        for ranks in world_sizes:
            row = measure(ranks, overrides, args.steps, root, log)
            rows.append(row)
            print(f"{ranks} ranks: {json.dumps(row)}", file=sys.stderr)
    print(table(rows))
    print()
    worst = max(rows, key=lambda r: r["reads_per_interval"])
    print(f"reads per interval at {worst['ranks']} ranks (the busiest rank):")
    for what, count in sorted(worst["reads"].items()):
        print(f"  {count:4d}  {what}")
    last = rows[-1]
    print(f"start-up reads at {last['ranks']} ranks (the busiest rank), by folder:")
    for what, count in sorted(last["startup_reads_by_folder"].items(), key=lambda kv: -kv[1]):
        print(f"  {count:4d}  {what}")
    print(growth(rows, os.cpu_count() or 1))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
