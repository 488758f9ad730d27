#!/usr/bin/env bash
# Installs everything augur needs to build and test, as root, on a fresh
# Debian machine; idempotent. The one place that installs things.
#
#   scripts/setup.sh             system packages + Python test deps + the default model
#   scripts/setup.sh --test      ... + the models the default test run uses (the default
#                                model, Gemma 3 270M and Qwen2.5 0.5B: their tokenizers,
#                                templates and metadata are tested against references)
#   scripts/setup.sh --no-model  skip the model download
#   AUGUR_MODELS="smollm2 gemma3" scripts/setup.sh   choose which models to fetch
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential clang libclang-rt-14-dev pkg-config
  libmicrohttpd-dev libjansson-dev libpcre2-dev libutf8proc-dev libxxhash-dev libcmocka-dev
  python3 python3-pip
)
PY_PACKAGES=(pytest jinja2 gguf numpy openai jsonschema)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=python3
if ! $PY -c "import pytest, jinja2, gguf, numpy, openai, jsonschema" 2>/dev/null; then
  echo "setup: installing Python packages ${PY_PACKAGES[*]}"
  $PY -m pip install -q --disable-pip-version-check "${PY_PACKAGES[@]}" 2>/dev/null ||
    $PY -m pip install -q --disable-pip-version-check --break-system-packages "${PY_PACKAGES[@]}"
fi

case "${1:-}" in
  --no-model) ;;
  --test) $PY scripts/fetch_models.py ${AUGUR_MODELS:-smollm2 gemma3 qwen-0.5b} ;;
  *) $PY scripts/fetch_models.py ${AUGUR_MODELS:-smollm2} ;;
esac
echo "setup: done"
