#!/usr/bin/env bash
# The CUDA backend's tests, on a machine with an NVIDIA GPU and nvcc:
#   1. builds augur with CUDA=1 (in build/cuda);
#   2. runs the op harness (tests/unit/test_backend_ops.c) on the GPU: every
#      op against double-precision references and the CPU backend;
#   3. compares whole-model logits of the GPU with the CPU
#      (scripts/compare_backends.py): stories260K and the real models found
#      in models/ and .devmodels/ (the GPU machine takes 64 MiB per call, so
#      there: cuts of the real models made by scripts/truncate_gguf.py; cut
#      SmolLM2 to 8 layers: at 4 its logits are flat enough that near-ties
#      flip, top-1 0.95 against the floor of 0.9675, every flipped row within
#      0.2 logit of the CPU's runner-up, in every kernel variant alike), plus
#      random-weight models of each architecture and weight type made here
#      by bench/gen_model (our GGUF writer).
# Build dependencies: the system's (scripts/setup.sh installs them where apt
# works); on a machine without a package registry, the .deb files in
# .gpudeps/ (fetch them with `scripts/gpu_deps.sh` where apt works) are
# unpacked into build/deps and used from there.
# --prebuilt: skip the build and use build/cuda/augur, build/cuda/tests/test_backend_ops
# and build/cuda/bench/gen_model as they are (built elsewhere with the same
# Makefile and carried to the GPU machine, whose device time is short).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=$(nproc)
# same FILE1 FILE2 WHAT: PASS when the files are byte for byte equal, else FAIL and stop
same() {
  if cmp -s "$1" "$2"; then echo "PASS $3"; else echo "FAIL $3"; exit 1; fi
}

if [ "${1:-}" = --prebuilt ]; then
  for b in build/cuda/augur build/cuda/tests/test_backend_ops build/cuda/bench/gen_model; do
    [ -x $b ] || { echo "gpu_test: --prebuilt, but $b is missing"; exit 1; }
  done
  echo "gpu_test: prebuilt binaries (built $(date -r build/cuda/augur '+%F %T'))"
else
  . scripts/gpu_build_env.sh || exit 1
  make -j"$JOBS" CUDA=1 BUILD=build/cuda all build/cuda/bench/gen_model >/dev/null
  echo "gpu_test: built build/cuda/augur ($(nvcc --version | tail -1))"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

echo "== op harness on the GPU (default kernels: K-quant decode rows through mmqv up to 2 rows a matmul and the tensor cores beyond, with the same bits, prompt attention on wgmma on an H100/H200 (sm_90a), else one-pass on mma.sync, the pick and cands ops, split grids for few rows)"
AUGUR_TEST_DEVICE=cuda build/cuda/tests/test_backend_ops
echo "== op harness on the GPU (the other kernels: SIMT prompt attention, split-K attention in splits of 8 positions)"
AUGUR_CUDA_FA=0 AUGUR_CUDA_ATT_MIN=8 AUGUR_TEST_DEVICE=cuda build/cuda/tests/test_backend_ops
echo "== op harness on the GPU (K-quant decode rows through mmqv with every launch's rows staged in shared memory, AUGUR_CUDA_STAGE=2)"
AUGUR_CUDA_STAGE=2 AUGUR_TEST_DEVICE=cuda build/cuda/tests/test_backend_ops
echo "== op harness on the GPU (add, then rmsnorm, instead of the fused add_rmsnorm: AUGUR_CUDA_FUSE=0)"
AUGUR_CUDA_FUSE=0 AUGUR_TEST_DEVICE=cuda build/cuda/tests/test_backend_ops

echo "== op harness on the GPU (the K-quant weights of a matmul_multi in separate mmqv launches, AUGUR_CUDA_PAIR=0; argmax one block a row, AUGUR_CUDA_ARGMAX_SPLIT=0; serial launches, AUGUR_CUDA_PDL=0)"
AUGUR_CUDA_PAIR=0 AUGUR_CUDA_ARGMAX_SPLIT=0 AUGUR_CUDA_PDL=0 AUGUR_TEST_DEVICE=cuda build/cuda/tests/test_backend_ops

echo "== op harness on the GPU (mmqv reading its rows from global memory, not staged in shared memory: AUGUR_CUDA_STAGE=0; pairs only in one launch: AUGUR_CUDA_PAIR=2)"
AUGUR_CUDA_STAGE=0 AUGUR_CUDA_PAIR=2 AUGUR_TEST_DEVICE=cuda build/cuda/tests/test_backend_ops

