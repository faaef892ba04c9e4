#!/usr/bin/env bash
# The device check, in two calls that each end within a time budget (290 s by default) on a
# machine with a GPU and the CUDA 13 toolkit:
#
#   bash bench/gpu_check.sh tests [options]   # 1: build the library, the CUDA tests and the
#                                             #    benchmarks; run every tests/cuda suite and the
#                                             #    NCCL process-group suite
#   bash bench/gpu_check.sh bench [options]   # 2: the kernel and GEMM benchmarks, BERT-base
#                                             #    training in Ember and in PyTorch eager, then
#                                             #    GPT-2 124M and the CNN while time is left
#
# options: --out DIR (logs; default build-gpu/check), --budget SECONDS (default 290),
#          --jobs N (test suites run side by side; default 4), --quick (smaller benchmarks),
#          --skip-peer (no PyTorch run), --fetched-deps (the fetched packages even where the
#          system has its own), --rebuild (call 2: build even where call 1's programs exist)
#
# Call 2 uses call 1's programs when it runs on the same machine (call it right after); on a
# fresh machine it builds the benchmarks first, within its budget. Every phase has a deadline
# inside the budget and appends its section to DIR/summary.md as soon as it ends; after every
# phase DIR is packed into one tarball, $OUT/gpu_check_<call>.tar.gz ($OUT when set, else the
# folder above DIR), so a call stopped at its limit still returns what it had done.
#
# Ember's Debian build dependencies come from the system when CMake finds them; otherwise the
# packages fetched beforehand by bench/fetch_gpu_deps.sh into .gpudeps/ (or $EMBER_GPU_DEPS) are
# unpacked into a private prefix. NCCL is used where its header and its library are found
# together: the CUDA toolkit, the system, or the nvidia-nccl wheel PyTorch carries.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
ROOT=$PWD
CALL="${1:-}"
case "$CALL" in
  tests|bench) shift ;;
  -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
  *) echo "gpu_check: first argument must be 'tests' or 'bench' (see --help)" >&2; exit 2 ;;
esac
CHECK="$ROOT/build-gpu/check"
BUDGET=290
JOBS=4
QUICK=0
RUN_PEER=1
FETCHED_DEPS=0
REBUILD=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) CHECK="$2"; shift 2 ;;
    --budget) BUDGET="$2"; shift 2 ;;
    --jobs) JOBS="$2"; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --skip-peer) RUN_PEER=0; shift ;;
    --fetched-deps) FETCHED_DEPS=1; shift ;;
    --rebuild) REBUILD=1; shift ;;
    *) echo "gpu_check: unknown option $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$CHECK"
CHECK="$(cd "$CHECK" && pwd)"
LOGS="$CHECK/$CALL"
rm -rf "$LOGS" && mkdir -p "$LOGS"
SUMMARY="$CHECK/summary.md"
TARBALL_DIR="${OUT:-$(dirname "$CHECK")}"
mkdir -p "$TARBALL_DIR"
TARBALL="$TARBALL_DIR/gpu_check_$CALL.tar.gz"
BUILD="$ROOT/build-gpu/build"
START=$(date +%s)
RESERVE=15  # seconds kept for the last summary and tarball

elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( BUDGET - RESERVE - $(elapsed) )); }
say() { echo "[gpu_check $CALL $(elapsed)s] $*"; }
# The seconds a phase may take: its own cap, or what is left of the budget if less.
phase_limit() {
  local cap=$1 rest
  rest=$(left)
  (( rest < cap )) && echo "$rest" || echo "$cap"
}
note() { printf '%s\n' "$@" >> "$SUMMARY"; }
pack() {
  tar -czf "$TARBALL.part" -C "$(dirname "$CHECK")" "$(basename "$CHECK")" 2>/dev/null &&
    mv -f "$TARBALL.part" "$TARBALL"
}
# Ends a phase: its summary section is written; the tarball is brought up to date.
phase_done() {
  pack
  say "$1 done; summary in $SUMMARY, tarball $TARBALL"
}

if [[ $CALL == tests ]]; then
  : > "$SUMMARY"
  note "# Ember GPU check, $(date -u '+%Y-%m-%d %H:%M UTC')" ""
else
  note "" "# Call 2 (benchmarks), $(date -u '+%Y-%m-%d %H:%M UTC')" ""
fi

