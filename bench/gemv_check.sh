#!/usr/bin/env bash
# The few-row K-quant kernels (mmqv: Q4_K/Q6_K decode rows with mmq's
# bits, issue 43) on the GPU machine, in a few minutes on 16 cores + an H100:
#   1. builds with CUDA=1 (build/cuda) and runs mmqv's CPU emulation
#      (tests/emu/mmqv_emu.cpp: the kernel against mmq's arithmetic);
#   2. the op harness on the GPU (test_backend_ops: matmul_few_rows_mmq_bits
#      and the rest);
#   3. an 8B-shaped Q4_K_M (bench/gen_model, random weights) and `augur bench
#      -p 0` at batch 1 (two rounds, -n 128) and 2 (mmqv), 4, 8 and 64 (mmq);
#   4. whole-model decode-row logits, bytewise: chunks of 1 (mmqv) == 2
#      (mmqv, 2 tokens a block) == 3 (mmq, one row past MMQV_FEW) == 8 (mmq);
#   5. a table.
# (The A/B runs against mmq at every batch and the old dp4a GEMVs, and of
# the few-row limits 2 vs 4, went with switches since retired: figures in
# docs/design-notes.md.)
# Usage (repo root, GPU machine): bash bench/gemv_check.sh
# (.devrun/gemv.sh is a copy.) Build dependencies as scripts/gpu_test.sh finds them.
set -uo pipefail
cd "$(dirname "$0")/.."

T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
. scripts/gpu_build_env.sh || exit 1
OUT_DIR=${OUT:-build/cuda}
mkdir -p build/cuda/random "$OUT_DIR"
M=build/cuda/random/llama8b-q4_k_m.gguf
# the 8B file (random weights; speed does not depend on them) while the build runs
( [ -f $M ] || { make -j4 BUILD=build/cuda-gen build/cuda-gen/bench/gen_model >/dev/null 2>&1 &&
                 build/cuda-gen/bench/gen_model $M llama8b --type Q4_K_M >/dev/null; } ) &
GEN=$!
make -j16 CUDA=1 BUILD=build/cuda all build/cuda/bench/gen_model >/dev/null || { echo "gemv_check: build failed"; exit 1; }
stamp "built; $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)"
declare -A R  # results for the table

make BUILD=build/cuda build/cuda/emu/mmqv_emu >/dev/null 2>&1 && build/cuda/emu/mmqv_emu && R[emu]=PASS || R[emu]=FAIL
stamp "emulation: ${R[emu]}"

if AUGUR_TEST_DEVICE=cuda timeout 240 build/cuda/tests/test_backend_ops > $OUT_DIR/harness.log 2>&1
then R[harness]=PASS; else R[harness]=FAIL; tail -30 $OUT_DIR/harness.log; fi
stamp "op harness: ${R[harness]} (log: $OUT_DIR/harness.log)"

wait $GEN
[ -f $M ] || { echo "gemv_check: no $M"; exit 1; }
stamp "model $M"
tg() { # ENV... -- bench args: prints tok/s
  local e=()
  while [ "$1" != -- ]; do e+=("$1"); shift; done; shift
  env "${e[@]}" build/cuda/augur bench --device cuda -m $M -p 0 --json "$@" 2>/dev/null | tail -1 |
    python3 -c 'import json,sys; print("%.1f" % json.loads(sys.stdin.read())["tg_tok_s"])' 2>/dev/null || echo "-"
}
for round in 1 2; do
  R[b1_$round]=$(tg AUGUR_X=0 -- -n 128 -b 1 -r 3)
  stamp "batch 1, round $round: ${R[b1_$round]} tok/s"
done
for b in 2 4; do
  R[b$b]=$(tg AUGUR_X=0 -- -n 64 -b $b -r 3)
  stamp "batch $b: ${R[b$b]} tok/s"
done
for b in 8 64; do
  R[b${b}]=$(tg AUGUR_X=0 -- -n 64 -b $b -r 2)
  stamp "batch $b: ${R[b$b]} tok/s"
done

# whole-model logits of decode rows, bytewise (48 tokens of one sequence)
seq 11 7 340 | head -48 | tr '\n' ' ' > build/cuda/gemv-ids.txt
lg() { # name ENV... -- chunk
  local n=$1 e=(); shift
  while [ "$1" != -- ]; do e+=("$1"); shift; done; shift
  env "${e[@]}" build/cuda/augur logits --device cuda -m $M --tokens build/cuda/gemv-ids.txt --decode --chunk "$1" \
    -o build/cuda/gemv-$n.bin 2>/dev/null
}
lg c1 AUGUR_X=0 -- 1; lg c2 AUGUR_X=0 -- 2; lg c3 AUGUR_X=0 -- 3; lg c8 AUGUR_X=0 -- 8
same() { cmp -s build/cuda/gemv-$1.bin build/cuda/gemv-$2.bin && echo identical || echo DIFFERENT; }
R[l_c1_c8]=$(same c1 c8); R[l_c1_c2]=$(same c1 c2); R[l_c1_c3]=$(same c1 c3)
stamp "logits compared"

cat <<EOF

== gemv_check: few-row K-quant kernels (mmqv), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
emulation (mmqv vs mmq's arithmetic)      ${R[emu]}
op harness                                ${R[harness]}
8B Q4_K_M decode tok/s (-p 0):
  batch 1 (mmqv), round 1 | 2             ${R[b1_1]} | ${R[b1_2]}
  batch 2 (mmqv)                          ${R[b2]}
  batch 4, 8, 64 (mmq)                    ${R[b4]}, ${R[b8]}, ${R[b64]}
decode-row logits, bytewise (48 tokens):
  chunks of 1 (mmqv) vs 8 (mmq)           ${R[l_c1_c8]}
  chunks of 1 vs 2 (mmqv, 2 a block)      ${R[l_c1_c2]}
  chunks of 1 vs 3 (mmq)                  ${R[l_c1_c3]}
total $(( $(date +%s) - T0 )) s
EOF