echo "== op harness on the GPU (two-pass prompt attention, AUGUR_CUDA_FA=2pass; the pick and cands ops one block a row, AUGUR_CUDA_SAMPLE_SPLIT=0)"
AUGUR_CUDA_FA=2pass AUGUR_CUDA_SAMPLE_SPLIT=0 AUGUR_TEST_DEVICE=cuda build/cuda/tests/test_backend_ops

echo "== op harness on the GPU (conversions of decode rows' activations by the matmul, not their producer: AUGUR_CUDA_PREP=0; rope_kv_store's scalar kernel, AUGUR_CUDA_ROPE_VEC=0)"
AUGUR_CUDA_PREP=0 AUGUR_CUDA_ROPE_VEC=0 AUGUR_TEST_DEVICE=cuda build/cuda/tests/test_backend_ops

echo "== op harness on the GPU (one-pass prompt attention on mma.sync, AUGUR_CUDA_FA=1, in blocks of 3, 2 and 1 row tiles, AUGUR_CUDA_FA_ROWS; the feed-forward op as the three ops, AUGUR_CUDA_FFN16=0)"
AUGUR_CUDA_FA=1 AUGUR_TEST_DEVICE=cuda build/cuda/tests/test_backend_ops
AUGUR_CUDA_FA=1 AUGUR_CUDA_FA_ROWS=2 AUGUR_CUDA_FFN16=0 AUGUR_TEST_DEVICE=cuda build/cuda/tests/test_backend_ops
AUGUR_CUDA_FA=1 AUGUR_CUDA_FA_ROWS=1 AUGUR_TEST_DEVICE=cuda build/cuda/tests/test_backend_ops

echo "== op harness on the GPU (the variants of the prompt attention on wgmma, AUGUR_CUDA_WG_VAR=0, 6, 10, 16, 24, 52 and 84 (the default is 20); sm_90a on an H100/H200 only)"
# the variants' failures are counted, not fatal: the rest of this script still runs (its result fails at the end);
# a time limit, as a variant with mbarriers or named barriers that never ran could hang
variant_rc=0
for v in 0 6 10 16 24 52 84; do
  AUGUR_CUDA_FA=wg AUGUR_CUDA_WG_VAR=$v AUGUR_TEST_DEVICE=cuda timeout 300 build/cuda/tests/test_backend_ops ||
    { echo "FAIL op harness with AUGUR_CUDA_FA=wg AUGUR_CUDA_WG_VAR=$v"; variant_rc=1; }
done

echo "== op harness on the GPU (BF16 decode tiles beyond 16 rows: AUGUR_CUDA_MMT_TILE=2, the default's up to 32 rows, at every batch; 0, two row tiles by 32 tokens, at every batch)"
# (the harness's wide batches are 70 rows, which the default gives tile 4, the staged kernel; the tiles change no bits)
for t in 2 0; do
  AUGUR_CUDA_MMT_TILE=$t AUGUR_TEST_DEVICE=cuda timeout 300 build/cuda/tests/test_backend_ops ||
    { echo "FAIL op harness with AUGUR_CUDA_MMT_TILE=$t"; variant_rc=1; }
done

echo "== op harness on the GPU (a SiLU feed-forward block's 1-8 BF16 decode rows through the three ops instead of one launch: AUGUR_CUDA_GLU=0)"
AUGUR_CUDA_GLU=0 AUGUR_TEST_DEVICE=cuda timeout 300 build/cuda/tests/test_backend_ops ||
  { echo "FAIL op harness with AUGUR_CUDA_GLU=0"; variant_rc=1; }

echo "== op harness on the GPU (decode attention one block per row and head instead of split-K: AUGUR_CUDA_SPLITK=0)"
AUGUR_CUDA_SPLITK=0 AUGUR_TEST_DEVICE=cuda build/cuda/tests/test_backend_ops

echo "== op harness on the GPU (split-K attention's grid always 16 splits deep instead of fitted to the pass: AUGUR_CUDA_ATT_FIT=0)"
AUGUR_CUDA_ATT_FIT=0 AUGUR_TEST_DEVICE=cuda build/cuda/tests/test_backend_ops

