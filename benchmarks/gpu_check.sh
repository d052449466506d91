#!/usr/bin/env bash
# The GPU check: the throughput experiment, a profile of it read by the analyser, the
# optimisation ladder and the multi-rank paths, end to end, on a fresh GPU machine whose
# image has torch and transformers but no internet, Hydra or W&B.
#
#   here:   bash benchmarks/fetch_wheels.sh     # once: Hydra/OmegaConf wheels into .whl/
#   there:  bash benchmarks/gpu_check.sh [OUT [overrides...]]  # budgeted for 8 minutes
#
# Writes doctor.txt, throughput.log, the run directories, profile_report.md (the analyser's
# report of the profiled throughput steps: kernel classes, achieved TFLOP/s, advice),
# ladder.json and ladder.log, multirank.json (two gloo ranks on the one device, stopped by
# SIGTERM: benchmarks/multirank_check.sh) and, on a GPU, model_cost.json (native GPT-2 vs
# transformers) and overhead.json (the trainer against a bare loop, compiled) into OUT
# (default: $OUT, else ./gpu-check); every figure as one record in $RESULTS_DIR (default
# benchmarks/results) as <date>-<device>.json; a short table last.
# Overrides after OUT go to every run (the tests use them to run this script on a CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-gpu-check}}
shift $(($# > 0 ? 1 : 0))
mkdir -p "$out"
source benchmarks/device_env.sh

python3 -m launcher.doctor | tee "$out/doctor.txt"
set -o pipefail
timeout 180 python3 -m launcher.train +exp=throughput run.root="$out/runs" run.id=throughput \
    trainer.max_steps=40 "$@" 2>&1 | tee "$out/throughput.log"
# The same configuration profiled (steps 11-13) and analysed: where the GPU step goes.
timeout 180 python3 -m launcher.train +exp=throughput run.root="$out/runs" run.id=profile "$@" \
    trainer.max_steps=14 trainer.log_interval=1 profiler=steps profiler.skip_first=8 \
    profiler.warmup=2 profiler.active=3 > "$out/profile.log" 2>&1 \
    && python3 -m launcher.analyze "$out/runs/profile" --no-wandb --no-tensorboard \
        >> "$out/profile.log" 2>&1 \
    && cp "$out/runs/profile/analysis/report.md" "$out/profile_report.md" \
    || echo "the profile did not finish: see profile.log"
# LADDER_ARGS: the ladder's own options (the tests make it CPU-sized: fewer steps, micro 8).
read -r -a ladder_args <<< "${LADDER_ARGS:---max-micro-batch 64}"
timeout 330 python3 benchmarks/ladder.py "${ladder_args[@]}" --out "$out/ladder.json" "$@" \
    2>&1 | tee "$out/ladder.log"
timeout 200 bash benchmarks/multirank_check.sh "$out" "$@" | tee "$out/multirank_checks.txt" \
    || echo "the multi-rank check failed: see multirank.log"
if python3 -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
    timeout 120 python3 benchmarks/model_cost.py --skip-trainer --out "$out/model_cost.json" \
        2>&1 | tee "$out/model_cost.log" || echo "model_cost.py did not finish: see model_cost.log"
    # The launcher's own cost against a bare loop, compiled, at the throughput configuration.
    timeout 200 python3 benchmarks/overhead.py --pairs 2 --steps 30 --out "$out/overhead.json" \
        +exp=throughput "$@" 2>&1 | tee "$out/overhead.log" | grep -v " INFO " \
        || echo "overhead.py: see overhead.log (exit 1: over its 1.0x target)"
fi
python3 benchmarks/results.py "$out" --dest "${RESULTS_DIR:-benchmarks/results}" \
    --command "bash benchmarks/gpu_check.sh $out $*"

python3 - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
s = json.loads((out / "runs" / "throughput" / "summary.json").read_text())
mfu = "n/a" if s["mfu"] is None else f"{s['mfu'] * 100:.1f}%"
peak = "n/a" if s["mem/peak_gb"] is None else f"{s['mem/peak_gb']:.1f} GB"
print(f"\n+exp=throughput: {s['tokens_per_s']:,.0f} tokens/s, MFU {mfu}, "
      f"step {s['step_time_s/p50'] * 1e3:.1f} ms, peak {peak}")
analysis = out / "runs" / "profile" / "analysis" / "report.json"
report = json.loads(analysis.read_text()) if analysis.is_file() else {"kernel_classes": []}
for c in report["kernel_classes"][:4]:
    rate = "" if c["tflops"] is None else f", {c['tflops']:.3g} TFLOP/s"
    print(f"  profile: {c['class']:<16} {c['share']:>4.0%} of compute{rate}")
ladder = json.loads((out / "ladder.json").read_text())
print(f"ladder on {ladder['device']}:")
for r in ladder["rows"]:
    mfu = "n/a" if r["mfu"] is None else f"{r['mfu'] * 100:.1f}%"
    print(f"  {r['rung']}. {r['change']:<46} micro {r['micro_batch_size']:>3}  "
          f"{r['tokens_per_s']:>12,.0f} tok/s  MFU {mfu:>6}  {r['speedup']:.2f}x")
PY
