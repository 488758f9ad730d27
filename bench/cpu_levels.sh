#!/usr/bin/env bash
# augur vs llama.cpp on the CPU at each x86 ISA level this CPU can show:
# AMX (if present), AVX-512 without AMX, AVX2 (issue 14: users of ordinary
# laptops and servers should know what to expect, and the goals, decode
# >= 1.1x and prefill >= 1.0x llama.cpp, should hold on each level).
#
#   bench/cpu_levels.sh build        build llama.cpp's llama-bench twice from
#                                    the sources llama-cpp-python vendors
#                                    (.peer/, bench/gpu_peer_sdist.sh; no
#                                    package registry needed): "native" =
#                                    bench/build_peer.sh's CMake arguments for
#                                    this CPU (everything it has but AMX,
#                                    whose path crashes), and "avx2" = AVX2,
#                                    FMA, F16C, BMI2 only. Both in parallel
#                                    into /tmp/peer-cpu-*; ~5 min on 16 cores.
#   bench/cpu_levels.sh wait         block until a background build ends
#   bench/cpu_levels.sh run [-t T] MODEL.gguf...
#                                    per model and level: `augur bench -p 512
#                                    -n 128 -r 3 -t T` (median of 3) and
#                                    `llama-bench -p 512 -n 128 -r 3 -t T`
#                                    (mean of 3), one after the other; a table
#                                    with the ratios. Levels: augur as is vs
#                                    the native peer (AMX machines only),
#                                    augur AUGUR_AMX=0 vs the native peer,
#                                    augur AUGUR_AMX=0 AUGUR_CPU_ISA=avx2 vs
#                                    the avx2 peer.
#
# Where no model hub or registry is reachable (the GPU machine), make the
# models with bench/gen_model (random weights of the real shapes and types;
# speed does not depend on the values): smollm2 --type Q4_1, gemma270m
# --type Q4_K_M, qwen15b --type Q4_K_M. build/augur must exist (make).
set -euo pipefail
cd "$(dirname "$0")/.."
P=/tmp/peer-cpu

configure_build() { # NAME, CMake arguments...
  local name=$1; shift
  local b=$P-$name
  rm -rf "$b" && mkdir -p "$b"
  {
    cmake -S "$L" -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF "$@" &&
      cmake --build "$b" -j "$JOBS" --target llama-bench && echo "$*" >"$b/ARGS" && echo ok >"$b/DONE"
  } >"$b/build.log" 2>&1 || echo failed >"$b/DONE"
}

case "${1:-}" in
build)
  rm -rf /tmp/llama_cpp_python-* && tar xzf .peer/llama_cpp_python-*.tar.gz -C /tmp
  L=$(echo /tmp/llama_cpp_python-*/vendor/llama.cpp)
  JOBS=$(( $(nproc) / 2 > 1 ? $(nproc) / 2 : 1 ))
  # shellcheck disable=SC2046 # word splitting of the argument list is wanted
  native=$(bench/build_peer.sh --print-args | sed -n 's/^peer build: CMAKE_ARGS: //p' | sed 's/-DLLAVA_BUILD=OFF//')
  # shellcheck disable=SC2086
  configure_build native $native &
  configure_build avx2 -DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
    -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF &
  wait
  for n in native avx2; do echo "peer $n: $(cat $P-$n/DONE) ($(cat $P-$n/ARGS 2>/dev/null))"; done
  ;;
wait)
  for n in native avx2; do
    while [ ! -f "$P-$n/DONE" ]; do sleep 5; done
    echo "peer $n: $(cat "$P-$n/DONE")"; tail -2 "$P-$n/build.log"
  done
  ;;
run)
  shift
  T=2
  if [ "${1:-}" = -t ]; then T=$2; shift 2; fi
  echo "cpu: $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  echo "isa: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|f16c|avx_vnni|avx512[a-z0-9_]*|amx[a-z0-9_]*)$' | tr '\n' ' ')"
  for n in native avx2; do echo "peer $n: llama.cpp (llama-cpp-python 0.3.36's) cmake $(cat $P-$n/ARGS)"; done
  grep -qw amx_tile /proc/cpuinfo && levels="amx avx512 avx2" || levels="avx512 avx2"
  grep -qw avx512f /proc/cpuinfo || levels="avx2"
  printf '%-28s %-7s %9s %9s %6s %9s %9s %6s  %s\n' model level "augur pp" "peer pp" ratio "augur tg" "peer tg" ratio "augur kernels"
  for m in "$@"; do
    for lv in $levels; do
      case $lv in
      amx) env=(); peer=native ;;
      avx512) env=(AUGUR_AMX=0); peer=native ;;
      avx2) env=(AUGUR_AMX=0 AUGUR_CPU_ISA=avx2); peer=avx2 ;;
      esac
      a=$(env "${env[@]}" build/augur bench -m "$m" -p 512 -n 128 -r 3 -t "$T" --json 2>/dev/null | tail -1)
      l=$("$P-$peer/bin/llama-bench" -m "$m" -p 512 -n 128 -r 3 -t "$T" -o jsonl 2>/dev/null)
      python3 - "$m" "$lv" "$a" "$l" <<'PY'
import json, os, sys
m, lv, a, l = sys.argv[1:]
a = json.loads(a)
peer = {}
for line in l.splitlines():
    j = json.loads(line)
    peer["pp" if j["n_prompt"] else "tg"] = j["avg_ts"]
app, atg = a["pp_tok_s"], a["tg_tok_s"]
kern = a.get("cpu_kernels", "?")
print("%-28s %-7s %9.1f %9.1f %6.2f %9.1f %9.1f %6.2f  %s" % (os.path.basename(m)[:28], lv, app, peer["pp"], app / peer["pp"],
      atg, peer["tg"], atg / peer["tg"], kern))
PY
    done
  done
  ;;
*)
  echo "usage: bench/cpu_levels.sh build | wait | run [-t T] MODEL.gguf..." >&2
  exit 2
  ;;
esac
