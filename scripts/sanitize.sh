#!/usr/bin/env bash
# The whole test suite under AddressSanitizer + UndefinedBehaviorSanitizer, in build-asan/:
#   bash scripts/sanitize.sh            # every test
#   bash scripts/sanitize.sh matmul     # only tests whose name matches (a ctest -R regex)
#   EMBER_ASAN_BUILD_DIR=/tmp/asan bash scripts/sanitize.sh   # build somewhere else
# Any leak, memory error or undefined behaviour fails the test that triggered it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD=$(realpath -m "${EMBER_ASAN_BUILD_DIR:-build-asan}")

bash scripts/install_deps.sh

export CCACHE_DIR="${CCACHE_DIR:-$BUILD/.ccache}"
# Also in effect while building: test discovery runs the instrumented test binaries.
# allocator_may_return_null: a huge request returns null as glibc's would (Ember turns that
# into an "out of memory" ember::Error, which a test checks) instead of aborting the process.
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DEMBER_SANITIZE=address,undefined -DEMBER_CUDA=OFF \
  -DEMBER_BUILD_TESTS=ON -DEMBER_BUILD_BENCH=OFF -DEMBER_BUILD_EXAMPLES=OFF
cmake --build "$BUILD" -j"$(nproc)"

filter=()
if (($# > 0)); then
  filter=(-R "$1")
fi
ctest --test-dir "$BUILD" --output-on-failure -j2 --timeout 900 --no-tests=error "${filter[@]}"
