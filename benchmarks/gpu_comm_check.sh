#!/usr/bin/env bash
# The GPU check of the communication figures, on one GPU (NCCL with one rank: DDP still
# runs its hooks and NCCL its all-reduce kernels, so the timing path and the CUDA trace
# reader are exercised; overlap between ranks needs more GPUs).
#
#   here:   bash benchmarks/fetch_wheels.sh          # once: Hydra/OmegaConf wheels into .whl/
#   there:  bash benchmarks/gpu_comm_check.sh [OUT]  # about 5 minutes on one H200
#
# 1. benchmarks/comm_timing_cost.py on GPT-2 124M in bf16: timed vs untimed steps;
# 2. a profiled run: the live comm/allreduce_s and comm/exposed_s against the CUDA trace;
# 3. +exp=throughput, shortened: tokens/s and MFU with the comm figures on.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-gpu-comm-check}}
mkdir -p "$out"
source benchmarks/device_env.sh
RUN1=(python3 -m torch.distributed.run --standalone --nproc_per_node=1)
GPT2=(model=gpt2 data=synthetic data.vocab_size=50257 trainer.precision=bf16
      trainer.seq_len=1024 trainer.micro_batch_size=16 data.num_workers=2)

python3 -m launcher.doctor > "$out/doctor.txt" 2>&1
for mb in 25 1; do
    timeout 150 "${RUN1[@]}" benchmarks/comm_timing_cost.py --steps 30 "${GPT2[@]}" \
        strategy.bucket_cap_mb=$mb 2>&1 | grep -v " INFO " | tee "$out/cost_bucket$mb.log"
done

timeout 200 "${RUN1[@]}" -m launcher.train "${GPT2[@]}" run.root="$out/runs" run.id=prof \
    trainer.max_steps=12 trainer.log_interval=1 trainer.eval_interval=0 \
    trainer.checkpoint_interval=0 strategy.bucket_cap_mb=5 profiler=steps \
    profiler.skip_first=6 profiler.warmup=1 profiler.active=3 > "$out/prof.log" 2>&1
python3 - "$out" <<'PY' 2>&1 | tee "$out/compare.txt"
import json, sys
from pathlib import Path
from launcher.analyze.breakdown import run_breakdown
from launcher.analyze.trace import load, rank_trace_files
run = Path(sys.argv[1]) / "runs" / "prof"
live = {json.loads(l)["step"]: json.loads(l) for l in (run / "metrics.jsonl").open()}
print("buckets", live[max(live)].get("comm/buckets"))
for r in run_breakdown(run):
    m = live[r.step]
    print(f"step {r.step}: trace {r.collectives}, comm {r.comm_s*1e3:.3f} ms, "
          f"exposed {r.exposed_comm_s*1e3:.3f} ms | live allreduce {m['comm/allreduce_s']*1e3:.3f} ms, "
          f"exposed {m['comm/exposed_s']*1e3:.3f} ms, step {m['step_time_s/p50']*1e3:.1f} ms")
trace = load(rank_trace_files(run)[0][0])
names = {}
for e in trace.events:
    if e.get("cat") == "kernel" and str(e.get("name", "")).startswith("nccl"):
        names[e["name"][:80]] = names.get(e["name"][:80], 0) + 1
print("nccl kernels:", names)
PY
gzip -c "$(ls "$out"/runs/prof/traces/rank0/*.json | head -1)" > "$out/prof_rank0.trace.json.gz"

timeout 240 "${RUN1[@]}" -m launcher.train +exp=throughput run.root="$out/runs" run.id=throughput \
    trainer.max_steps=40 > "$out/throughput.log" 2>&1
python3 - "$out" <<'PY' 2>&1 | tee "$out/summary.txt"
import json, sys
from pathlib import Path
s = json.loads((Path(sys.argv[1]) / "runs" / "throughput" / "summary.json").read_text())
keys = ("tokens_per_s", "mfu", "step_time_s/p50", "mem/peak_gb", "comm/allreduce_s",
        "comm/exposed_s", "comm/overhead_frac", "comm/busbw_gbps", "comm/buckets")
print(json.dumps({k: s.get(k) for k in keys}, indent=1))
PY