echo "== generation on the GPU (stories260K): greedy run, and speculative == plain decoding"
S=${AUGUR_SHARED:-../shared}/models/tiny/stories260K.gguf
[ -f "$S" ] || S=.devmodels/stories260K.gguf
build/cuda/augur run --device cuda -m "$S" -p "Once upon a time" -n 48 --temp 0
echo
printf 'Once upon a time, there was a little girl named Lily. She liked to play. Once upon a time, there was a' > build/cuda/prompt.txt
build/cuda/augur bench --device cuda -m "$S" --draft ngram -f build/cuda/prompt.txt -n 96 -r 2

echo "== recorded decode passes (the default) give the bits of unrecorded ones (AUGUR_CUDA_GRAPHS=0)"
# head dim 64 (the split-K attention's smallest; stories260K's 8 takes the one-block kernel)
G=$(ls .devmodels/SmolLM2-*layers.gguf 2>/dev/null | head -1 || true)
[ -n "$G" ] && [ -f "$G" ] || G=models/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$G" ] || G=$S
seq 1 2 199 | tr '\n' ' ' > build/cuda/ids.txt
AUGUR_CUDA_GRAPHS=0 build/cuda/augur logits --device cuda -m "$G" --tokens build/cuda/ids.txt --decode --chunk 1 -o build/cuda/plain.bin
build/cuda/augur logits --device cuda -m "$G" --tokens build/cuda/ids.txt --decode --chunk 1 \
  -o build/cuda/graphs.bin
same build/cuda/plain.bin build/cuda/graphs.bin "graphs: identical logits"
AUGUR_CUDA_SPLITK=0 AUGUR_CUDA_GRAPHS=0 build/cuda/augur logits --device cuda -m "$G" --tokens build/cuda/ids.txt --decode \
  --chunk 1 -o build/cuda/plain-sk.bin
AUGUR_CUDA_SPLITK=0 build/cuda/augur logits --device cuda -m "$G" --tokens build/cuda/ids.txt --decode --chunk 1 \
  -o build/cuda/graphs-sk.bin
same build/cuda/plain-sk.bin build/cuda/graphs-sk.bin "graphs with the one-block decode attention: identical logits"

# the fitted grid (default) only drops empty splits: the full-depth grid gives the same bits
AUGUR_CUDA_ATT_FIT=0 build/cuda/augur logits --device cuda -m "$G" --tokens build/cuda/ids.txt --decode --chunk 1 \
  -o build/cuda/graphs-full.bin
same build/cuda/plain.bin build/cuda/graphs-full.bin "graphs with the full-depth split-K grid: the same logits"

echo "== greedy tokens chosen on the GPU (the argmax op; no rows copied back) == chosen from the copied rows (AUGUR_ARGMAX=0)"
P="The capital of France is a city that"
build/cuda/augur run --device cuda -m "$G" -p "$P" -n 64 --temp 0 --ignore-eos > build/cuda/argmax-on.txt 2>/dev/null
AUGUR_ARGMAX=0 build/cuda/augur run --device cuda -m "$G" -p "$P" -n 64 --temp 0 --ignore-eos > build/cuda/argmax-off.txt 2>/dev/null
same build/cuda/argmax-on.txt build/cuda/argmax-off.txt "greedy text with the GPU argmax == with the rows copied back"
AUGUR_CUDA_ARGMAX_SPLIT=0 build/cuda/augur run --device cuda -m "$G" -p "$P" -n 64 --temp 0 --ignore-eos \
  > build/cuda/argmax-block.txt 2>/dev/null
same build/cuda/argmax-block.txt build/cuda/argmax-off.txt "greedy text with the one-block GPU argmax (AUGUR_CUDA_ARGMAX_SPLIT=0) == with the rows copied back"
build/cuda/augur bench --device cuda -m "$G" -p 0 -n 16 -b 4 -r 1 --argmax

echo "== sampled tokens drawn on the GPU (the pick op) == drawn from the copied rows (AUGUR_PICK=0)"
T="--temp 0.8 --top-k 0 --top-p 1 --min-p 0 --seed 3"
build/cuda/augur run --device cuda -m "$G" -p "$P" -n 64 $T --ignore-eos > build/cuda/pick-on.txt 2>/dev/null
AUGUR_PICK=0 build/cuda/augur run --device cuda -m "$G" -p "$P" -n 64 $T --ignore-eos > build/cuda/pick-off.txt 2>/dev/null
same build/cuda/pick-on.txt build/cuda/pick-off.txt "sampled text with the GPU pick == with the rows copied back (recorded passes: each replay's draws)"
AUGUR_CUDA_SAMPLE_SPLIT=0 build/cuda/augur run --device cuda -m "$G" -p "$P" -n 64 $T --ignore-eos > build/cuda/pick-on.txt 2>/dev/null
same build/cuda/pick-on.txt build/cuda/pick-off.txt "sampled text with the one-block GPU pick (AUGUR_CUDA_SAMPLE_SPLIT=0) == with the rows copied back"

