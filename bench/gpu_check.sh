#!/usr/bin/env bash
# The one-call device check: on a machine with a GPU and the CUDA 13 toolkit, builds what it
# needs, runs the CUDA tests, the kernel and GEMM benchmarks and a BERT-base training benchmark
# (and the same model in PyTorch where it is installed), and prints one summary table.
#
#   bash bench/gpu_check.sh [--out DIR] [--quick] [--skip-tests] [--skip-peer] [--fetched-deps]
#
# Ember's Debian build dependencies are used from the system when CMake finds them; otherwise
# the packages fetched beforehand by bench/fetch_gpu_deps.sh into .gpudeps/ (or $EMBER_GPU_DEPS)
# are unpacked into a private prefix, so a machine without network or apt works too
# (--fetched-deps uses them even where the system has its own).
# Everything it prints is also kept under DIR (default build-gpu/check): summary.md, the logs,
# and the CSV of each benchmark.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
OUT_DIR="$ROOT/build-gpu/check"
QUICK=0
RUN_TESTS=1
RUN_PEER=1
FETCHED_DEPS=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) OUT_DIR="$2"; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --skip-tests) RUN_TESTS=0; shift ;;
    --skip-peer) RUN_PEER=0; shift ;;
    --fetched-deps) FETCHED_DEPS=1; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown option $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
SUMMARY="$OUT_DIR/summary.md"
START=$(date +%s)
elapsed() { echo $(( $(date +%s) - START ))s; }
say() { echo "[gpu_check $(elapsed)] $*"; }

# ---- the machine
export PATH="/usr/local/cuda/bin:$PATH"
command -v nvcc >/dev/null || { echo "gpu_check: nvcc not found (the CUDA toolkit is needed)" >&2; exit 1; }
GPU="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
[[ -n "$GPU" ]] || GPU="no GPU visible to nvidia-smi"
say "GPU: $GPU; $(nvcc --version | grep -o 'release [0-9.]*'); $(nproc) cores"

# ---- dependencies: the system's, else the fetched Debian packages in a private prefix
CMAKE_ARGS=()
have_system_deps() {
  [[ -f /usr/include/eigen3/Eigen/Core && -d /usr/include/oneapi/dnnl && -f /usr/include/gloo/config.h &&
     -f /usr/include/yaml-cpp/yaml.h && -f /usr/include/nlohmann/json.hpp && -f /usr/include/gtest/gtest.h &&
     -f /usr/include/benchmark/benchmark.h ]]
}
if [[ $FETCHED_DEPS == 0 ]] && have_system_deps; then
  say "build dependencies: the system's"
