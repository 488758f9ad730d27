#!/usr/bin/env bash
# Downloads (does not install) the .deb files of augur's build dependencies
# into .gpudeps/, for a GPU machine that has nvcc but no package registry:
# scripts/gpu_test.sh and bench/gpu_bench.sh unpack them there. Run where apt works.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpudeps && cd .gpudeps
apt-get download libjansson-dev libjansson4 libmicrohttpd-dev libmicrohttpd12 libpcre2-dev libpcre2-8-0 \
  libutf8proc-dev libutf8proc2 libxxhash-dev libxxhash0 libcmocka-dev libcmocka0 \
  libgnutls30 libnettle8 libhogweed6 libp11-kit0 libtasn1-6 libidn2-0 libunistring2 libgmp10 libffi8
ls