echo "== top-k sampling from candidates found on the GPU (the cands op) == from the copied rows (AUGUR_CANDS=0)"
# (the CLI's defaults; a top-k of 200; top-k off: a top-p and a min-p cut, among the best 256 or past them: the row fetched from the device)
for T in "--temp 0.8 --seed 3" "--temp 1.2 --top-k 200 --top-p 1 --min-p 0 --seed 5" \
         "--temp 1.0 --top-k 0 --top-p 0.9 --min-p 0 --seed 7" "--temp 1.0 --top-k 0 --top-p 1 --min-p 0.02 --seed 9"; do
  build/cuda/augur run --device cuda -m "$G" -p "$P" -n 64 $T --ignore-eos > build/cuda/cands-on.txt 2>/dev/null
  AUGUR_CANDS=0 build/cuda/augur run --device cuda -m "$G" -p "$P" -n 64 $T --ignore-eos > build/cuda/cands-off.txt 2>/dev/null
  same build/cuda/cands-on.txt build/cuda/cands-off.txt "sampled text ($T) from GPU candidates == from the rows copied back"
  AUGUR_CUDA_SAMPLE_SPLIT=0 build/cuda/augur run --device cuda -m "$G" -p "$P" -n 64 $T --ignore-eos > build/cuda/cands-on.txt 2>/dev/null
  same build/cuda/cands-on.txt build/cuda/cands-off.txt "sampled text ($T) from one-block GPU candidates (AUGUR_CUDA_SAMPLE_SPLIT=0) == from the rows copied back"
done
# speculative rounds at a temperature: every verify row, and the draft model's own rows, from candidates
for D in ngram "$G"; do
  T="--temp 0.8 --seed 11 --draft $D"
  export AUGUR_SPEC_ROW_COST=0.1 # the draft lengths fixed, not measured: both runs draft alike
  build/cuda/augur run --device cuda -m "$G" -p "$P" -n 64 $T --ignore-eos > build/cuda/cands-on.txt 2>/dev/null
  AUGUR_CANDS=0 build/cuda/augur run --device cuda -m "$G" -p "$P" -n 64 $T --ignore-eos > build/cuda/cands-off.txt 2>/dev/null
  same build/cuda/cands-on.txt build/cuda/cands-off.txt "speculative sampled text ($T) from GPU candidates == from the rows copied back"
  unset AUGUR_SPEC_ROW_COST
done
build/cuda/augur bench --device cuda -m "$G" -p 0 -n 16 -b 4 -r 1 --sample
# logprobs through the server: greedy, top-k, a top-p cut, a temperature alone (picked token and its candidates),
# a scored prompt; tokens equal, logprobs within 1e-4 (the GPU sums z in another order)
python3 scripts/compare_logprobs.py --bin build/cuda/augur -m "$G" --a "AUGUR_CUDA_SAMPLE_SPLIT=1" \
  --b "AUGUR_CANDS=0 AUGUR_PICK=0" -- --device cuda

