#!/usr/bin/env bash
# Two ranks on one machine's first device, over gloo: the multi-rank paths on CUDA tensors
# where only one GPU is lent (NCCL refuses two ranks on one device; gloo moves CUDA
# tensors through the host). Part of benchmarks/gpu_check.sh; on a CPU it runs the same
# paths on CPU tensors.
#
#   bash benchmarks/multirank_check.sh OUT [overrides...]
#
# One profiled launch through launcher.torchrun, stopped with SIGTERM once step STOP_AT is
# logged: the gradient all-reduce timed with CUDA events (comm/* figures), the stop vote
# (exit 143 and a stop checkpoint, as a scheduler would see them), per-rank traces, and
# the analyser on them. Writes OUT/runs/multirank (the run), OUT/multirank.log and
# OUT/multirank.json (what benchmarks/results.py records); exits 1 when a check fails.
set -uo pipefail
cd "$(dirname "$0")/.."
out=$1
shift
stop_at=${STOP_AT:-12}
run="$out/runs/multirank"
mkdir -p "$out"
rm -rf "$run"

python3 -m launcher.torchrun --standalone --nproc_per_node=2 -m launcher.train \
    model=gpt2-tiny data=synthetic dist.backend=gloo "$@" \
    trainer.max_steps=100000 trainer.log_interval=1 trainer.eval_interval=0 \
    trainer.checkpoint_interval=0 profiler=steps profiler.skip_first=5 profiler.warmup=1 \
    profiler.active=3 run.root="$out/runs" run.id=multirank > "$out/multirank.log" 2>&1 &
launcher=$!
for _ in $(seq 1 "${WAIT_S:-180}"); do
    grep -q "\"step\": $stop_at," "$run/metrics.jsonl" 2>/dev/null && break
    kill -0 "$launcher" 2>/dev/null || break
    sleep 1
done
kill -TERM "$launcher" 2>/dev/null
wait "$launcher"
code=$?
python3 -m launcher.analyze "$run" --no-wandb --no-tensorboard >> "$out/multirank.log" 2>&1

python3 - "$run" "$code" "$out/multirank.json" <<'PY'
import json, sys
from pathlib import Path

run, code, dest = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
records = [json.loads(line) for line in (run / "metrics.jsonl").open()]
timed = [r for r in records if r.get("comm/allreduce_s") is not None]
summary = json.loads((run / "summary.json").read_text())
latest = run / "checkpoints" / "latest"
report_file = run / "analysis" / "report.json"
report = json.loads(report_file.read_text()) if report_file.is_file() else {}
result = {
    "exit_code": code,
    "status": summary.get("status"),
    "stop_checkpoint": latest.read_text().strip() if latest.is_file() else None,
    "steps": summary.get("steps"),
    "comm": {k: v for k, v in (timed[-1] if timed else {}).items() if k.startswith("comm/")},
    "traces": sorted(p.parent.name for p in run.glob("traces/rank*/*.pt.trace.json")),
    "analysis": {
        "device": report.get("device"),
        "ranks": report.get("ranks"),
        "steps": report.get("steps"),
        "kernel_classes": report.get("kernel_classes"),
        "advice": [a["kind"] for a in report.get("advice", [])],
    },
}
dest.write_text(json.dumps(result, indent=1) + "\n")
checks = {
    "exit code 143 (stopped with a checkpoint)": code == 143,
    "summary status stopped": result["status"] == "stopped",
    "a stop checkpoint": result["stop_checkpoint"] is not None,
    "comm timed on every logged step": bool(timed) and len(timed) == len(
        [r for r in records if "loss" in r]
    ),
    "a trace per rank": result["traces"] == ["rank0", "rank1"],
    "the analyser read both ranks": result["analysis"]["ranks"] == [0, 1],
}
for name, ok in checks.items():
    print(f"multirank: {'ok  ' if ok else 'FAIL'} {name}")
sys.exit(0 if all(checks.values()) else 1)
PY
