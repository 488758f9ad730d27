#!/usr/bin/env bash
# Prepares the llama.cpp CUDA peer for the GPU machine, which has no package
# registry and takes at most 64 MiB per call: downloads llama-cpp-python's
# sdist ($PEER_VERSION, default 0.3.36) here and strips what a CUDA build of
# the library does not need (llama.cpp's models, docs, .git, the other GPU
# backends, the server's tests and web UI sources: llama-server is built
# without its UI, but tools/ui's CMakeLists.txt and ui.*.in must stay),
# 76 MB -> about 7 MB, into .peer/ (ignored by git). On the GPU machine
# (carry .peer), bench/gpu_peer.sh builds llama.cpp's own benchmark tools
# and llama-server from it (that machine has no package registry for a pip
# build) and runs them. A .peer made before 2026-12-07 lacks tools/ui and
# cannot build llama-server: make it again.
set -euo pipefail
cd "$(dirname "$0")/.."
V=${PEER_VERSION:-0.3.36}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
# pip reads the sdist's metadata through its build backend (no isolation: that would need the build tools too)
python3 -m pip install -q scikit-build-core
python3 -m pip download -q --no-deps --no-build-isolation --no-binary :all: -d "$T" "llama-cpp-python==$V"
tar xzf "$T"/llama_cpp_python-$V.tar.gz -C "$T"
L="$T/llama_cpp_python-$V/vendor/llama.cpp"
find "$L/tools/ui" -mindepth 1 -maxdepth 1 ! -name CMakeLists.txt ! -name ui.h.in ! -name ui.cpp.in -exec rm -rf {} +
rm -rf "$T/llama_cpp_python-$V/.git" "$L"/{models,docs,benches,media,.github,gguf-py,conversion,tools/server/tests} \
  "$L"/ggml/src/ggml-{et,metal,hexagon,sycl,vulkan,opencl,cann,musa,webgpu,zdnn,rpc}
mkdir -p .peer
tar czf .peer/llama_cpp_python-$V.tar.gz -C "$T" llama_cpp_python-$V
ls -la .peer/llama_cpp_python-$V.tar.gz
