#!/usr/bin/env bash
# Serving benchmark on the GPU machine: `augur serve --device cuda` against
# llama.cpp's llama-server on the same 8B-shaped Q4_K_M file, with the same
# slots, context, requests and client (bench/serve_bench.py; standard library
# only, so nothing to carry).
#
#   bench/gpu_serve.sh [all|augur|llama-server|report]     (default all)
#
# all: augur's runs, llama-server's runs, the tables; expected 6-7 min on an
# H100 (about 2.5 min a server, up to a minute for the model file). Where one
# command must stay shorter, run `augur` and `llama-server` in two calls on
# the same warm machine, then `report` (the data stay in build/cuda/serve/).
#
# Needs: augur built with CUDA (make -j16 CUDA=1 BUILD=build/cuda all
# build/cuda/bench/gen_model) and llama-server built by `bench/gpu_peer.sh
# build` (/tmp/peer-build/bin/llama-server; a build of ~10 min: start it in
# the background in an earlier call; it needs a .peer made by this version of
# bench/gpu_peer_sdist.sh). Makes build/cuda/random/llama8b-q4_k_m.gguf with
# gen_model when it is not there (random weights; speed does not depend on
# them).
#
# Each server (started by serve_bench.py, warmed up, stopped after its runs):
#   --parallel 64: the concurrency sweep 1, 8, 32, 64 with fixed 128/128 and
#     the ShareGPT-shaped lengths; Poisson arrivals at 8 and 32 requests/s
#     (fixed 128/128, 64 requests); and the issue's loads: 1 client 128-token
#     prompt x 128 without streaming (streaming: the sweep's c=1), 64 clients
#     8-token prompts x 128, 64 clients 128 x 128 (the sweep's c=64), 64
#     clients 8-token prompts x 512;
#   --parallel 128: concurrency 128, fixed and ShareGPT-shaped.
# Context 1024 per slot for both (llama-server -c = slots x 1024): 8 + 512 and
# the ShareGPT-shaped pairs do not fit 512. With augur's runs, `augur bench
# -p 0 -n 128 -r 3` at -b 1 and -b 64 on the same file. The report: one table
# of every run, one of augur / llama-server, and the servers' decode against
# augur bench's.
#
# Environment: SERVE_DURATION (default 20: seconds after which a run sends no
# new requests; those in flight finish), SERVE_CTX (1024), SERVE_ARGS (more
# serve_bench.py arguments), SERVE_RUNS64 / SERVE_RUNS128 (the runs at 64 and
# 128 slots, in serve_bench.py's --runs form), SERVE_PEER (llama-server).
# Files, in build/cuda/serve/ and copied to $OUT when it is set:
# gpu_serve_augur.jsonl and gpu_serve_llama-server.jsonl (every run),
# gpu_serve_engine.jsonl (augur bench), gpu_serve_report.md (the tables),
# gpu_serve_SERVER_SLOTS.log (serve_bench.py's output; the servers' own logs
# are in build/serve_bench_logs/).
set -euo pipefail
cd "$(dirname "$0")/.."
WHICH=${1:-all}
case "$WHICH" in all | augur | llama-server | report) ;; *)
  echo "usage: bench/gpu_serve.sh [all|augur|llama-server|report]" >&2
  exit 2
  ;;