echo "== logit bias and penalties applied on the GPU (the edit op) == by the samplers to the copied rows (AUGUR_EDITS=0)"
# greedy (argmax), a temperature alone (pick), the CLI's truncation (candidates), speculative; the edit kernel off
# (AUGUR_CUDA_EDIT=0: the samplers edit the copied rows, as with AUGUR_EDITS=0) too
for T in "--temp 0 --repeat-penalty 1.3" "--temp 1.0 --top-k 0 --top-p 1 --min-p 0 --seed 3 --repeat-penalty 1.2" \
         "--temp 0.8 --seed 5 --repeat-penalty 0.85" "--temp 0.8 --seed 11 --repeat-penalty 1.2 --draft ngram"; do
  export AUGUR_SPEC_ROW_COST=0.1
  build/cuda/augur run --device cuda -m "$G" -p "$P" -n 64 $T --ignore-eos > build/cuda/edit-on.txt 2>/dev/null
  AUGUR_EDITS=0 build/cuda/augur run --device cuda -m "$G" -p "$P" -n 64 $T --ignore-eos > build/cuda/edit-off.txt 2>/dev/null
  same build/cuda/edit-on.txt build/cuda/edit-off.txt "text ($T) from rows edited on the GPU == edited by the sampler"
  AUGUR_CUDA_EDIT=0 build/cuda/augur run --device cuda -m "$G" -p "$P" -n 64 $T --ignore-eos > build/cuda/edit-on.txt 2>/dev/null
  same build/cuda/edit-on.txt build/cuda/edit-off.txt "text ($T) with the edit kernel off (AUGUR_CUDA_EDIT=0) == edited by the sampler"
  unset AUGUR_SPEC_ROW_COST
done
build/cuda/augur bench --device cuda -m "$G" -p 0 -n 16 -b 4 -r 1 --sample --penalties
# bias, penalties and structured outputs with logprobs: rows edited and masked on the GPU (the edit and mask ops)
# against rows copied back, edited and masked on the host
python3 scripts/compare_logprobs.py --bin build/cuda/augur -m "$G" --a "" \
  --b "AUGUR_CANDS=0 AUGUR_PICK=0 AUGUR_EDITS=0 AUGUR_MASKS=0" -- --device cuda

