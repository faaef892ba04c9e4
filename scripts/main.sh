#!/usr/bin/env bash
# The main job: installs dependencies, configures and builds build/ (Release, Ninja, ccache)
# and runs the main job: pretrain a BERT-mini with masked-LM on the shipped English text,
# fine-tune it on SST-2 and report dev accuracy. Extra arguments go to the program:
#   bash scripts/main.sh --epochs 5 --pretrain-steps 2000     (see --help)
# A second run reuses build/ and only rebuilds what changed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD

MAIN_TARGETS=(bert_sst2 ember_cli)  # the job, and `ember plot` to draw its run
MAIN_BINARY=build/examples/bert_sst2

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

# Same options as scripts/test.sh, so switching between the two never reconfigures.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DEMBER_BUILD_TESTS=ON -DEMBER_BUILD_BENCH=ON -DEMBER_BUILD_EXAMPLES=ON
cmake --build build -j"$(nproc)" --target "${MAIN_TARGETS[@]}"

exec "./$MAIN_BINARY" "$@"
