#!/usr/bin/env bash
# The llama.cpp CUDA peer on the GPU machine, with llama.cpp's own benchmark
# tools (llama-bench, llama-batched-bench) and its server (llama-server, for
# bench/gpu_serve.sh) built from the llama.cpp that
# llama-cpp-python 0.3.36 vendors (.peer/, made by bench/gpu_peer_sdist.sh;
# that machine has no package registry, so no pip build).
#
#   bench/gpu_peer.sh build         configure and build into /tmp/peer-build
#                                   (CUDA for sm_90, flash-attention kernels
#                                   as shipped, all cores; ~10 min on 16)
#   bench/gpu_peer.sh wait          block until a background build ends
#   bench/gpu_peer.sh run MODEL...  per model: prefill 512 and 4096, batch-1
#                                   decode of 128 tokens (llama-bench, flash
#                                   attention on, all layers on the GPU), and
#                                   aggregate decode at 1/8/32/64 sequences
#                                   (llama-batched-bench); JSON lines on stdout
#
# The build is llama.cpp's best for this GPU: GGML_CUDA=ON, native sm_90
# code, its defaults otherwise (CUDA graphs on, MMQ/cuBLAS chosen by
# llama.cpp per shape). llama-server is built without its web UI
# (LLAMA_BUILD_UI=OFF, LLAMA_USE_PREBUILT_UI=OFF: it would try npm or a
# download) and without OpenSSL. Start it with setsid in the background
# while other work uses the GPU, then `wait` and `run` in a later call.
set -euo pipefail
cd "$(dirname "$0")/.."
B=/tmp/peer-build
case "${1:-}" in
build)
  rm -rf /tmp/llama_cpp_python-* "$B" && mkdir -p "$B"
  tar xzf .peer/llama_cpp_python-*.tar.gz -C /tmp
  L=$(echo /tmp/llama_cpp_python-*/vendor/llama.cpp)
  [ -f "$L/tools/ui/CMakeLists.txt" ] ||
    { echo "gpu_peer: .peer's sdist lacks tools/ui (needed by llama-server): run bench/gpu_peer_sdist.sh again" |
      tee "$B/build.log"; echo failed >"$B/DONE"; exit 1; }
  {
    cmake -S "$L" -B "$B" -G Ninja -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DGGML_NATIVE=ON \
      -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF &&
      cmake --build "$B" -j "$(nproc)" --target llama-bench llama-batched-bench llama-server &&
      echo ok >"$B/DONE"
  } >"$B/build.log" 2>&1 || { echo failed >"$B/DONE"; exit 1; }
  ;;
wait)
  while [ ! -f "$B/DONE" ]; do sleep 5; done
  tail -3 "$B/build.log"
  [ "$(cat "$B/DONE")" = ok ]
  ;;
run)
  shift
  bin=$B/bin
  for m in "$@"; do
    "$bin/llama-bench" -m "$m" -ngl 99 -fa 1 -p 512,4096 -n 128 -r 3 -o jsonl 2>/dev/null |
      python3 -c '
import json, sys
for line in sys.stdin:
    j = json.loads(line)
    test = ("pp%d" % j["n_prompt"]) if j["n_prompt"] else ("tg%d" % j["n_gen"])
    print(json.dumps({"peer": "llama.cpp " + j.get("build_commit", "?") + " CUDA", "model": sys.argv[1],
                      "test": test, "tok_s": round(j["avg_ts"], 2), "stddev": round(j["stddev_ts"], 2)}))
' "$m"
    # aggregate decode: npl sequences, each a 128-token prompt then 64 tokens
    "$bin/llama-batched-bench" -m "$m" -ngl 99 -fa on -c 16384 -b 2048 -ub 512 -npp 128 -ntg 64 -npl 1,8,32,64 \
      --output-format jsonl 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    line = line.strip()
    if not line.startswith("{"): continue
    j = json.loads(line)
    print(json.dumps({"peer": "llama.cpp CUDA", "model": sys.argv[1], "test": "decode x%d" % j["pl"],
                      "tok_s": round(j["speed_tg"], 2)}))
' "$m"
  done
  ;;
*)
  echo "usage: bench/gpu_peer.sh build | wait | run MODEL.gguf..." >&2
  exit 2
  ;;
esac