echo "== whole models, GPU vs CPU"
models=()
for m in "${AUGUR_SHARED:-../shared}/models/tiny/stories260K.gguf" .devmodels/*.gguf models/*.gguf; do
  [ -f "$m" ] && models+=("$m")
done
R=build/cuda/random-test
mkdir -p $R
build/cuda/bench/gen_model $R/smollm2-q4_1.gguf smollm2 --type Q4_1 --layers 6
build/cuda/bench/gen_model $R/qwen05b-q4_k_m.gguf qwen05b --type Q4_K_M --layers 6
build/cuda/bench/gen_model $R/gemma270m-q4_k_m.gguf gemma270m --type Q4_K_M --layers 6
build/cuda/bench/gen_model $R/llama8b-2layers-bf16.gguf llama8b --type BF16 --layers 2
build/cuda/bench/gen_model $R/qwen05b-q8_0.gguf qwen05b --type Q8_0 --layers 4
# qwen3 (dense): ops the GPU has (gemma3's q/k norms), never run there before issue 44
build/cuda/bench/gen_model $R/qwen3-1.7b-q4_k_m.gguf qwen3-1.7b --type Q4_K_M --layers 4
# granitehybrid: Mamba-2 layers (the mamba2 op, the recurrent state and its snapshots in device memory) beside
# attention layers without RoPE; decode rows in chunks of 7 snapshot the state after each row
build/cuda/bench/gen_model $R/granite-h-tiny-q4_k.gguf granite-h-tiny --type Q4_K
# routed experts (the moe op, cuda/moe.cu): qwen3moe with Q4_K experts (mmqv/mmq decode rows) and with Q8_0 ones
# (the fp32 GEMV)
build/cuda/bench/gen_model $R/qwen3moe-tiny-q4_k.gguf qwen3moe-tiny --type Q4_K
build/cuda/bench/gen_model $R/qwen3moe-tiny-q8_0.gguf qwen3moe-tiny --type Q8_0
rc=$variant_rc
python3 scripts/compare_backends.py --bin build/cuda/augur "${models[@]}" || rc=1
echo "== whole models with the one-block decode attention (AUGUR_CUDA_SPLITK=0)"
AUGUR_CUDA_SPLITK=0 python3 scripts/compare_backends.py --bin build/cuda/augur "${models[@]}" || rc=1
python3 scripts/compare_backends.py --bin build/cuda/augur --random $R/*.gguf || rc=1
echo "== whole models with the two-pass prompt attention (AUGUR_CUDA_FA=2pass)"
AUGUR_CUDA_FA=2pass python3 scripts/compare_backends.py --bin build/cuda/augur "${models[@]}" || rc=1
AUGUR_CUDA_FA=2pass python3 scripts/compare_backends.py --bin build/cuda/augur --random $R/*.gguf || rc=1
echo "== whole models with the one-pass prompt attention on mma.sync (AUGUR_CUDA_FA=1; the default off sm_90a)"
AUGUR_CUDA_FA=1 python3 scripts/compare_backends.py --bin build/cuda/augur "${models[@]}" || rc=1
AUGUR_CUDA_FA=1 python3 scripts/compare_backends.py --bin build/cuda/augur --random $R/*.gguf || rc=1
# gpt-oss (attention sinks in every attention kernel, sliding-window layers, YaRN's rope_freqs, MXFP4 routed
# experts): compared where this build's CUDA backend has every op the family needs (the moe op and MXFP4 matmuls
# come from another branch); else one SKIP line that names what is missing. Not in $R (the globs above).
O=build/cuda/gpt-oss-tiny.gguf
build/cuda/bench/gen_model $O gpt-oss-tiny --type MXFP4 --dense F32 >/dev/null
if build/cuda/augur logits --device cuda -m $O --tokens build/cuda/ids.txt --chunk 64 -o build/cuda/oss.bin \
     2>build/cuda/oss.err >/dev/null; then
  echo "== gpt-oss-tiny, GPU vs CPU (default kernels; one-block decode attention; two-pass and mma.sync prompt attention)"
  python3 scripts/compare_backends.py --bin build/cuda/augur --random $O || rc=1
  AUGUR_CUDA_SPLITK=0 python3 scripts/compare_backends.py --bin build/cuda/augur --random $O || rc=1
  AUGUR_CUDA_FA=2pass python3 scripts/compare_backends.py --bin build/cuda/augur --random $O || rc=1
  AUGUR_CUDA_FA=1 python3 scripts/compare_backends.py --bin build/cuda/augur --random $O || rc=1
else
  echo "SKIP gpt-oss-tiny on the GPU: $(grep -m1 'not supported' build/cuda/oss.err || tail -n1 build/cuda/oss.err)"
fi
echo "== fused ops (add_rmsnorm, rope_kv_store, activations left converted by their producer) give the separate ops' bits"
# (the feed-forward op's BF16 prompt rows round otherwise: AUGUR_CUDA_FFN16=0 on both sides; the GPU-vs-CPU
# comparisons above hold them to the CPU)
for m in $R/qwen05b-q4_k_m.gguf $R/llama8b-2layers-bf16.gguf $R/gemma270m-q4_k_m.gguf; do
  for mode in "--chunk 7" "--chunk 100" "--decode --chunk 3"; do
    AUGUR_CUDA_FFN16=0 build/cuda/augur logits --device cuda -m "$m" --tokens build/cuda/ids.txt $mode \
      -o build/cuda/fused.bin 2>/dev/null
    AUGUR_CUDA_FFN16=0 AUGUR_CUDA_FUSE=0 AUGUR_CUDA_PREP=0 build/cuda/augur logits --device cuda -m "$m" \
      --tokens build/cuda/ids.txt $mode -o build/cuda/unfused.bin 2>/dev/null
    if cmp -s build/cuda/fused.bin build/cuda/unfused.bin; then echo "PASS fused == unfused: $(basename $m) $mode"
    else echo "FAIL fused != unfused: $(basename $m) $mode"; rc=1; fi
  done
done
# Llama shapes (K a multiple of 256: q, k, gate and up Q4_K, v Q4_K or Q6_K, k and v over 4 warps a row), Qwen
# shapes, Gemma; the Llama model is not among the compared models (size)
m=build/cuda/llama8b-2layers-q4_k_m.gguf
build/cuda/bench/gen_model $m llama8b --type Q4_K_M --layers 2 >/dev/null
# bits_vs VAR BASE "VALUES" MODE...: decode-row logits of the default kernels with VAR set to each of VALUES equal
# those with VAR=BASE, byte for byte, on the Llama, Qwen and Gemma Q4_K_M shapes (or the models in BITS_MODELS)
bits_vs() {
  local var=$1 base=$2 values=$3 m2 mode v
  shift 3
  for m2 in ${BITS_MODELS:-$m $R/qwen05b-q4_k_m.gguf $R/gemma270m-q4_k_m.gguf}; do
    for mode in "$@"; do
      env $var=$base build/cuda/augur logits --device cuda -m "$m2" --tokens build/cuda/ids.txt $mode \
        -o build/cuda/base.bin 2>/dev/null
      for v in $values; do
        env $var=$v build/cuda/augur logits --device cuda -m "$m2" --tokens build/cuda/ids.txt $mode \
          -o build/cuda/variant.bin 2>/dev/null
        if cmp -s build/cuda/base.bin build/cuda/variant.bin; then echo "PASS $var=$v == $var=$base: $(basename $m2) $mode"
        else echo "FAIL $var=$v != $var=$base: $(basename $m2) $mode"; rc=1; fi
      done
    done
  done
}
echo "== few K-quant decode rows through mmqv (up to 2 rows a matmul: chunks of 1 and 2) give mmq's bits (3 rows and more: chunks of 3 and 8), whole models"
for m2 in $m $R/qwen05b-q4_k_m.gguf $R/gemma270m-q4_k_m.gguf; do
  build/cuda/augur logits --device cuda -m "$m2" --tokens build/cuda/ids.txt --decode --chunk 8 -o build/cuda/base.bin 2>/dev/null
  for c in 1 2 3; do
    build/cuda/augur logits --device cuda -m "$m2" --tokens build/cuda/ids.txt --decode --chunk $c \
      -o build/cuda/variant.bin 2>/dev/null
    if cmp -s build/cuda/base.bin build/cuda/variant.bin; then echo "PASS decode chunks of $c == of 8: $(basename $m2)"
    else echo "FAIL decode chunks of $c != of 8: $(basename $m2)"; rc=1; fi
  done
done
echo "== mmqv grouped (q/k/v, gate/up: the default; pairs only: AUGUR_CUDA_PAIR=2) and staged (group launches: the default; every launch: AUGUR_CUDA_STAGE=2) give the bits of separate, unstaged launches"
bits_vs AUGUR_CUDA_PAIR 0 "1 2" "--decode --chunk 1" "--decode --chunk 2"
bits_vs AUGUR_CUDA_STAGE 0 "1 2" "--decode --chunk 1" "--decode --chunk 2"
echo "== one to eight BF16 decode rows of q/k/v in the 64-register kernel (the default) give the bits of the 126-register one (AUGUR_CUDA_MMT_LEAN=0)"
BITS_MODELS=$R/llama8b-2layers-bf16.gguf bits_vs AUGUR_CUDA_MMT_LEAN 0 1 "--decode --chunk 1" "--decode --chunk 8" "--decode --chunk 9"
echo "== a SiLU feed-forward block's BF16 gate, up and product in one launch (the default) gives the three ops' bits (AUGUR_CUDA_GLU=0)"
BITS_MODELS=$R/llama8b-2layers-bf16.gguf bits_vs AUGUR_CUDA_GLU 0 1 "--decode --chunk 1" "--decode --chunk 3" "--decode --chunk 8"
echo "== kernels launched early (programmatic dependent launch, the default) give the bits of serial launches (AUGUR_CUDA_PDL=0)"
# a missing wait in a kernel would read its input before its producer finished: different bits, or a moving error
for m in $m $R/qwen05b-q4_k_m.gguf $R/llama8b-2layers-bf16.gguf $R/gemma270m-q4_k_m.gguf; do
  for mode in "--chunk 7" "--decode --chunk 1" "--decode --chunk 2" "--decode --chunk 3"; do # (mmqv at 1-2 rows, mmq at 3)
    build/cuda/augur logits --device cuda -m "$m" --tokens build/cuda/ids.txt $mode -o build/cuda/pdl.bin 2>/dev/null
    AUGUR_CUDA_PDL=0 build/cuda/augur logits --device cuda -m "$m" --tokens build/cuda/ids.txt $mode \
      -o build/cuda/serial.bin 2>/dev/null
    if cmp -s build/cuda/pdl.bin build/cuda/serial.bin; then echo "PASS pdl == serial: $(basename $m) $mode"
    else echo "FAIL pdl != serial: $(basename $m) $mode"; rc=1; fi
  done
done
echo "== the one-pass prompt attention in blocks of 1, 2 or 3 row tiles (AUGUR_CUDA_FA_ROWS) gives the same bits"
# (a warp's rows see the chunks of the block's other rows as wholly masked: weights 0, nothing rescaled)
BITS_MODELS="$R/llama8b-2layers-bf16.gguf $R/gemma270m-q4_k_m.gguf $R/smollm2-q4_1.gguf" \
  bits_vs AUGUR_CUDA_FA_ROWS 1 "2 3" "--chunk 100" "--chunk 37"
[ $rc = 0 ] && echo "gpu_test: all passed" || echo "gpu_test: FAILED"
exit $rc
