#!/usr/bin/env bash
# libFuzzer runs of the file readers (fuzz/), built with clang + ASan + UBSan in build-fuzz/:
#   bash scripts/fuzz.sh                   # every target for 600 s each
#   bash scripts/fuzz.sh 30                # every target for 30 s (CI)
#   bash scripts/fuzz.sh 600 safetensors   # one target (name without the fuzz_ prefix)
#   EMBER_FUZZ_BUILD_DIR=/tmp/fz bash scripts/fuzz.sh 60
# The seed corpus is fuzz/corpus/<target>/; new inputs go to build-fuzz/corpus/<target>/ (the
# repository's corpus is never written). Crashes, leaks, timeouts and sanitizer reports are
# saved under build-fuzz/crashes/<target>/ and make the script exit non-zero; turn each into a
# regression test in tests/io/test_fuzz_regressions.cpp.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
BUILD=$(realpath -m "${EMBER_FUZZ_BUILD_DIR:-build-fuzz}")
SECONDS_PER_TARGET=${1:-600}
shift || true

# -max_len per target: big enough for a real file of that kind, small enough to stay fast.
declare -A MAX_LEN=([safetensors]=65536 [config_json]=8192 [yaml_config]=4096 [tokenizer]=4096
                    [tsv_dataset]=8192 [text_dataset]=8192 [metrics_jsonl]=8192 [idx]=4096)
if (($# > 0)); then
  targets=("$@")
else
  targets=(safetensors config_json yaml_config tokenizer tsv_dataset text_dataset metrics_jsonl idx)
fi
for t in "${targets[@]}"; do
  [[ -n "${MAX_LEN[$t]:-}" ]] || { echo "fuzz.sh: unknown target '$t' (known: ${!MAX_LEN[*]})" >&2; exit 2; }
done

command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ not found (apt-get install clang)" >&2; exit 2; }
bash scripts/install_deps.sh

# The machine's shared compiler cache, as scripts/test.sh uses (clang objects hash apart).
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ember-ccache}"
export CCACHE_BASEDIR="$ROOT"
export CCACHE_NOHASHDIR=true
CC=clang CXX=clang++ cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DEMBER_FUZZ=ON -DEMBER_CUDA=OFF \
  -DEMBER_BUILD_TESTS=OFF -DEMBER_BUILD_BENCH=OFF -DEMBER_BUILD_EXAMPLES=OFF
cmake --build "$BUILD" -j"$(nproc)" --target "${targets[@]/#/fuzz_}"

export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
status=0
for t in "${targets[@]}"; do
  mkdir -p "$BUILD/corpus/$t" "$BUILD/crashes/$t"
  echo "== fuzz_$t: ${SECONDS_PER_TARGET} s, -max_len=${MAX_LEN[$t]}"
  # TMPDIR: the targets write each input to a temporary file there.
  if ! TMPDIR="$BUILD" "$BUILD/fuzz/fuzz_$t" "$BUILD/corpus/$t" "$ROOT/fuzz/corpus/$t" \
      -max_total_time="$SECONDS_PER_TARGET" -max_len="${MAX_LEN[$t]}" -timeout=10 -rss_limit_mb=2048 \
      -artifact_prefix="$BUILD/crashes/$t/" -print_final_stats=1 2>"$BUILD/fuzz_$t.log"; then
    status=1
    echo "fuzz_$t FAILED: see $BUILD/fuzz_$t.log and $BUILD/crashes/$t/" >&2
    tail -40 "$BUILD/fuzz_$t.log" >&2
  fi
  grep -E '^stat::(number_of_executed_units|average_exec_per_sec|new_units_added)' "$BUILD/fuzz_$t.log" || true
done
exit $status