esac
BIN=build/cuda/augur
PEER=${SERVE_PEER:-/tmp/peer-build/bin/llama-server}
D=build/cuda/serve
DUR=${SERVE_DURATION:-20}
CTX=${SERVE_CTX:-1024}
R=build/cuda/random
M=$R/llama8b-q4_k_m.gguf
E=$D/gpu_serve_engine.jsonl
RUNS64=${SERVE_RUNS64:-"fixed@c1 fixed@c8 fixed@c32 fixed@c64 sharegpt@c1 sharegpt@c8 sharegpt@c32 sharegpt@c64
  fixed@r8 fixed@r32 fixed:128:128@c1/nostream fixed:8:128@c64 fixed:8:512@c64"}
RUNS128=${SERVE_RUNS128:-"fixed@c128 sharegpt@c128"}
export PYTHONUNBUFFERED=1
mkdir -p $R $D
t0=$(date +%s)

serve() { # NAME=BINARY: every run of one server
  local s=$1 name=${1%%=*} p runs log
  local j=$D/gpu_serve_$name.jsonl
  : >"$j"
  for p in 64 128; do
    runs=$RUNS64
    [ $p = 128 ] && runs=$RUNS128
    log=$D/gpu_serve_${name}_$p.log
    python3 bench/serve_bench.py -m "$M" --device cuda --ctx "$CTX" --duration "$DUR" --jsonl "$j" \
      ${SERVE_ARGS:-} --server "$s" --parallel $p --runs "$runs" >"$log" 2>&1 ||
      { echo "gpu_serve: $name at $p slots failed:"; tail -5 "$log"; }
    grep '^warning' "$log" || true
    echo "gpu_serve: $name at $p slots done after $(($(date +%s) - t0)) s"
  done
}

if [ "$WHICH" != report ]; then
  [ -x $BIN ] && [ -x build/cuda/bench/gen_model ] ||
    { echo "gpu_serve: build augur first (make -j16 CUDA=1 BUILD=build/cuda all build/cuda/bench/gen_model)"; exit 1; }
  [ -f $M ] || build/cuda/bench/gen_model $M llama8b --type Q4_K_M
  echo "gpu_serve: model ready after $(($(date +%s) - t0)) s"
fi
if [ "$WHICH" = all ] || [ "$WHICH" = augur ]; then
  # the engine alone on the same file: the servers' batch-1 decode and their
  # 64-client aggregate are compared with these
  : >"$E"
  for b in 1 64; do
    $BIN bench --device cuda -m $M -p 0 -n 128 -b $b -r 3 --json 2>/dev/null | tail -1 | tee -a "$E" ||
      echo "gpu_serve: augur bench -b $b failed"
  done
  serve augur=$BIN
fi
if [ "$WHICH" = all ] || [ "$WHICH" = llama-server ]; then
  [ -x "$PEER" ] || { echo "gpu_serve: no $PEER (bench/gpu_peer.sh build, then wait)"; exit 1; }
  serve llama-server="$PEER"
fi

if [ "$WHICH" = all ] || [ "$WHICH" = report ]; then
  files=$(ls $D/gpu_serve_augur.jsonl $D/gpu_serve_llama-server.jsonl 2>/dev/null || true)
  [ -n "$files" ] || { echo "gpu_serve: no runs in $D"; exit 1; }
  echo
  {
    echo "== every run ($M, $CTX tokens per slot)"
    # shellcheck disable=SC2086
    python3 bench/serve_bench.py --report $files --markdown
    python3 - "$E" $files <<'PY'
import json, os, sys
eng = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")] if os.path.exists(sys.argv[1]) else []
runs = [json.loads(l) for f in sys.argv[2:] for l in open(f) if l.startswith("{")]
def find(server, load):
    return next((r for r in runs if r["server"] == server and r["dataset"] == "fixed 128/128" and r["load"] == load
                 and r["stream"]), None)
b1 = next((e for e in eng if e.get("batch") == 1), None)
b64 = next((e for e in eng if e.get("batch") == 64), None)
print("\n== the servers against the engine (augur bench -p 0 -n 128 -r 3 on the same file)")
for server in ("augur", "llama-server"):
    r1, r64 = find(server, "c=1"), find(server, "c=64")
    if r1 and b1 and r1.get("p50_tpot_ms"):
        rate = 1000 / r1["p50_tpot_ms"]
        print(f"{server}: 1 client decodes {rate:.1f} tok/s (1000 / TPOT p50); augur bench -b 1: "
              f"{b1['tg_tok_s']:.1f} tok/s; ratio {rate / b1['tg_tok_s']:.3f}")
    if r64 and b64:
        print(f"{server}: 64 clients, {r64['output_throughput']:.1f} output tok/s (their prefill included); augur "
              f"bench -b 64: {b64['tg_tok_s']:.1f} tok/s; ratio {r64['output_throughput'] / b64['tg_tok_s']:.3f}")
PY
  } | tee $D/gpu_serve_report.md
fi
if [ -n "${OUT:-}" ]; then
  cp $D/gpu_serve_*.jsonl $D/gpu_serve_report.md "$OUT"/ 2>/dev/null || true  # 4 files: $OUT takes 8
fi
echo "gpu_serve: done after $(($(date +%s) - t0)) s"
