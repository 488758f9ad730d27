#!/usr/bin/env bash
# GPU benchmarks of the CUDA backend (run on the GPU machine; see
# scripts/gpu_test.sh for the build and its dependencies, which it reuses).
#   - measures the copy bandwidth (device-to-device, bytes read + written);
#   - makes Llama-3.1-8B-shaped GGUFs with random weights (bench/gen_model,
#     our GGUF writer) in BF16 and Q4_K_M -- speed does not depend on the
#     values -- plus the real models found in models/;
#   - runs `augur bench --device cuda`: batch-1 decode, prefill at 512 and
#     4096, aggregate decode at 8, 32, 64 sequences;
#   - when bench/gpu_peer.sh built llama.cpp there, runs it on the same
#     8B files and prints augur / llama.cpp per figure (bench/gpu_ratios.py);
#   - prints each decode figure as a fraction of the roofline: weight bytes
#     read per token / measured copy bandwidth.
# Results go to stdout and $OUT (when set) as JSON lines.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/cuda/augur
[ -x $BIN ] && [ -x build/cuda/bench/gen_model ] || { echo "gpu_bench: build first (scripts/gpu_test.sh)"; exit 1; }
OUTDIR=${OUT:-build/cuda}
R=build/cuda/random
mkdir -p $R
: > $OUTDIR/gpu_bench.jsonl # this run's lines only (gpu_ratios reads them)

BW=$(python3 - <<'PY'
import torch
n = 2 << 30
a = torch.empty(n, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
torch.cuda.synchronize()
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
ts = []
for _ in range(10):
    s.record(); b.copy_(a); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e) / 1e3)
ts.sort()
print(f"{2 * n / ts[len(ts) // 2] / 1e12:.3f}")
PY
)
echo "gpu_bench: copy bandwidth ${BW} TB/s (read + write, median of 10 x 4 GiB)"

[ -f $R/llama8b-bf16.gguf ] || build/cuda/bench/gen_model $R/llama8b-bf16.gguf llama8b --type BF16
[ -f $R/llama8b-q4_k_m.gguf ] || build/cuda/bench/gen_model $R/llama8b-q4_k_m.gguf llama8b --type Q4_K_M

run() { # model, args...
  local m=$1; shift
  $BIN bench --device cuda -m "$m" --json "$@" 2>>$OUTDIR/gpu_bench.err | tail -1
}
for m in $R/llama8b-bf16.gguf $R/llama8b-q4_k_m.gguf models/*.gguf; do
  [ -f "$m" ] || continue
  echo "== $m"
  j1=$(run "$m" -p 0 -n 128 -r 3)
  echo "$j1" | tee -a $OUTDIR/gpu_bench.jsonl
  run "$m" -p 512 -n 0 -r 3 | tee -a $OUTDIR/gpu_bench.jsonl
  run "$m" -p 4096 -n 0 -r 2 | tee -a $OUTDIR/gpu_bench.jsonl
  python3 - "$j1" "$BW" <<'PY'
import json, sys
j = json.loads(sys.argv[1]); bw = float(sys.argv[2]) * 1e12
roof = bw / (j["weight_gb"] * 1e9)
print(f"  batch-1 decode {j['tg_tok_s']:.1f} tok/s = {j['tg_tok_s'] / roof:.0%} of the roofline ({roof:.0f} tok/s at {bw/1e12:.2f} TB/s, {j['weight_gb']:.2f} GB/token)")
PY
  for b in 8 32 64; do
    run "$m" -p 0 -n 64 -b $b -r 2 | tee -a $OUTDIR/gpu_bench.jsonl
  done
done

# llama.cpp on the same files in the same run, when its build is there
# (bench/gpu_peer.sh build, ~10 min), and the ratios
if [ -f /tmp/peer-build/DONE ] && [ "$(cat /tmp/peer-build/DONE)" = ok ]; then
  bash bench/gpu_peer.sh run $R/llama8b-bf16.gguf $R/llama8b-q4_k_m.gguf | tee $OUTDIR/gpu_peer.jsonl
  python3 bench/gpu_ratios.py $OUTDIR/gpu_bench.jsonl $OUTDIR/gpu_peer.jsonl
else
  echo "gpu_bench: no llama.cpp build (bench/gpu_peer.sh build first for the ratios)"
fi
