#!/usr/bin/env bash
# Build and install the benchmark peer, llama-cpp-python, for THIS CPU.
#
#   bench/build_peer.sh [--force] [--print-args]     (or: make bench-peer)
#
# Why: the PyPI package is an sdist that compiles llama.cpp at install time,
# and the two obvious ways to build it both break on some of our machines:
#   - flags copied from another machine (e.g. -DGGML_AVX512_BF16=ON) give a
#     library that dies with SIGILL on CPUs without those instructions;
#   - the default native build (-march=native) compiles ggml's AMX path on
#     CPUs with AMX, and that path crashes (SIGSEGV in ggml_backend_amx_mul_mat
#     in an OpenMP worker, seen 2026-12-02).
# So the CMake arguments are derived from /proc/cpuinfo here:
#   - no AMX flag in /proc/cpuinfo: -DGGML_NATIVE=ON (everything the CPU has);
#   - AMX present: -DGGML_NATIVE=OFF and each ISA option set from /proc/cpuinfo,
#     AMX off. (The -DGGML_AMX_*=OFF options alone do not help: with
#     GGML_NATIVE=ON ggml's x86 CMake code only adds -march=native and ignores
#     every GGML_AVX*/GGML_AMX_* option, and -march=native defines __AMX_INT8__,
#     which is what compiles the AMX path in. Checked in llama.cpp as vendored
#     by llama-cpp-python 0.3.36, ggml/src/ggml-cpu/CMakeLists.txt.)
#   - always -DLLAVA_BUILD=OFF: the multimodal library is not needed by any
#     benchmark and roughly doubles the build time.
#
# Installs into the normal site-packages of $PYTHON (default python3):
# llama-cpp-python $PEER_VERSION (default 0.3.36; if that is not on the index
# or does not build, the newest versions are tried), from the sdist, with
# pip --no-cache-dir --force-reinstall --no-deps --no-build-isolation; the
# build tools (scikit-build-core, cmake, ninja) and the runtime dependencies
# come from PyPI first. The build log goes to build/peer-build.log.
#
# Records what was built in build/peer-build.txt (printed by the benchmarks)
# and, identically, in the installed package (llama_cpp/augur-peer-build.txt).
# A later run does nothing when the installed llama_cpp carries a record by
# this script with the same version, CPU flags and CMake arguments and still
# imports; --force rebuilds anyway. --print-args prints the CMake arguments for
# this CPU and stops (CPUINFO=FILE reads another machine's /proc/cpuinfo).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python3}
WANT=${PEER_VERSION:-0.3.36}
JOBS=${JOBS:-$(nproc)}
CPUINFO=${CPUINFO:-/proc/cpuinfo}
FORCE=0
PRINT=0
for a in "$@"; do
    case "$a" in
    --force) FORCE=1 ;;
    --print-args) PRINT=1 ;;
    -h | --help) sed -n '2,36p' "$0"; exit 0 ;;
    *) echo "build_peer.sh: unknown argument '$a' (usage: bench/build_peer.sh [--force] [--print-args])" >&2; exit 2 ;;
    esac
done
mkdir -p "$ROOT/build"
RECORD=$ROOT/build/peer-build.txt
LOG=$ROOT/build/peer-build.log

# ---- the CPU ---------------------------------------------------------------
CPU_MODEL=$(grep -m1 '^model name' "$CPUINFO" | cut -d: -f2- | sed 's/^ *//' || true)
FLAGS=" $(grep -m1 "^flags" "$CPUINFO" | cut -d: -f2- || true) "
has() { [[ "$FLAGS" == *" $1 "* ]]; }
ISA=()
for f in sse4_2 avx avx2 fma f16c bmi2 avx_vnni avx512f avx512cd avx512dq avx512bw avx512vl avx512vbmi \
         avx512_vnni avx512_bf16 amx_tile amx_int8 amx_bf16; do
    has "$f" && ISA+=("$f")
done
CPU_ISA=${ISA[*]:-none}

onoff() { if has "$1"; then echo ON; else echo OFF; fi; }
if has amx_tile || has amx_int8 || has amx_bf16; then
    AVX512=OFF
    if has avx512f && has avx512cd && has avx512vl && has avx512dq && has avx512bw; then AVX512=ON; fi
    sub() { if [ "$AVX512" = ON ]; then onoff "$1"; else echo OFF; fi; }
    CMAKE_ARGS_PEER="-DGGML_NATIVE=OFF -DGGML_SSE42=$(onoff sse4_2) -DGGML_AVX=$(onoff avx) -DGGML_AVX2=$(onoff avx2)"
    CMAKE_ARGS_PEER+=" -DGGML_FMA=$(onoff fma) -DGGML_F16C=$(onoff f16c) -DGGML_BMI2=$(onoff bmi2)"
    CMAKE_ARGS_PEER+=" -DGGML_AVX_VNNI=$(onoff avx_vnni) -DGGML_AVX512=$AVX512 -DGGML_AVX512_VBMI=$(sub avx512vbmi)"
    CMAKE_ARGS_PEER+=" -DGGML_AVX512_VNNI=$(sub avx512_vnni) -DGGML_AVX512_BF16=$(sub avx512_bf16)"
    CMAKE_ARGS_PEER+=" -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
else
    CMAKE_ARGS_PEER="-DGGML_NATIVE=ON"
fi
CMAKE_ARGS_PEER+=" -DLLAVA_BUILD=OFF"

