# Sourced (not run) by the GPU machine's scripts (scripts/gpu_test.sh,
# bench/gemv_check.sh, bench/gpu_ab.sh) from the repository root: where the
# system lacks augur's build dependencies (that machine has no package
# registry), unpacks the .deb files scripts/gpu_deps.sh saved in .gpudeps/
# into build/deps and points CFLAGS and LDLIBS at them. Returns 1, after a
# message, when they are missing and there is no .gpudeps/.
if ! echo '#include <jansson.h>' | cc -E -x c - >/dev/null 2>&1; then
  if [ ! -d .gpudeps ]; then
    echo "jansson & co. are missing and there is no .gpudeps/ (run scripts/gpu_deps.sh where apt works)" >&2
    return 1
  fi
  mkdir -p "$PWD/build/deps"
  for f in .gpudeps/*.deb; do dpkg -x "$f" "$PWD/build/deps"; done
  export CFLAGS="-I$PWD/build/deps/usr/include" \
    LDLIBS="-L$PWD/build/deps/usr/lib/x86_64-linux-gnu -Wl,-rpath,$PWD/build/deps/usr/lib/x86_64-linux-gnu"
fi
