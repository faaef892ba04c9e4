#!/usr/bin/env bash
# Ember's packed GEMM and Debian's oneDNN 2.6 (bench_matmul's packed/ rows) beside MKL and a
# current oneDNN from PyPI (bench_gemm_libs), at the BERT training GEMMs of bench/bert_gemm_shapes.h.
# The programs run in alternation, round after round (bench_matmul, then bench_gemm_libs for MKL,
# then for oneDNN, each library in a process of its own), so that all see the same background
# load. Each cell is the best (or median) of the rounds, in GFLOP/s and as a fraction of the f32
# FMA peak that bench/machine_limits measures first (one core for 1-thread rows, the --threads
# count of cores for the others). Prints a Markdown table.
#
#   bench/compare_gemm_libs.sh                        # every shape, 3 rounds (about 15 minutes)
#   bench/compare_gemm_libs.sh --rounds 5 --filter 'fwd|wgrad' --stat median
set -euo pipefail

usage() {
  cat <<'EOF'
usage: bench/compare_gemm_libs.sh [options]

  --rounds N          runs of each program, interleaved                              (3)
  --stat best|median  which round a cell reports                                     (best)
  --clock real|cpu    time the 1-thread rows by wall clock or by the process's CPU time
                      (on a machine shared with other work; 2-thread rows: wall)      (real)
  --filter REGEX      layouts to run (fwd, dgrad, wgrad, attn_scores, attn_context,
                      attn_dv), an extended regex                                     (all)
  --min-time SEC      Google Benchmark's --benchmark_min_time per row                (0.3)
  --build-dir DIR     build directory (configured with -DEMBER_BENCH_LIBS_DIR)       (<repo>/build)
  --no-build          do not install, configure or build; the binaries must exist
  --limits FILE       `machine_limits --json` output to use instead of measuring now
  --raw DIR           keep every round's Google Benchmark JSON (and limits.json) in DIR
  --from DIR          run nothing: print the table from a --raw DIR of an earlier run
  -h, --help          this text

MKL and oneDNN come from scripts/install_bench_libs.sh ($EMBER_BENCH_LIBS, default
~/.cache/ember-bench-libs), which this script runs unless --no-build. Every program runs with
the caller's environment: MKL chooses its own code path (set MKL_VERBOSE=1 to see it logged).
EOF
}

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rounds=3 stat=best clock=real filter="" min_time=0.3 build_dir="$repo_root/build" no_build=0 limits_file="" raw_dir="" from_dir=""

need_value() { [[ $# -ge 2 && -n "$2" ]] || { echo "compare_gemm_libs: $1 needs a value" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) need_value "$@"; rounds=$2; shift 2 ;;
    --stat) need_value "$@"; stat=$2; shift 2 ;;
    --clock) need_value "$@"; clock=$2; shift 2 ;;
    --filter) need_value "$@"; filter=$2; shift 2 ;;
    --min-time) need_value "$@"; min_time=$2; shift 2 ;;
    --build-dir) need_value "$@"; build_dir=$2; shift 2 ;;
    --no-build) no_build=1; shift ;;
    --limits) need_value "$@"; limits_file=$2; shift 2 ;;
    --raw) need_value "$@"; raw_dir=$2; shift 2 ;;
    --from) need_value "$@"; from_dir=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "compare_gemm_libs: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ $rounds =~ ^[0-9]+$ ]] && (( rounds > 0 )) || { echo "compare_gemm_libs: --rounds must be a positive integer" >&2; exit 2; }
[[ $stat == best || $stat == median ]] || { echo "compare_gemm_libs: --stat must be best or median" >&2; exit 2; }
[[ $clock == real || $clock == cpu ]] || { echo "compare_gemm_libs: --clock must be real or cpu" >&2; exit 2; }
[[ $min_time =~ ^[0-9]*\.?[0-9]+$ ]] || { echo "compare_gemm_libs: --min-time must be a number of seconds" >&2; exit 2; }
[[ -z $limits_file || -r $limits_file ]] || { echo "compare_gemm_libs: cannot read --limits $limits_file" >&2; exit 2; }

