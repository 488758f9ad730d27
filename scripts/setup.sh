#!/usr/bin/env bash
# Installs everything augur needs to build and test, as root, on a fresh
# Debian machine; idempotent. The one place that installs things.
#
#   scripts/setup.sh             system packages + Python test deps + the default model
#   scripts/setup.sh --test      ... + the models the default test run uses (the default
#                                model, Gemma 3 270M and Qwen2.5 0.5B: their tokenizers,
#                                templates and metadata are tested against references;
#                                nomic-embed-text-v1.5: the embeddings against llama.cpp's)
#   scripts/fetch_models.py embeddinggemma   (or add it to AUGUR_MODELS) EmbeddingGemma-300M, a 1.2 GB
#                                safetensors folder (tests/py/test_embed_gemma.py; not in the
#                                default set: its test embeds 100 sentences with a 300M model)
#   scripts/setup.sh --no-model  skip the model download
#   scripts/setup.sh --webui     ... + Debian's Chromium, Playwright and markdown-it-py for the
#                                chat page's browser test (make test-webui); Playwright drives
#                                the system Chromium, it downloads no browser of its own
#   AUGUR_MODELS="smollm2 gemma3" scripts/setup.sh   choose which models to fetch
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential clang libclang-rt-14-dev pkg-config
  libmicrohttpd-dev libjansson-dev libpcre2-dev libutf8proc-dev libxxhash-dev libcmocka-dev
  python3 python3-pip
)
PY_PACKAGES=(pytest jinja2 gguf numpy openai anthropic openai-agents jsonschema xxhash)

WEBUI_APT_PACKAGES=(chromium fonts-dejavu-core)
WEBUI_PY_PACKAGES=(playwright markdown-it-py)

# apt_install PKG...: installs those not installed yet
apt_install() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

PY=python3
# pip_install "IMPORTS" PKG...: installs the packages unless `import IMPORTS` already works
pip_install() {
  local imports=$1
  shift
  if ! $PY -c "import $imports" 2>/dev/null; then
    echo "setup: installing Python packages $*"
    $PY -m pip install -q --disable-pip-version-check "$@" 2>/dev/null ||
      $PY -m pip install -q --disable-pip-version-check --break-system-packages "$@"
  fi
}

apt_install "${APT_PACKAGES[@]}"
pip_install "pytest, jinja2, gguf, numpy, openai, anthropic, agents, jsonschema, xxhash" "${PY_PACKAGES[@]}"

case "${1:-}" in
  --no-model) ;;
  --webui)
    apt_install "${WEBUI_APT_PACKAGES[@]}"
    pip_install "playwright, markdown_it" "${WEBUI_PY_PACKAGES[@]}"
    $PY scripts/fetch_models.py ${AUGUR_MODELS:-smollm2} ;;
  --test) $PY scripts/fetch_models.py ${AUGUR_MODELS:-smollm2 gemma3 qwen-0.5b nomic-embed} ;;
  *) $PY scripts/fetch_models.py ${AUGUR_MODELS:-smollm2} ;;
esac
echo "setup: done"
