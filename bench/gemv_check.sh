#!/usr/bin/env bash
# The few-row K-quant kernels (mmqv: Q4_K/Q6_K decode rows with mmq's
# bits, issue 43) on the GPU machine, in ~8 minutes on 16 cores + an H100:
#   1. builds with CUDA=1 (build/cuda) and runs mmqv's CPU emulation
#      (tests/emu/mmqv_emu.cpp: the kernel against mmq's arithmetic);
#   2. the op harness on the GPU (test_backend_ops: matmul_few_rows_mmq_bits
#      and the rest), with the default few-row limit (2) and with 4;
#   3. an 8B-shaped Q4_K_M (bench/gen_model, random weights) and `augur bench
#      -p 0 -n 128` at batch 1 in alternation: the default (mmqv), mmq forced
#      (AUGUR_CUDA_MMQ=1: what a server ran before), the old dp4a GEMVs
#      (AUGUR_CUDA_MMQ=0: what `bench -b 1` ran before; other bits); batch 2
#      and 4 with few-row limits 2 and 4 (the choice of MMQV_FEW); batch 8
#      and 64 (mmq, as before);
#   4. whole-model decode-row logits, bytewise: chunks of 1 (mmqv) == 2
#      (mmqv, 2 tokens a block) == 8 (mmq) == chunks of 1 with mmq forced;
#   5. a table.
# Usage (repo root, GPU machine): bash bench/gemv_check.sh
# (.devrun/gemv.sh is a copy.) Build dependencies as scripts/gpu_test.sh finds them.
set -uo pipefail
cd "$(dirname "$0")/.."

T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
if ! echo '#include <jansson.h>' | cc -E -x c - >/dev/null 2>&1; then
  [ -d .gpudeps ] || { echo "gemv_check: jansson & co. are missing and there is no .gpudeps/"; exit 1; }
  D=$PWD/build/deps
  mkdir -p "$D"
  for f in .gpudeps/*.deb; do dpkg -x "$f" "$D"; done
  export CFLAGS="-I$D/usr/include" LDLIBS="-L$D/usr/lib/x86_64-linux-gnu -Wl,-rpath,$D/usr/lib/x86_64-linux-gnu"
fi
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

for few in 2 4; do
  if AUGUR_CUDA_FEW=$few AUGUR_TEST_DEVICE=cuda timeout 240 build/cuda/tests/test_backend_ops > $OUT_DIR/harness-few$few.log 2>&1
  then R[harness$few]=PASS; else R[harness$few]=FAIL; tail -30 $OUT_DIR/harness-few$few.log; fi
  stamp "op harness, AUGUR_CUDA_FEW=$few: ${R[harness$few]} (log: $OUT_DIR/harness-few$few.log)"
done

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
  R[b1_new_$round]=$(tg AUGUR_X=0 -- -n 128 -b 1 -r 3)
  R[b1_mmq_$round]=$(tg AUGUR_CUDA_MMQ=1 -- -n 128 -b 1 -r 3)
  R[b1_old_$round]=$(tg AUGUR_CUDA_MMQ=0 -- -n 128 -b 1 -r 3)
  stamp "batch 1, round $round: new ${R[b1_new_$round]}, mmq ${R[b1_mmq_$round]}, old dp4a ${R[b1_old_$round]} tok/s"
done
for b in 2 4; do
  for few in 2 4; do R[b${b}_few$few]=$(tg AUGUR_CUDA_FEW=$few -- -n 64 -b $b -r 3); done
  R[b${b}_mmq]=$(tg AUGUR_CUDA_MMQ=1 -- -n 64 -b $b -r 3)
  stamp "batch $b: few-row limit 2 ${R[b${b}_few2]}, 4 ${R[b${b}_few4]}, mmq ${R[b${b}_mmq]} tok/s"
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
lg c1 AUGUR_X=0 -- 1; lg c2 AUGUR_X=0 -- 2; lg c8 AUGUR_X=0 -- 8; lg m1 AUGUR_CUDA_MMQ=1 -- 1; lg m8 AUGUR_CUDA_MMQ=1 -- 8
lg f3 AUGUR_CUDA_FEW=4 -- 3; lg o1 AUGUR_CUDA_MMQ=0 -- 1
same() { cmp -s build/cuda/gemv-$1.bin build/cuda/gemv-$2.bin && echo identical || echo DIFFERENT; }
R[l_c1_c8]=$(same c1 c8); R[l_c1_c2]=$(same c1 c2); R[l_c1_m1]=$(same c1 m1); R[l_m1_m8]=$(same m1 m8)
R[l_c1_f3]=$(same c1 f3); R[l_c1_o1]=$(same c1 o1)
stamp "logits compared"

cat <<EOF

== gemv_check: few-row K-quant kernels (mmqv), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
emulation (mmqv vs mmq's arithmetic)      ${R[emu]}
op harness (few-row limit 2 / 4)          ${R[harness2]} / ${R[harness4]}
8B Q4_K_M decode tok/s (-p 0), round 1 | 2:
  batch 1  new default (mmqv)             ${R[b1_new_1]} | ${R[b1_new_2]}
  batch 1  AUGUR_CUDA_MMQ=1 (mmq)         ${R[b1_mmq_1]} | ${R[b1_mmq_2]}
  batch 1  AUGUR_CUDA_MMQ=0 (old dp4a)    ${R[b1_old_1]} | ${R[b1_old_2]}
  batch 2  few-row limit 2 / 4 / mmq      ${R[b2_few2]} / ${R[b2_few4]} / ${R[b2_mmq]}
  batch 4  few-row limit 2 / 4 / mmq      ${R[b4_few2]} / ${R[b4_few4]} / ${R[b4_mmq]}
  batch 8, 64 (mmq)                       ${R[b8]}, ${R[b64]}
decode-row logits, bytewise (48 tokens):
  chunks of 1 (mmqv) vs 8 (mmq)           ${R[l_c1_c8]}
  chunks of 1 vs 2 (mmqv, 2 a block)      ${R[l_c1_c2]}
  chunks of 1 vs 3 with limit 4 (4 a blk) ${R[l_c1_f3]}
  chunks of 1: default vs mmq forced      ${R[l_c1_m1]}
  control: mmq forced, chunks of 1 vs 8   ${R[l_m1_m8]}
  info: old dp4a vs default (other bits)  ${R[l_c1_o1]}  (expected DIFFERENT)
total $(( $(date +%s) - T0 )) s
EOF