log() { echo "compare_gemm_libs: $*" >&2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [[ -n $from_dir ]]; then
  cp "$from_dir"/r*-*.json "$work/" || { echo "compare_gemm_libs: no round files in $from_dir" >&2; exit 2; }
  if [[ -n $limits_file ]]; then cp "$limits_file" "$work/limits.json"; else cp "$from_dir/limits.json" "$work/"; fi
  rounds=$(find "$work" -name 'r*-ember.json' | wc -l)
  no_build=1
fi

# ---- libraries and binaries
if (( ! no_build )); then
  libs_dir=$(bash "$repo_root/scripts/install_bench_libs.sh" | sed -n 's/^install_bench_libs: \(\/.*\)$/\1/p' | tail -n1)
  [[ -n $libs_dir ]] || { echo "compare_gemm_libs: scripts/install_bench_libs.sh printed no directory" >&2; exit 1; }
  log "configuring $build_dir with EMBER_BENCH_LIBS_DIR=$libs_dir"
  cmake -S "$repo_root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEMBER_BUILD_BENCH=ON \
    -DEMBER_BENCH_LIBS_DIR="$libs_dir" >&2
  ninja -C "$build_dir" -j "$(nproc)" bench_matmul bench_gemm_libs machine_limits >&2
fi
bin="$build_dir/bench"
for program in bench_matmul bench_gemm_libs; do
  [[ -n $from_dir || -x $bin/$program ]] ||
    { echo "compare_gemm_libs: no $bin/$program (configure with -DEMBER_BENCH_LIBS_DIR, or drop --no-build)" >&2; exit 1; }
done

# ---- this machine's f32 FMA peak
if [[ -n $from_dir ]]; then
  :
elif [[ -n $limits_file ]]; then
  cp "$limits_file" "$work/limits.json"
else
  [[ -x $bin/machine_limits ]] || { echo "compare_gemm_libs: no $bin/machine_limits (build it, or pass --limits FILE)" >&2; exit 1; }
  log "measuring this machine's FMA peak: machine_limits --threads 2"
  "$bin/machine_limits" --threads 2 --json "$work/limits.json" >&2
fi

# ---- rounds: each program's rows, in alternation
layouts=${filter:-.*}
ember_filter="^packed/($layouts)/(packed_f32|packed_bf16|onednn_f32|ember_bmm_f32|ember_bmm_bf16)/"
for r in $(seq 1 "$rounds"); do
  [[ -z $from_dir ]] || break
  log "round $r of $rounds"
  "$bin/bench_matmul" --benchmark_filter="$ember_filter" --benchmark_min_time="$min_time" \
    --benchmark_out="$work/r$r-ember.json" --benchmark_out_format=json >/dev/null
  for lib in mkl onednn3; do
    "$bin/bench_gemm_libs" --benchmark_filter="^libs/($layouts)/${lib}_" --benchmark_min_time="$min_time" \
      --benchmark_out="$work/r$r-$lib.json" --benchmark_out_format=json >/dev/null 2>"$work/r$r-$lib.err" ||
      { cat "$work/r$r-$lib.err" >&2; exit 1; }
  done
done
[[ -n $from_dir || -z $raw_dir ]] || { mkdir -p "$raw_dir" && cp "$work"/*.json "$raw_dir/"; }

# ---- one table
python3 - "$work" "$stat" "$rounds" "$clock" <<'PY'
import glob, json, os, re, statistics, sys

work, stat, rounds, clock = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
limits = json.load(open(os.path.join(work, "limits.json")))
peak = {1: limits["fma_f32_gflops_per_core"], 2: limits["fma_f32_gflops_all_cores"]}

# Row impl -> (dtype, column).
columns = {
    "packed_f32": ("f32", "ember"), "ember_bmm_f32": ("f32", "ember"),
    "packed_bf16": ("bf16", "ember"), "ember_bmm_bf16": ("bf16", "ember"),
    "onednn_f32": ("f32", "onednn26"), "onednn3_f32": ("f32", "onednn3"),
    "mkl_f32": ("f32", "mkl"), "mkl_bf16": ("bf16", "mkl"),
}
name_re = re.compile(r"^(?:packed|libs)/([a-z_]+)/([a-z0-9_]+)/([0-9x]+)/(\d)threads?")
runs, labels, context = {}, {}, {}
for path in sorted(glob.glob(os.path.join(work, "r*-*.json"))):
    data = json.load(open(path))
    context.update({k: v for k, v in data.get("context", {}).items() if k in ("mkl", "mkl_path", "onednn")})
    for b in data["benchmarks"]:
        m = name_re.match(b["name"])
        if not m or b.get("error_occurred") or m.group(2) not in columns:
            continue
        layout, impl, shape, threads = m.group(1), m.group(2), m.group(3), int(m.group(4))
        dtype, column = columns[impl]
        key = (layout, shape, dtype, threads)
        rate = b["GFLOP/s"]
        if clock == "cpu" and threads == 1:
            # The process's CPU time: every thread the row kept busy.
            rate *= b["real_time"] / b["cpu_time"]
        runs.setdefault(key, {}).setdefault(column, []).append(rate)
        labels.setdefault((column, dtype), set()).add(b.get("label", "").split(" ")[0])

pick = max if stat == "best" else statistics.median
order = {"fwd": 0, "dgrad": 1, "wgrad": 2, "attn_scores": 3, "attn_context": 4, "attn_dv": 5}
print(f"| shape MxKxN | layout | dtype | threads | Ember packed | oneDNN 2.6 | oneDNN {context.get('onednn', '3')} | MKL |")
print("|---|---|---|---|---|---|---|---|")
for key in sorted(runs, key=lambda k: (k[3], k[2] != "f32", order.get(k[0], 9), k[1])):
    layout, shape, dtype, threads = key
    cells = []
    for column in ("ember", "onednn26", "onednn3", "mkl"):
        values = runs[key].get(column)
        if not values:
            cells.append("—")
            continue
        g = pick(values)
        cells.append(f"{g:.0f} ({100 * g / peak[threads]:.0f}%)")
    print(f"| {shape} | {layout} | {dtype} | {threads} | " + " | ".join(cells) + " |")
print()
timed = "1-thread rows by the process's CPU time, 2-thread rows by wall clock" if clock == "cpu" else "wall clock"
print(f"GFLOP/s ({stat} of {rounds} rounds; {timed}) and fraction of the f32 FMA peak measured by machine_limits: "
      f"{peak[1]:.0f} GFLOP/s on 1 core, {peak[2]:.0f} on 2 ({limits.get('cpu', '?')}).")
print("Rows: " + "; ".join(f"{c} {d}: " + ", ".join(sorted(l)) for (c, d), l in sorted(labels.items())) + ".")
if context:
    print("Libraries: " + "; ".join(f"{k}: {v}" for k, v in sorted(context.items())) + ".")
PY
