#!/usr/bin/env bash
# The GPU check: the throughput experiment and the optimisation ladder, end to end, on a
# fresh GPU machine whose image has torch and transformers but no internet, Hydra or W&B.
#
#   here:   bash benchmarks/fetch_wheels.sh     # once: Hydra/OmegaConf wheels into .whl/
#   there:  bash benchmarks/gpu_check.sh [OUT [overrides...]]  # about 6 minutes on one H200
#
# Writes doctor.txt, throughput.log, the run directory, ladder.json and ladder.log (and, on a
# GPU, model_cost.json: native GPT-2 vs transformers) into OUT (default: $OUT, else
# ./gpu-check), every figure as one record in $RESULTS_DIR (default benchmarks/results) as
# <date>-<device>.json, and prints a short table last. Overrides after OUT go to both the
# experiment and the ladder (the tests use them to run this script on a CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-gpu-check}}
shift $(($# > 0 ? 1 : 0))
mkdir -p "$out"
source benchmarks/device_env.sh

python3 -m launcher.doctor | tee "$out/doctor.txt"
set -o pipefail
timeout 240 python3 -m launcher.train +exp=throughput run.root="$out/runs" run.id=throughput "$@" \
    2>&1 | tee "$out/throughput.log"
# LADDER_ARGS: the ladder's own options (the tests make it CPU-sized: fewer steps, micro 8).
read -r -a ladder_args <<< "${LADDER_ARGS:---max-micro-batch 64}"
timeout 330 python3 benchmarks/ladder.py "${ladder_args[@]}" --out "$out/ladder.json" "$@" \
    2>&1 | tee "$out/ladder.log"
if python3 -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
    timeout 120 python3 benchmarks/model_cost.py --skip-trainer --out "$out/model_cost.json" \
        2>&1 | tee "$out/model_cost.log" || echo "model_cost.py did not finish: see model_cost.log"
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
ladder = json.loads((out / "ladder.json").read_text())
print(f"ladder on {ladder['device']}:")
for r in ladder["rows"]:
    mfu = "n/a" if r["mfu"] is None else f"{r['mfu'] * 100:.1f}%"
    print(f"  {r['rung']}. {r['change']:<46} micro {r['micro_batch_size']:>3}  "
          f"{r['tokens_per_s']:>12,.0f} tok/s  MFU {mfu:>6}  {r['speedup']:.2f}x")
PY
