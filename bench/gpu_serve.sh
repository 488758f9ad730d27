#!/usr/bin/env bash
# Serving benchmark on the GPU machine: `augur serve --device cuda` against
# llama.cpp's llama-server on the same 8B-shaped Q4_K_M file, with the same
# slots, context, requests and client (bench/serve_bench.py; standard library
# only, so nothing to carry).
#
#   bench/gpu_serve.sh            (after the builds below; expected 5-6 min:
#                                 about 2 min a server, plus the model file)
#
# Needs: augur built with CUDA (make -j16 CUDA=1 BUILD=build/cuda all
# build/cuda/bench/gen_model) and llama-server built by `bench/gpu_peer.sh
# build` (/tmp/peer-build/bin/llama-server; its build is ~10 min: start it in
# the background in an earlier call). Makes build/cuda/random/llama8b-q4_k_m.gguf
# with gen_model when it is not there (random weights; speed does not depend
# on them).
#
# For each server in turn (augur, then llama-server; each started by
# serve_bench.py, warmed up, stopped after its runs):
#   --parallel 64: the concurrency sweep 1, 8, 32, 64 with fixed 128/128 and
#     the ShareGPT-shaped lengths, Poisson arrivals at 4 and 16 requests/s
#     (fixed 128/128), and the issue's loads: 1 client 128-token prompt x 128
#     without streaming (streaming is the sweep's c=1), 64 clients 8-token
#     prompts x 128, 64 clients 128 x 128 (the sweep's c=64), 64 clients
#     8-token prompts x 512;
#   --parallel 128: concurrency 128, fixed and ShareGPT-shaped.
# Context 1024 per slot for both (llama-server -c = slots x 1024): 8 + 512 and
# the ShareGPT-shaped pairs do not fit 512. Then `augur bench -p 0 -n 128`
# at -b 1 and -b 64 on the same file, one table of every figure (medians), one
# of augur / llama-server, and the server's decode against the engine's.
#
# Environment: SERVE_DURATION (default 20: seconds after which a run sends no
# new requests; those in flight finish), SERVE_CTX (1024), SERVE_ARGS (more
# serve_bench.py arguments), SERVE_RUNS64 / SERVE_RUNS128 (the runs at 64
# and 128 slots, in serve_bench.py's --runs form), SERVE_PEER (llama-server). JSON lines go to $OUT (when set, else build/cuda):
# gpu_serve.jsonl (every run), gpu_serve_engine.jsonl (augur bench),
# gpu_serve_report.md (the tables), gpu_serve_SERVER_SLOTS.log (each
# serve_bench.py run's output; the servers' own logs are in
# build/serve_bench_logs/).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/cuda/augur
PEER=${SERVE_PEER:-/tmp/peer-build/bin/llama-server}
OUTDIR=${OUT:-build/cuda}
DUR=${SERVE_DURATION:-20}
CTX=${SERVE_CTX:-1024}
R=build/cuda/random
M=$R/llama8b-q4_k_m.gguf
[ -x $BIN ] && [ -x build/cuda/bench/gen_model ] ||
  { echo "gpu_serve: build augur first (make -j16 CUDA=1 BUILD=build/cuda all build/cuda/bench/gen_model)"; exit 1; }
[ -x $PEER ] || { echo "gpu_serve: no $PEER (bench/gpu_peer.sh build, then wait)"; exit 1; }
mkdir -p $R "$OUTDIR"
t0=$(date +%s)
[ -f $M ] || build/cuda/bench/gen_model $M llama8b --type Q4_K_M
echo "gpu_serve: model ready after $(($(date +%s) - t0)) s"
J=$OUTDIR/gpu_serve.jsonl
E=$OUTDIR/gpu_serve_engine.jsonl
: >"$J"
: >"$E"

SB=(python3 bench/serve_bench.py -m "$M" --device cuda --ctx "$CTX" --duration "$DUR" --jsonl "$J" ${SERVE_ARGS:-})
RUNS64=${SERVE_RUNS64:-"fixed@c1 fixed@c8 fixed@c32 fixed@c64 sharegpt@c1 sharegpt@c8 sharegpt@c32 sharegpt@c64
  fixed@r4 fixed@r16 fixed:128:128@c1/nostream fixed:8:128@c64 fixed:8:512@c64"}
RUNS128=${SERVE_RUNS128:-"fixed@c128 sharegpt@c128"}
export PYTHONUNBUFFERED=1
# the engine alone on the same file: the server's batch-1 decode and its
# 64-client aggregate are compared with these
for b in 1 64; do
  $BIN bench --device cuda -m $M -p 0 -n 128 -b $b -r 3 --json 2>/dev/null | tail -1 | tee -a "$E" ||
    echo "gpu_serve: augur bench -b $b failed"
done
for s in augur=$BIN llama-server=$PEER; do
  for p in 64 128; do
    runs=$RUNS64
    [ $p = 128 ] && runs=$RUNS128
    log=$OUTDIR/gpu_serve_${s%%=*}_$p.log
    "${SB[@]}" --server "$s" --parallel $p --runs "$runs" >"$log" 2>&1 ||
      { echo "gpu_serve: ${s%%=*} at $p slots failed:"; tail -5 "$log"; }
    grep '^warning' "$log" || true
    echo "gpu_serve: ${s%%=*} at $p slots done after $(($(date +%s) - t0)) s"
  done
done

echo
{
  echo "== every run (medians; $M, ctx $CTX per slot)"
  python3 bench/serve_bench.py --report "$J" --markdown
  python3 - "$J" "$E" <<'PY'
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
eng = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")]
def find(server, dataset, load, stream=True):
    for r in runs:
        if r["server"] == server and r["dataset"] == dataset and r["load"] == load and r["stream"] == stream:
            return r
b1 = next((e for e in eng if e.get("batch") == 1), None)
b64 = next((e for e in eng if e.get("batch") == 64), None)
print("\n== server / engine (augur bench -p 0 -n 128 -r 3 on the same file)")
for server in ("augur", "llama-server"):
    r1 = find(server, "fixed 128/128", "c=1")
    r64 = find(server, "fixed 128/128", "c=64")
    if r1 and b1 and r1.get("p50_tpot_ms"):
        rate = 1000 / r1["p50_tpot_ms"]
        print(f"{server}: 1 client decodes {rate:.1f} tok/s (1000 / TPOT p50); augur bench -b 1: "
              f"{b1['tg_tok_s']:.1f}; ratio {rate / b1['tg_tok_s']:.3f}")
    if r64 and b64:
        print(f"{server}: 64 clients {r64['output_throughput']:.1f} output tok/s (prefill included); augur bench "
              f"-b 64: {b64['tg_tok_s']:.1f}; ratio {r64['output_throughput'] / b64['tg_tok_s']:.3f}")
PY
} | tee "$OUTDIR/gpu_serve_report.md"
echo "gpu_serve: done after $(($(date +%s) - t0)) s"
