#!/usr/bin/env bash
# llama.cpp's own server (llama-server), the peer of bench/serve_bench.py on
# the CPU, built for THIS CPU from the llama.cpp that llama-cpp-python
# $PEER_VERSION (default 0.3.36, the project's peer) vendors.
#
#   bench/serve_peer.sh build [--force]   download the sdist (PyPI, pip
#                                         download) and build llama-server into
#                                         build/serve-peer/ (2 cores: ~15 min)
#   bench/serve_peer.sh path              print the binary's path (exit 1 if
#                                         it is not built)
#
# The CPU flags are bench/build_peer.sh's (its --print-args): -DGGML_NATIVE=ON
# on CPUs without AMX; with AMX in /proc/cpuinfo, GGML_NATIVE=OFF, each ISA
# option set from /proc/cpuinfo and AMX off (ggml's AMX path crashed here;
# see that script's comments). Plus: Release, LLAMA_BUILD_SERVER=ON, no web UI
# (LLAMA_BUILD_UI=OFF and LLAMA_USE_PREBUILT_UI=OFF: the build would otherwise
# try npm or a download), no OpenSSL, no tests/examples. Only the llama-server
# target is built. What was built is recorded in build/serve-peer/build.txt.
# A sdist already in .peer/ (bench/gpu_peer_sdist.sh) is used if present.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
V=${PEER_VERSION:-0.3.36}
D=$ROOT/build/serve-peer
BIN=$D/build/bin/llama-server
JOBS=${JOBS:-$(nproc)}

case "${1:-}" in
path)
    [ -x "$BIN" ] || { echo "serve_peer: not built (bench/serve_peer.sh build)" >&2; exit 1; }
    echo "$BIN"
    ;;
build)
    ARGS=$(bash "$ROOT/bench/build_peer.sh" --print-args | sed -n 's/^peer build: CMAKE_ARGS: //p' |
        sed 's/ *-DLLAVA_BUILD=OFF//')
    [ -n "$ARGS" ] || { echo "serve_peer: no CMake arguments from build_peer.sh --print-args" >&2; exit 1; }
    ARGS+=" -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF"
    ARGS+=" -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF"
    if [ "${2:-}" != --force ] && [ -x "$BIN" ] && [ -f "$D/build.txt" ] &&
        [ "$(sed -n 's/^cmake_args: //p' "$D/build.txt")" = "$ARGS" ] &&
        [ "$(sed -n 's/^version: //p' "$D/build.txt")" = "$V" ]; then
        echo "serve_peer: $BIN is built for these flags (--force rebuilds)"
        exit 0
    fi
    mkdir -p "$D"
    SDIST=$(ls "$ROOT"/.peer/llama_cpp_python-"$V".tar.gz 2>/dev/null || true)
    if [ -z "$SDIST" ]; then
        SDIST=$D/llama_cpp_python-$V.tar.gz
        if [ ! -f "$SDIST" ]; then
            # pip reads the sdist's metadata through its build backend
            python3 -m pip install -q scikit-build-core
            python3 -m pip download -q --no-deps --no-build-isolation --no-binary :all: -d "$D" "llama-cpp-python==$V"
        fi
    fi
    rm -rf "$D/src" "$D/build" && mkdir -p "$D/src"
    tar xzf "$SDIST" -C "$D/src"
    L=$D/src/llama_cpp_python-$V/vendor/llama.cpp
    echo "serve_peer: building llama-server from $(basename "$SDIST") with $JOBS jobs; log $D/build.log"
    echo "serve_peer: CMake arguments: $ARGS"
    start=$(date +%s)
    # shellcheck disable=SC2086
    { cmake -S "$L" -B "$D/build" -G Ninja $ARGS && cmake --build "$D/build" -j "$JOBS" --target llama-server; } \
        >"$D/build.log" 2>&1 || { tail -20 "$D/build.log" >&2; exit 1; }
    {
        echo "built_by: bench/serve_peer.sh"
        echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
        echo "version: $V"
        echo "llama_cpp: $("$BIN" --version 2>&1 | grep -m1 version || true)"
        echo "compiler: $( (cc --version 2>/dev/null || true) | head -1)"
        echo "cpu_model: $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
        echo "cmake_args: $ARGS"
    } >"$D/build.txt"
    rm -rf "$D/src"
    echo "serve_peer: built in $(($(date +%s) - start)) s"
    cat "$D/build.txt"
    ;;
*)
    echo "usage: bench/serve_peer.sh build [--force] | path" >&2
    exit 2
    ;;
esac