else
  DEBS="${EMBER_GPU_DEPS:-$ROOT/.gpudeps}"
  ls "$DEBS"/*.deb >/dev/null 2>&1 || {
    echo "gpu_check: Ember's build dependencies are missing and $DEBS holds no .deb files;" \
         "run bench/fetch_gpu_deps.sh on a Debian 12 machine and bring the folder along" >&2
    exit 1
  }
  PREFIX="$ROOT/build-gpu/deps"
  rm -rf "$PREFIX" && mkdir -p "$PREFIX"
  for deb in "$DEBS"/*.deb; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$deb" "$PREFIX"
    else  # a .deb is an ar archive holding data.tar.*
      tmp="$(mktemp -d)" && (cd "$tmp" && ar x "$deb" && tar -xf data.tar.* -C "$PREFIX") && rm -rf "$tmp"
    fi
  done
  # Two CMake packages name absolute /usr paths; point them into the prefix.
  find "$PREFIX" -path '*cmake*' \( -name 'Gloo*.cmake' -o -name 'Hiredis*.cmake' \) \
    -exec sed -i "s#\"/usr/#\"$PREFIX/usr/#g" {} +
  # zlib's development link is absolute: aim it at the system's runtime library.
  libz="$(ldconfig -p 2>/dev/null | awk '/libz\.so\.1 .*x86-64/ {print $NF; exit}')"
  [[ -n "$libz" ]] && ln -sf "$libz" "$PREFIX/usr/lib/x86_64-linux-gnu/libz.so"
  LIBDIRS="$PREFIX/usr/lib/x86_64-linux-gnu:$PREFIX/usr/lib:$PREFIX/lib/x86_64-linux-gnu"
  export LD_LIBRARY_PATH="$LIBDIRS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LIBRARY_PATH="$LIBDIRS${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export CPATH="$PREFIX/usr/include${CPATH:+:$CPATH}"
  CMAKE_ARGS+=("-DCMAKE_PREFIX_PATH=$PREFIX/usr;$PREFIX/usr/share/eigen3/cmake;$PREFIX/usr/share/cmake"
               "-DCMAKE_BUILD_RPATH=${LIBDIRS//:/;}")
  say "build dependencies: $(ls "$DEBS"/*.deb | wc -l) Debian packages unpacked into $PREFIX"
fi
# NCCL: the toolkit's, else the one PyTorch's wheels carry.
if ! ls /usr/local/cuda/lib64/libnccl.so* >/dev/null 2>&1 && ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so'; then
  NCCL_DIR="$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null ||
              python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)"
  NCCL_LIB="$(ls "$NCCL_DIR"/lib/libnccl.so* 2>/dev/null | head -1)"
  if [[ -n "$NCCL_LIB" ]]; then
    CMAKE_ARGS+=("-DEMBER_NCCL_LIBRARY=$NCCL_LIB" "-DEMBER_NCCL_INCLUDE=$NCCL_DIR/include")
    export LD_LIBRARY_PATH="$NCCL_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    say "NCCL: $NCCL_LIB"
  fi
fi

# ---- build (only what the check runs)
BUILD="$ROOT/build-gpu/build"
say "configuring $BUILD"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEMBER_BUILD_TESTS=ON -DEMBER_BUILD_BENCH=ON \
  -DEMBER_BUILD_EXAMPLES=OFF -DCMAKE_CUDA_ARCHITECTURES=90 "${CMAKE_ARGS[@]}" > "$OUT_DIR/configure.log" 2>&1 ||
  { tail -30 "$OUT_DIR/configure.log"; echo "gpu_check: configure failed" >&2; exit 1; }
CUDA_TESTS=()
for f in tests/cuda/test_*.cpp; do CUDA_TESTS+=("$(basename "$f" .cpp)"); done
TARGETS=(ember bert_train bench_cuda_gemm bench_cuda_ops)
[[ $RUN_TESTS == 1 ]] && TARGETS+=("${CUDA_TESTS[@]}")
say "building ${#TARGETS[@]} targets"
cmake --build "$BUILD" -j"$(nproc)" --target "${TARGETS[@]}" > "$OUT_DIR/build.log" 2>&1 ||
  { grep -E 'error|Error' "$OUT_DIR/build.log" | head -40; echo "gpu_check: build failed" >&2; exit 1; }
say "built"

# ---- tests
TEST_ROWS=()
if [[ $RUN_TESTS == 1 ]]; then
  for t in "${CUDA_TESTS[@]}"; do
    log="$OUT_DIR/$t.log"
    timeout 300 "$BUILD/tests/$t" --gtest_brief=1 > "$log" 2>&1
    rc=$?
    passed=$(grep -c '^\[       OK \]' "$log" || true)
    total=$(grep -o '^\[==========\] [0-9]* tests' "$log" | grep -o '[0-9]*' | head -1)
    failed=$(grep -E '^\[  FAILED  \] [A-Za-z]' "$log" | grep -v 'listed below' | sort -u | wc -l)
    skipped=$(grep -c '^\[  SKIPPED \]' "$log" || true)
    TEST_ROWS+=("| $t | ${total:-?} | $(( ${total:-0} - failed - skipped )) | $failed | $skipped | $rc |")
    say "$t: rc $rc, ${failed} failed, ${skipped} skipped of ${total:-?}"
    [[ $rc != 0 ]] && grep -E '^\[  FAILED  \]|Failure|error' "$log" | head -12
  done
fi

# ---- benchmarks
Q=()
[[ $QUICK == 1 ]] && Q=(--quick)
say "kernel bandwidth"
timeout 240 "$BUILD/bench/bench_cuda_ops" "${Q[@]}" --csv "$OUT_DIR/ops.csv" > "$OUT_DIR/ops.txt" 2>&1 || say "bench_cuda_ops failed (rc $?)"
say "GEMM against cuBLAS"
timeout 240 "$BUILD/bench/bench_cuda_gemm" > "$OUT_DIR/gemm.txt" 2>&1 || say "bench_cuda_gemm failed (rc $?)"
STEPS=20
[[ $QUICK == 1 ]] && STEPS=5
BERT_ARGS=(--config bert-base --task mlm --seq 128 --batch 64 --dtype bf16 --warmup 3 --steps "$STEPS")
say "BERT-base training (Ember)"
timeout 300 "$BUILD/bench/bert_train" --device cuda "${BERT_ARGS[@]}" > "$OUT_DIR/bert_ember.txt" 2>&1 ||
  say "bert_train failed (rc $?)"
# The same with attention as Ember's one fused kernel instead of GEMMs around the fused softmax.
say "BERT-base training (Ember, EMBER_CUDA_ATTENTION=fused)"
EMBER_CUDA_ATTENTION=fused timeout 300 "$BUILD/bench/bert_train" --device cuda "${BERT_ARGS[@]}" \
  > "$OUT_DIR/bert_ember_fused.txt" 2>&1 || say "bert_train (fused attention) failed (rc $?)"
PEER_NOTE="not run"
if [[ $RUN_PEER == 1 ]] && python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  say "BERT-base training (PyTorch eager, fused AdamW)"
  timeout 300 python3 bench/bert_train_peer.py --device cuda "${BERT_ARGS[@]}" > "$OUT_DIR/bert_peer.txt" 2>&1 &&
    PEER_NOTE="PyTorch $(python3 -c 'import torch; print(torch.__version__)')" || say "PyTorch peer failed (rc $?)"
fi

# ---- summary
json_field() {  # json_field FILE KEY: the value of KEY in the last JSON line of FILE
  python3 - "$1" "$2" <<'PY' 2>/dev/null
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
v = rows[-1].get(sys.argv[2]) if rows else None
print("" if v is None else (f"{v:.4g}" if isinstance(v, float) else v))
PY
}
{
  echo "# Ember GPU check, $(date -u +%Y-%m-%d)"
  echo
  echo "GPU: $GPU. Command: \`bash bench/gpu_check.sh$([[ $QUICK == 1 ]] && echo ' --quick')\` ($(elapsed) in all)."
  if [[ ${#TEST_ROWS[@]} -gt 0 ]]; then
    echo
    echo "## CUDA tests"
    echo
    echo "| suite | tests | passed | failed | skipped | exit |"
    echo "|---|---:|---:|---:|---:|---:|"
    printf '%s\n' "${TEST_ROWS[@]}"
  fi
  echo
  echo "## Memory-bound kernels against the device copy bandwidth"
  echo
  echo '```'
  cat "$OUT_DIR/ops.txt"
  echo '```'
  echo
  echo "## GEMM against cuBLAS called directly"
  echo
  echo '```'
  cat "$OUT_DIR/gemm.txt"
  echo '```'
  echo
  echo "## BERT-base training, seq 128, batch 64, bf16 autocast, AdamW"
  echo
  echo "| program | ms/step | tokens/s | MFU | peak GPU memory (MB) |"
  echo "|---|---:|---:|---:|---:|"
  for who in ember ember_fused peer; do
    f="$OUT_DIR/bert_$who.txt"
    [[ -s "$f" ]] || continue
    case $who in
      ember) name="Ember" ;;
      ember_fused) name="Ember, fused attention kernel" ;;
      *) name="$PEER_NOTE eager" ;;
    esac
    echo "| $name | $(json_field "$f" median_step_ms) | $(json_field "$f" tokens_per_s) | $(json_field "$f" mfu) | $(json_field "$f" peak_gpu_mb) |"
  done
  e=$(json_field "$OUT_DIR/bert_ember.txt" tokens_per_s)
  p=$(json_field "$OUT_DIR/bert_peer.txt" tokens_per_s 2>/dev/null)
  if [[ -n "$e" && -n "$p" ]]; then
    echo
    echo "Ember / PyTorch tokens/s: $(python3 -c "print(f'{$e / $p:.2f}')")"
  fi
} > "$SUMMARY"
cat "$SUMMARY"
say "done; files in $OUT_DIR"