# ---- the machine and its compilers, first
export PATH="/usr/local/cuda/bin:$PATH"
GPU="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
[[ -n "$GPU" ]] || GPU="no GPU visible to nvidia-smi"
DRIVER_CUDA="$(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*' | head -1)"
GCC_V="$(g++ --version 2>/dev/null | head -1)"
NVCC_V="$(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*, V[0-9.]*' | head -1)"
LIBSTDCXX_V="$(printf '#include <cstddef>\n_GLIBCXX_RELEASE __GLIBCXX__\n' | g++ -x c++ -E - 2>/dev/null | tail -1)"
CMAKE_V="$(cmake --version 2>/dev/null | head -1)"
TORCH_V="$(python3 -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)' 2>/dev/null || echo none)"
note "Call: \`bash bench/gpu_check.sh $CALL\` (budget ${BUDGET} s)" "" \
  "| | |" "|---|---|" \
  "| GPU (name, memory, driver) | $GPU |" \
  "| driver's CUDA | ${DRIVER_CUDA:-unknown} |" \
  "| host compiler | ${GCC_V:-g++ not found} |" \
  "| libstdc++ (_GLIBCXX_RELEASE, __GLIBCXX__) | ${LIBSTDCXX_V:-unknown} |" \
  "| nvcc | ${NVCC_V:-nvcc not found} |" \
  "| CMake | ${CMAKE_V:-not found} |" \
  "| CPU cores | $(nproc) |" \
  "| PyTorch | $TORCH_V |" ""
say "GPU: $GPU; ${DRIVER_CUDA:-driver CUDA unknown}"
say "g++: ${GCC_V:-none}; libstdc++: ${LIBSTDCXX_V:-unknown}; nvcc: ${NVCC_V:-none}; ${CMAKE_V:-no cmake}"
command -v nvcc >/dev/null || { note "**nvcc not found: nothing was built.**"; phase_done machine; exit 1; }

# ---- dependencies: the system's, else the fetched Debian packages in a private prefix
CMAKE_ARGS=(-DCMAKE_POLICY_VERSION_MINIMUM=3.5)
have_system_deps() {
  [[ -f /usr/include/eigen3/Eigen/Core && -d /usr/include/oneapi/dnnl && -f /usr/include/gloo/config.h &&
     -f /usr/include/yaml-cpp/yaml.h && -f /usr/include/nlohmann/json.hpp && -f /usr/include/gtest/gtest.h &&
     -f /usr/include/benchmark/benchmark.h ]]
}
DEPS_NOTE=""
if [[ $FETCHED_DEPS == 0 ]] && have_system_deps; then
  DEPS_NOTE="the system's"
