#!/usr/bin/env bash
# The main job: installs dependencies, configures and builds build/ (Release, Ninja, ccache)
# and runs the main program. Extra arguments go to that program:
#   bash scripts/main.sh --steps 3000 --threads 2
# A second run reuses build/ and only rebuilds what changed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD

MAIN_TARGET=mlp_spirals
MAIN_BINARY=build/examples/mlp_spirals

bash scripts/install_deps.sh

# CUDA is optional; let CMake find nvcc in its usual place.
if ! command -v nvcc >/dev/null && [[ -d /usr/local/cuda/bin ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
# The compiler cache lives inside the build folder, so any clone keeps its own warm cache.
export CCACHE_DIR="${CCACHE_DIR:-$ROOT/build/.ccache}"

# Same options as scripts/test.sh, so switching between the two never reconfigures.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DEMBER_BUILD_TESTS=ON -DEMBER_BUILD_BENCH=ON -DEMBER_BUILD_EXAMPLES=ON
cmake --build build -j"$(nproc)" --target "$MAIN_TARGET"

exec "./$MAIN_BINARY" "$@"
