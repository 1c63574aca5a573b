#!/usr/bin/env bash
# Sets up, builds and runs every test: the plain build (all labels; gpu tests skip without a GPU),
# an ASan+UBSan build (all but slow/model tests), a TSan build (concurrency tests: the worker pool,
# and the kernels, forward pass and engine on pools of 1, 2, 3 and 7 workers; every parallel path is
# plain pthreads and C11 atomics, so TSan sees all of it), then every libFuzzer target for a bounded
# time (scripts/fuzz.sh: clang build tree build-fuzz, 20 s each, as many at once as there are CPUs).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
./scripts/setup.sh
export FLX_CACHE="${FLX_CACHE:-$HOME/.cache/fluxion}"
jobs=$(nproc)
fail=0

echo "== build: release"
./scripts/build.sh build
(cd build && ctest --output-on-failure -j"$jobs") || fail=1

echo "== build: asan+ubsan"
./scripts/build.sh build-asan -DFLX_SANITIZE=address,undefined -DFLX_BENCH=OFF -DFLX_CUDA=OFF
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
   ctest --output-on-failure -j"$jobs" -LE 'slow|model') || fail=1

echo "== build: tsan (concurrency tests)"
./scripts/build.sh build-tsan -DFLX_SANITIZE=thread -DFLX_BENCH=OFF -DFLX_CUDA=OFF
(cd build-tsan && TSAN_OPTIONS="halt_on_error=1 suppressions=$here/tests/tsan.supp" ctest --output-on-failure -j"$jobs" -L concurrency) || fail=1

echo "== fuzz: every parser of outside bytes, bounded"
./scripts/fuzz.sh || fail=1

if [ "$fail" -ne 0 ]; then echo "test.sh: FAILED"; exit 1; fi
echo "test.sh: all suites passed"