else
  DEBS="${EMBER_GPU_DEPS:-$ROOT/.gpudeps}"
  if ! ls "$DEBS"/*.deb >/dev/null 2>&1; then
    note "**Build dependencies missing:** the system lacks them and $DEBS holds no .deb files (run" \
      "bench/fetch_gpu_deps.sh on a Debian 12 machine and carry .gpudeps)."
    phase_done dependencies
    exit 1
  fi
  PREFIX="$ROOT/build-gpu/deps"
  STAMP="$PREFIX/.unpacked-from"
  WANT_STAMP="$(ls -l "$DEBS"/*.deb | md5sum | cut -d' ' -f1)"
  if [[ ! -f $STAMP || "$(cat "$STAMP")" != "$WANT_STAMP" ]]; then
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
    echo "$WANT_STAMP" > "$STAMP"
  fi
  LIBDIRS="$PREFIX/usr/lib/x86_64-linux-gnu:$PREFIX/usr/lib:$PREFIX/lib/x86_64-linux-gnu"
  export LD_LIBRARY_PATH="$LIBDIRS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LIBRARY_PATH="$LIBDIRS${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export CPATH="$PREFIX/usr/include${CPATH:+:$CPATH}"
  CMAKE_ARGS+=("-DCMAKE_PREFIX_PATH=$PREFIX/usr;$PREFIX/usr/share/eigen3/cmake;$PREFIX/usr/share/cmake"
               "-DCMAKE_BUILD_RPATH=${LIBDIRS//:/;}")
  DEPS_NOTE="$(ls "$DEBS"/*.deb | wc -l) Debian packages from $(basename "$DEBS"), unpacked into build-gpu/deps"
fi
say "build dependencies: $DEPS_NOTE"

# NCCL and cuDNN: each from a folder pair holding both its header and its library: the
# toolkit's, the system's, then the wheels PyTorch carries (their libraries are versioned
# only, libnccl.so.2 and libcudnn.so.9, so the file is named exactly).
# lib_pair HEADER LIB INCLUDE_DIR LIB_DIR...: prints "INCLUDE_DIR LIBRARY_FILE" when both are there.
lib_pair() {
  local header=$1 lib=$2 inc=$3 dir f
  shift 3
  [[ -f "$inc/$header" ]] || return 1
  for dir in "$@"; do
    for f in "$dir/$lib.so" "$dir/$lib".so.[0-9]*; do
      [[ -e "$f" ]] && { echo "$inc $f"; return 0; }
    done
  done
  return 1
}
# The include folder of every HEADER inside Python's `nvidia` packages (the wheels' layout
# varies: nvidia/nccl/include, nvidia/cudnn/include, nvidia/cu13/include, ...).
wheel_includes() {
  python3 - "$1" <<'PY' 2>/dev/null
import glob, importlib.util, os, sys
spec = importlib.util.find_spec("nvidia")
for root in (spec.submodule_search_locations if spec else []):
    for header in sorted(glob.glob(os.path.join(root, "**", sys.argv[1]), recursive=True)):
        print(os.path.dirname(header))
PY
}
find_pair() {  # find_pair HEADER LIB: the first pair found, as lib_pair prints it
  local header=$1 lib=$2 inc
  lib_pair "$header" "$lib" /usr/local/cuda/include /usr/local/cuda/lib64 /usr/local/cuda/lib ||
    lib_pair "$header" "$lib" /usr/include /usr/lib/x86_64-linux-gnu /usr/lib ||
    lib_pair "$header" "$lib" /usr/local/include /usr/local/lib && return 0
  while read -r inc; do
    lib_pair "$header" "$lib" "$inc" "$(dirname "$inc")/lib" "$(dirname "$inc")/lib64" && return 0
  done < <(wheel_includes "$header")
  return 1
}
# use_pair NAME HEADER LIB: passes the pair found to CMake as EMBER_<NAME>_LIBRARY and
# EMBER_<NAME>_INCLUDE, puts the library's folder on the loader's path (cuDNN loads its engine
# libraries from there at run time) and prints what it found, for the summary.
use_pair() {
  local name=$1 header=$2 lib=$3 pair inc file
  if ! pair=$(find_pair "$header" "$lib"); then
    echo "not found (no folder pair with both $header and $lib.so)"
    return 0
  fi
  read -r inc file <<<"$pair"
  CMAKE_ARGS+=("-DEMBER_${name}_LIBRARY=$file" "-DEMBER_${name}_INCLUDE=$inc")
  export LD_LIBRARY_PATH="$(dirname "$file")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "$file with $inc/$header"
}
use_pair NCCL nccl.h libnccl > "$LOGS/nccl.txt"  # (a redirect, not $(...): the settings must stay)
use_pair CUDNN cudnn.h libcudnn > "$LOGS/cudnn.txt"
NCCL_NOTE=$(cat "$LOGS/nccl.txt")
CUDNN_NOTE=$(cat "$LOGS/cudnn.txt")
say "NCCL: $NCCL_NOTE"
say "cuDNN: $CUDNN_NOTE"
note "Build dependencies: $DEPS_NOTE. NCCL: $NCCL_NOTE. cuDNN: $CUDNN_NOTE." ""
phase_done dependencies

# ---- configure and build
CUDA_TESTS=()
for f in tests/cuda/test_*.cpp; do CUDA_TESTS+=("$(basename "$f" .cpp)"); done
TEST_TARGETS=("${CUDA_TESTS[@]}" test_process_group_nccl)
BENCH_TARGETS=(bert_train models_train bench_cuda_gemm bench_cuda_ops)
build() {  # build PHASE_CAP TARGET...: configures when needed, then builds within the budget
  local cap=$1 limit t0 rc
  shift
  if [[ ! -f "$BUILD/build.ninja" ]]; then
    limit=$(phase_limit 60)
    say "configuring $BUILD"
    timeout "$limit" cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEMBER_BUILD_TESTS=ON \
      -DEMBER_BUILD_BENCH=ON -DEMBER_BUILD_EXAMPLES=OFF -DCMAKE_CUDA_ARCHITECTURES=90 "${CMAKE_ARGS[@]}" \
      > "$LOGS/configure.log" 2>&1
    rc=$?
    if [[ $rc != 0 ]]; then
      note "**Configure failed** (exit $rc; configure.log):" '```' "$(tail -25 "$LOGS/configure.log")" '```'
      return 1
    fi
  fi
  limit=$(phase_limit "$cap")
  (( limit > 0 )) || { note "**No time left to build.**"; return 1; }
  say "building ${#@} targets (at most ${limit} s)"
  t0=$(date +%s)
  timeout "$limit" cmake --build "$BUILD" -j"$(nproc)" --target "$@" > "$LOGS/build.log" 2>&1
  rc=$?
  if [[ $rc == 124 ]]; then
    note "**Build stopped after ${limit} s** (build.log ends):" '```' "$(tail -4 "$LOGS/build.log")" '```' \
      "On the same machine, run the call again at once: the build resumes where it stopped."
    return 1
  elif [[ $rc != 0 ]]; then
    note "**Build failed** (exit $rc; build.log):" '```' "$(grep -E 'error|Error|FAILED' "$LOGS/build.log" | head -30)" '```'
    return 1
  fi
  note "Built ${#@} targets in $(( $(date +%s) - t0 )) s."
  return 0
}

if [[ $CALL == tests ]]; then
  note "## Build"
  if ! build 200 ember "${TEST_TARGETS[@]}" "${BENCH_TARGETS[@]}"; then
    phase_done build
    cat "$SUMMARY"
    exit 1
  fi
  note ""
  phase_done build

  # ---- tests: side by side, each under its own timeout and the call's deadline
  # Heavier suites first, so that they are not the ones the deadline cuts.
  ORDER=(test_cuda_large_tensors test_cuda_bert_golden test_cuda_autograd test_cuda_accelerator test_process_group_nccl)
  SUITES=()
  for t in "${ORDER[@]}"; do [[ -x "$BUILD/tests/$t" ]] && SUITES+=("$t"); done
  for t in "${TEST_TARGETS[@]}"; do [[ " ${SUITES[*]} " == *" $t "* ]] || SUITES+=("$t"); done
  run_suite() {
    local t=$1 limit
    limit=$(phase_limit 120)
    if (( limit < 5 )); then
      echo 125 > "$LOGS/$t.rc"  # not started: out of time
      return
    fi
    (cd "$BUILD" && EMBER_SOURCE_DIR="$ROOT" EMBER_TEST_PROGRAMS="$BUILD/tests/programs" EMBER_CLI="$BUILD/bin/ember" \
      timeout -k 5 "$limit" "$BUILD/tests/$t" --gtest_output="json:$LOGS/$t.json" > "$LOGS/$t.log" 2>&1)
    echo $? > "$LOGS/$t.rc"
  }
  say "running ${#SUITES[@]} suites, $JOBS at a time"
  for t in "${SUITES[@]}"; do
    while (( $(jobs -rp | wc -l) >= JOBS )); do wait -n; done
    run_suite "$t" &
  done
  wait
  # Counts from gtest's JSON report; from the per-test lines of the log when the suite died
  # before writing it (a test's own result line ends with its time in ms, the recap does not).
  python3 - "$LOGS" "${SUITES[@]}" > "$LOGS/tests.md" <<'PY'
import json, os, re, sys
logs, suites = sys.argv[1], sys.argv[2:]
print("| suite | tests | passed | failed | skipped | exit | note |")
print("|---|---:|---:|---:|---:|---:|---|")
totals = [0, 0, 0, 0]
bad = []
for s in suites:
    rc = int(open(os.path.join(logs, s + ".rc")).read().strip() or -1)
    note = {0: "", 124: "timed out", 125: "not started: out of time", 137: "killed after the timeout"}.get(rc, "")
    if rc > 128 and rc != 137: note = f"died by signal {rc - 128}"
    if rc == 1: note = "failures"
    path = os.path.join(logs, s + ".json")
    try:
        rep = json.load(open(path))
        cases = [c for ts in rep.get("testsuites", []) for c in ts.get("testsuite", [])]
        n = len(cases)
        failed = [f"{c['classname']}.{c['name']}" for c in cases if c.get("failures")]
        skipped = sum(1 for c in cases if c.get("result") == "SKIPPED" and not c.get("failures"))
    except (OSError, ValueError):
        text = open(os.path.join(logs, s + ".log"), errors="replace").read() if os.path.exists(os.path.join(logs, s + ".log")) else ""
        run = re.findall(r"^\[ RUN      \] (\S+)$", text, re.M)
        ok = set(re.findall(r"^\[       OK \] (\S+) \(\d+ ms\)$", text, re.M))
        failed = sorted(set(re.findall(r"^\[  FAILED  \] (\S+) \(\d+ ms\)$", text, re.M)))
        skipped = len(set(re.findall(r"^\[  SKIPPED \] (\S+) \(\d+ ms\)$", text, re.M)))
        done = ok | set(failed) | set(re.findall(r"^\[  SKIPPED \] (\S+) \(\d+ ms\)$", text, re.M))
        unfinished = [r for r in run if r not in done]
        if unfinished:
            failed.append(unfinished[-1] + " (did not finish)")
            note = (note + "; " if note else "") + "no JSON report; stopped in " + unfinished[-1]
        n = len(run)
    passed = n - len(failed) - skipped
    for i, v in enumerate((n, passed, len(failed), skipped)): totals[i] += v
    if failed or rc != 0: bad.append((s, failed, note))
    print(f"| {s} | {n} | {passed} | {len(failed)} | {skipped} | {rc} | {note} |")
print(f"| **all** | {totals[0]} | {totals[1]} | {totals[2]} | {totals[3]} | | |")
for s, failed, note in bad:
    print(f"\n{s}: {note or 'failed'}" + ("".join(f"\n- {f}" for f in failed[:20])))
PY
  note "## CUDA tests" "" "$(cat "$LOGS/tests.md")" ""
  phase_done tests
  cat "$SUMMARY"
  exit 0
fi

# ---- call 2: benchmarks
# Call 1's programs are used as they are when they exist (--rebuild builds again): the tree is
# sent afresh with each call, and ninja could take new file times for changes.
have_bench_build() {
  local t
  for t in "${BENCH_TARGETS[@]}"; do [[ -x "$BUILD/bench/$t" ]] || return 1; done
}
note "## Build (benchmarks)"
if [[ $REBUILD == 0 ]] && have_bench_build; then
  note "Using the programs call 1 built in build-gpu/build."
elif ! build 200 ember "${BENCH_TARGETS[@]}"; then
  phase_done build
  cat "$SUMMARY"
  exit 1
fi
note ""
phase_done build
# run_bench NAME CAP OUTFILE COMMAND...: runs within the budget; notes a failure or a skip.
run_bench() {
  local name=$1 cap=$2 out=$3 limit rc
  shift 3
  limit=$(phase_limit "$cap")
  if (( limit < 10 )); then
    note "- $name: not run (out of time)"
    return 1
  fi
  say "$name (at most ${limit} s)"
  timeout -k 5 "$limit" "$@" > "$out" 2>&1
  rc=$?
  if [[ $rc != 0 ]]; then
    note "- $name: exit $rc$([[ $rc == 124 ]] && echo ", stopped after ${limit} s"); last lines:" '```' "$(tail -8 "$out")" '```'
  fi
  return $rc
}
Q=()
[[ $QUICK == 1 ]] && Q=(--quick)
run_bench "bench_cuda_ops" 70 "$LOGS/ops.txt" "$BUILD/bench/bench_cuda_ops" "${Q[@]}" --csv "$LOGS/ops.csv"
note "## Memory-bound kernels against the device copy bandwidth" "" '```' "$(cat "$LOGS/ops.txt")" '```' ""
phase_done "kernel bandwidth"
run_bench "bench_cuda_gemm" 40 "$LOGS/gemm.txt" "$BUILD/bench/bench_cuda_gemm"
note "## GEMM against cuBLAS called directly" "" '```' "$(cat "$LOGS/gemm.txt")" '```' ""
phase_done GEMM

STEPS=10
[[ $QUICK == 1 ]] && STEPS=5
BERT_ARGS=(--config bert-base --task mlm --seq 128 --batch 64 --dtype bf16 --warmup 3 --steps "$STEPS")
json_field() {  # json_field FILE KEY: the value of KEY in the last JSON line of FILE
  python3 - "$1" "$2" <<'PY' 2>/dev/null
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
v = rows[-1].get(sys.argv[2]) if rows else None
print("" if v is None else (f"{v:.4g}" if isinstance(v, float) and abs(v) < 1e4 else
                            f"{v:.0f}" if isinstance(v, float) else v))
PY
}
bert_row() {  # bert_row LABEL FILE
  [[ -s "$2" ]] || return 0
  note "| $1 | $(json_field "$2" median_step_ms) | $(json_field "$2" tokens_per_s) | $(json_field "$2" mfu) | $(json_field "$2" peak_gpu_mb) |"
}
note "## BERT-base training, seq 128, batch 64, bf16 autocast, AdamW" "" \
  "| program | ms/step | tokens/s | MFU | peak GPU memory (MB) |" "|---|---:|---:|---:|---:|"
run_bench "BERT-base training (Ember)" 45 "$LOGS/bert_ember.txt" \
  "$BUILD/bench/bert_train" --device cuda "${BERT_ARGS[@]}"
bert_row "Ember" "$LOGS/bert_ember.txt"
phase_done "BERT-base (Ember)"
# The same with attention as Ember's one fused kernel instead of GEMMs around the fused softmax.
EMBER_CUDA_ATTENTION=fused run_bench "BERT-base training (Ember, fused attention kernel)" 40 \
  "$LOGS/bert_ember_fused.txt" "$BUILD/bench/bert_train" --device cuda "${BERT_ARGS[@]}"
bert_row "Ember, fused attention kernel" "$LOGS/bert_ember_fused.txt"
phase_done "BERT-base (Ember, fused attention)"
if [[ $RUN_PEER == 1 ]] && python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  run_bench "BERT-base training (PyTorch eager)" 70 "$LOGS/bert_peer.txt" \
    python3 bench/bert_train_peer.py --device cuda "${BERT_ARGS[@]}"
  bert_row "PyTorch $(python3 -c 'import torch; print(torch.__version__)') eager" "$LOGS/bert_peer.txt"
  e=$(json_field "$LOGS/bert_ember.txt" tokens_per_s)
  p=$(json_field "$LOGS/bert_peer.txt" tokens_per_s)
  if [[ -n "$e" && -n "$p" ]]; then
    note "" "Ember / PyTorch tokens/s: $(python3 -c "print(f'{$e / $p:.2f}')")"
  fi
else
  note "" "PyTorch peer: not run ($([[ $RUN_PEER == 0 ]] && echo '--skip-peer' || echo 'no PyTorch with CUDA'))."
fi
phase_done "PyTorch peer"

# GPT-2 124M (GPT-2's vocabulary and context) and the Fashion-MNIST CNN (its convolutions on
# cuDNN), training steps in Ember and in PyTorch, bf16 autocast, AdamW; run while time is left.
models_row() {  # models_row LABEL FILE
  [[ -s "$2" ]] || return 0
  note "| $1 | $(json_field "$2" median_step_ms) | $(json_field "$2" items_per_s) | $(json_field "$2" last_loss) |"
}
GPT2_ARGS=(--model gpt --device cuda --dtype bf16 --vocab 50257 --seq 1024 --n-embd 768 --n-layer 12 --n-head 12
           --batch 8 --warmup 3 --steps 10)
CNN_ARGS=(--model cnn --device cuda --dtype bf16 --warmup 5 --steps 20)
note "" "## GPT-2 124M (batch 8 x 1024) and the Fashion-MNIST CNN (batch 128), bf16 autocast, AdamW" "" \
  "| program | ms/step | tokens or images/s | last loss |" "|---|---:|---:|---:|"
run_bench "GPT-2 124M training (Ember)" 45 "$LOGS/gpt2_ember.txt" "$BUILD/bench/models_train" "${GPT2_ARGS[@]}"
models_row "GPT-2 124M, Ember" "$LOGS/gpt2_ember.txt"
run_bench "CNN training (Ember, cuDNN convolutions)" 20 "$LOGS/cnn_ember.txt" "$BUILD/bench/models_train" "${CNN_ARGS[@]}"
models_row "CNN, Ember" "$LOGS/cnn_ember.txt"
phase_done "GPT-2 and CNN (Ember)"
if [[ $RUN_PEER == 1 ]] && python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  run_bench "GPT-2 124M training (PyTorch SDPA + fused AdamW)" 50 "$LOGS/gpt2_peer.txt" \
    python3 bench/models_train_peer.py "${GPT2_ARGS[@]}" --sdpa --fused
  models_row "GPT-2 124M, PyTorch SDPA + fused AdamW" "$LOGS/gpt2_peer.txt"
  run_bench "CNN training (PyTorch eager)" 25 "$LOGS/cnn_peer.txt" python3 bench/models_train_peer.py "${CNN_ARGS[@]}"
  models_row "CNN, PyTorch eager" "$LOGS/cnn_peer.txt"
fi
note "" "Call 2 took $(elapsed) s."
phase_done "GPT-2 and CNN (PyTorch)"
cat "$SUMMARY"
