#!/usr/bin/env bash
# The test suite: installs dependencies, configures build/ (Release; tests, benchmarks and
# examples all on, so everything keeps compiling), builds everything and runs every test with
# CTest. Exits non-zero when anything fails to build, when a test fails, or when no tests exist.
# Extra arguments go to ctest, e.g. `bash scripts/test.sh -R elementwise`. CTest writes a JUnit
# report of the run to build/ctest-junit.xml (scripts/check_skips.py reads the skips from it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD

bash scripts/install_deps.sh

# CUDA is optional; let CMake find nvcc in its usual place.
if ! command -v nvcc >/dev/null && [[ -d /usr/local/cuda/bin ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
# One compiler cache per machine, shared by every clone: paths are hashed relative to the
# repository root, so a fresh clone of the same sources compiles from the cache.
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ember-ccache}"
export CCACHE_BASEDIR="$ROOT"
export CCACHE_NOHASHDIR=true
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-4G}"

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DEMBER_BUILD_TESTS=ON -DEMBER_BUILD_BENCH=ON -DEMBER_BUILD_EXAMPLES=ON
cmake --build build -j"$(nproc)"

junit="$ROOT/build/ctest-junit.xml"
rm -f "$junit"  # a failed run leaves no report of an earlier one behind
ctest --test-dir build --output-on-failure -j2 --timeout 300 --no-tests=error --output-junit "$junit" "$@"
