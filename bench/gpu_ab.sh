#!/usr/bin/env bash
# A/B speed of the CUDA backend against an earlier version of the tree, both
# built and run in one call on the GPU machine (the device tool copies the
# working tree, not the git history, so the earlier version travels as
# files):
#
#   bench/gpu_ab.sh prepare REF
#       (here, with git) puts the files that differ between REF and the
#       working tree, as REF has them, into .ab-base/ (git-ignored: pass it in
#       the device call's carry), and the paths REF lacks in .ab-base.absent
#   bench/gpu_ab.sh run [-m ARCH:TYPE[:LAYERS]] [-p 4096] [-n 0] [-r 2]
#                       [--rounds 2] [-- "VAR=V ..." ...]
#       (on the GPU machine) builds the working tree (build/cuda) and a copy
#       with .ab-base laid over it (/tmp/ab-base) in parallel, makes the model
#       with bench/gen_model (default llama8b:BF16, Llama-3.1-8B shapes,
#       random weights), then for each round runs `augur bench --device cuda
#       -p P -n N -r R` with the base build, the new build, and the new build
#       under each environment given after --; prints one line per run.
# Build dependencies as scripts/gpu_test.sh finds them (the system's, or the
# .deb files in .gpudeps/).
set -euo pipefail
cd "$(dirname "$0")/.."

prepare() {
  local ref=$1
  rm -rf .ab-base && mkdir -p .ab-base && : > .ab-base.absent
  git diff --name-status --no-renames "$ref" -- . | while IFS=$'\t' read -r st path; do
    case $st in
    A) echo "$path" >> .ab-base.absent ;; # new since REF: the base has no such file
    *) mkdir -p ".ab-base/$(dirname "$path")" && git show "$ref:$path" > ".ab-base/$path" ;;
    esac
  done
  mv .ab-base.absent .ab-base/.absent
  echo "gpu_ab: .ab-base holds $(find .ab-base -type f ! -name .absent | wc -l) file(s) of $ref" \
       "($(git rev-parse --short "$ref")), $(wc -l < .ab-base/.absent) path(s) it lacks"
}

run() {
  local spec=llama8b:BF16 p=4096 n=0 r=2 rounds=2
  while [ $# -gt 0 ]; do
    case $1 in
    -m) spec=$2; shift 2 ;;
    -p) p=$2; shift 2 ;;
    -n) n=$2; shift 2 ;;
    -r) r=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "gpu_ab: unknown option $1"; exit 2 ;;
    esac
  done
  [ -d .ab-base ] || { echo "gpu_ab: no .ab-base (run 'bench/gpu_ab.sh prepare REF' first)"; exit 2; }
  . scripts/gpu_build_env.sh || exit 1
  local base=/tmp/ab-base jobs
  jobs=$(nproc)
  rm -rf $base && mkdir -p $base
  tar --exclude=./build --exclude=./.ab-base --exclude=./.gpudeps --exclude=./.devmodels --exclude=./models -cf - . |
    tar -xf - -C $base
  (cd .ab-base && find . -type f ! -name .absent -print0 | xargs -0 -r cp --parents -t $base)
  while read -r path; do [ -n "$path" ] && rm -f "$base/$path"; done < .ab-base/.absent
  make -j$((jobs / 2 + 1)) CUDA=1 BUILD=build/cuda build/cuda/augur build/cuda/bench/gen_model >/dev/null &
  local p1=$!
  (cd $base && make -j$((jobs / 2 + 1)) CUDA=1 BUILD=build/cuda build/cuda/augur >/dev/null) &
  local p2=$!
  wait $p1 && wait $p2
  echo "gpu_ab: built; $(nvidia-smi --query-gpu=name --format=csv,noheader)"
  local arch type layers m
  IFS=: read -r arch type layers <<< "$spec"
  m=build/cuda/ab-$arch-$type${layers:+-$layers}.gguf
  [ -f "$m" ] || build/cuda/bench/gen_model "$m" "$arch" --type "$type" ${layers:+--layers $layers} >/dev/null
  local i e
  for i in $(seq 1 "$rounds"); do
    echo "round $i: base $($base/build/cuda/augur bench --device cuda -m "$m" -p "$p" -n "$n" -r "$r" 2>/dev/null | grep -E '^(pp|tg)' | tr -s ' \n' ' ')"
    echo "round $i: new  $(build/cuda/augur bench --device cuda -m "$m" -p "$p" -n "$n" -r "$r" 2>/dev/null | grep -E '^(pp|tg)' | tr -s ' \n' ' ')"
    for e in "$@"; do
      echo "round $i: new $e  $(env $e build/cuda/augur bench --device cuda -m "$m" -p "$p" -n "$n" -r "$r" 2>/dev/null | grep -E '^(pp|tg)' | tr -s ' \n' ' ')"
    done
  done
  rm -f "$m"
}

case "${1:-}" in
prepare) [ $# -eq 2 ] || { echo "usage: bench/gpu_ab.sh prepare REF"; exit 2; }; prepare "$2" ;;
run) shift; run "$@" ;;
*) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 2 ;;
esac