echo "peer build: CPU: ${CPU_MODEL:-unknown}"
echo "peer build: ISA: $CPU_ISA"
echo "peer build: CMAKE_ARGS: $CMAKE_ARGS_PEER"
[ "$PRINT" = 1 ] && exit 0

# ---- up to date? -------------------------------------------------------------
pkg_dir() {  # the installed llama_cpp package directory, without importing it
    "$PY" - <<'EOF' 2>/dev/null || true
import importlib.util, os
s = importlib.util.find_spec("llama_cpp")
print(os.path.dirname(s.origin) if s and s.origin else "")
EOF
}
field() { sed -n "s/^$1: //p" "$2" | head -1; }
DIR=$(pkg_dir)
if [ "$FORCE" = 0 ] && [ -n "$DIR" ] && [ -f "$DIR/augur-peer-build.txt" ]; then
    S=$DIR/augur-peer-build.txt
    V=$(field version "$S")
    if [ "$(field built_by "$S")" = "bench/build_peer.sh" ] && [ "$(field cpu_isa "$S")" = "$CPU_ISA" ] &&
       [ "$(field cmake_args "$S")" = "$CMAKE_ARGS_PEER" ] && { [ -z "${PEER_VERSION:-}" ] || [ "$V" = "$WANT" ]; } &&
       "$PY" -c 'import llama_cpp' >/dev/null 2>&1; then
        cp "$S" "$RECORD"
        echo "peer build: llama-cpp-python $V in $DIR was built by this script for these CPU flags; nothing to do (--force rebuilds)"
        exit 0
    fi
    echo "peer build: the installed llama_cpp ($DIR) was built for something else; rebuilding"
fi

# ---- build tools and runtime dependencies (PyPI) ----------------------------
echo "peer build: installing the build tools and runtime dependencies"
"$PY" -m pip install --no-cache-dir -q "scikit-build-core[pyproject]>=0.9.2" cmake ninja \
    "typing-extensions>=4.5.0" "numpy>=1.20.0" "diskcache>=5.6.1" "jinja2>=2.11.3"

# ---- which version -------------------------------------------------------------
AVAILABLE=$("$PY" -m pip index versions llama-cpp-python 2>/dev/null | sed -n 's/^Available versions: //p' | tr -d ',' || true)
CANDIDATES=()
if [ -z "$AVAILABLE" ]; then
    CANDIDATES=("$WANT")  # the index did not answer: just try the wanted one
else
    [[ " $AVAILABLE " == *" $WANT "* ]] && CANDIDATES+=("$WANT") ||
        echo "peer build: llama-cpp-python $WANT is not on the index; trying the newest versions"
    for v in $AVAILABLE; do  # newest first
        [ "$v" = "$WANT" ] && continue
        [ ${#CANDIDATES[@]} -ge 3 ] && break
        CANDIDATES+=("$v")
    done
fi

# ---- build + install -------------------------------------------------------------
: >"$LOG"
BUILT=""
for v in "${CANDIDATES[@]}"; do
    echo "peer build: building llama-cpp-python $v from the sdist with $JOBS jobs (several minutes; log: $LOG)"
    start=$(date +%s)
    if CMAKE_ARGS="$CMAKE_ARGS_PEER" FORCE_CMAKE=1 CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" \
        "$PY" -m pip install -v --no-cache-dir --force-reinstall --no-deps --no-build-isolation \
        --no-binary llama-cpp-python "llama-cpp-python==$v" >>"$LOG" 2>&1; then
        echo "peer build: built $v in $(( $(date +%s) - start )) s"
        BUILT=$v
        break
    fi
    echo "peer build: llama-cpp-python $v failed to build (tail of $LOG):" >&2
    tail -n 15 "$LOG" >&2
done
[ -n "$BUILT" ] || { echo "peer build: no version built; see $LOG" >&2; exit 1; }

# ---- check it in a separate process (a SIGILL must not take this script down) ----
set +e
SYSINFO=$("$PY" -c 'import llama_cpp; print(llama_cpp.__version__); print(llama_cpp.llama_print_system_info().decode().strip())' 2>&1)
rc=$?
set -e
if [ $rc -ne 0 ]; then
    echo "peer build: the new llama_cpp does not import (exit status $rc):" >&2
    echo "$SYSINFO" >&2
    exit 1
fi
VERSION=$(echo "$SYSINFO" | head -1)
SYSINFO=$(echo "$SYSINFO" | sed -n '2,$p' | tr '\n' ' ')
if [[ "$SYSINFO" == *"AMX_INT8 = 1"* ]]; then
    echo "peer build: warning: llama.cpp reports AMX_INT8 = 1 although it was built without AMX" >&2
fi
DIR=$(pkg_dir)
CC_VERSION=$( (cc --version 2>/dev/null || true) | head -1)
{
    echo "built_by: bench/build_peer.sh"
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "version: $VERSION"
    echo "python: $("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
    echo "compiler: $CC_VERSION"
    echo "cpu_model: ${CPU_MODEL:-unknown}"
    echo "cpu_isa: $CPU_ISA"
    echo "cmake_args: $CMAKE_ARGS_PEER"
    echo "system_info: $SYSINFO"
} >"$RECORD"
cp "$RECORD" "$DIR/augur-peer-build.txt"
echo "peer build: installed llama-cpp-python $VERSION into $DIR"
cat "$RECORD"
