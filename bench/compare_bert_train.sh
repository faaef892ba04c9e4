#!/usr/bin/env bash
# Ember's BERT training step against the same model in PyTorch, on this machine, run in
# alternation so that both see the same background load. Measures the machine's limits first
# (bench/machine_limits) and states both programs' MFU against them. Prints a Markdown table.
#
#   bench/compare_bert_train.sh                                  # bert-mini, mlm+cls, f32, 2 threads
#   bench/compare_bert_train.sh --configs bert-mini,bert-tiny --tasks cls --dtypes f32,bf16 --rounds 5
#
# See bench/README_bert.md for every flag and what the columns mean.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: bench/compare_bert_train.sh [options] [-- extra flags for both programs]

  --configs LIST     comma-separated presets: bert-mini, bert-tiny, bert-base (bert-mini)
  --tasks LIST       mlm, cls                                               (mlm,cls)
  --dtypes LIST      f32, bf16                                              (f32)
  --threads LIST     thread counts                                          (2)
  --batch N          sequences per step                                     (16)
  --seq N            tokens per sequence                                    (128)
  --warmup N         untimed steps per run (torch.compile runs: at least 5) (3)
  --steps N          timed steps per run (each run reports their median)    (10)
  --rounds N         runs of each program (and peer mode) per row, interleaved (3)
  --stat best|median which run of the rounds a row reports                  (best)
  --build-dir DIR    Ember build directory holding bench/bert_train and bench/machine_limits
                                                                            (<repo>/build)
  --ember-bin PATH   use this bert_train as is (no build; machine_limits is looked for beside it)
  --no-build         do not configure/build; the binaries must already exist
  --limits FILE      `machine_limits --json` output to use instead of measuring the limits now
  --timeout SEC      kill a run that takes longer (0 = never)               (0)
  --raw FILE         also append every JSON result line to FILE
  --peer-python PATH interpreter for the PyTorch peer (~/.cache/ember-peer/bin/python,
                     installed by scripts/install_peer.sh)
  --peer-script PATH the peer program (<repo>/../shared/peer/bert_ref.py, the shared yardstick;
                     bench/bert_train_peer.py where that is absent)
  --peer-modes LIST  PyTorch modes run per row, the fastest reported: eager, sdpa
                     (--sdpa --fused), compile (--sdpa --fused --compile)   (eager,sdpa,compile)
  -h, --help         this text

Flags after `--` (e.g. -- --vocab 8000 --seed 3) go to both programs unchanged.
PyTorch runs under the settings of the reference peer (shared/peer/README.md); Ember runs
with the caller's plain environment.
EOF
}

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
configs=bert-mini tasks=mlm,cls dtypes=f32 threads_list=2
batch=16 seq=128 warmup=3 steps=10 rounds=3 stat=best
build_dir="$repo_root/build" ember_bin="" no_build=0 timeout_s=0 raw_file="" peer_python=${EMBER_PEER:-$HOME/.cache/ember-peer}/bin/python
limits_file="" peer_script="" peer_modes=eager,sdpa,compile
extra=()

need_value() { [[ $# -ge 2 && -n "$2" ]] || { echo "compare_bert_train: $1 needs a value" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --configs) need_value "$@"; configs=$2; shift 2 ;;
    --tasks) need_value "$@"; tasks=$2; shift 2 ;;
    --dtypes) need_value "$@"; dtypes=$2; shift 2 ;;
    --threads) need_value "$@"; threads_list=$2; shift 2 ;;
    --batch) need_value "$@"; batch=$2; shift 2 ;;
    --seq) need_value "$@"; seq=$2; shift 2 ;;
    --warmup) need_value "$@"; warmup=$2; shift 2 ;;
    --steps) need_value "$@"; steps=$2; shift 2 ;;
    --rounds) need_value "$@"; rounds=$2; shift 2 ;;
    --stat) need_value "$@"; stat=$2; shift 2 ;;
    --build-dir) need_value "$@"; build_dir=$2; shift 2 ;;
    --ember-bin) need_value "$@"; ember_bin=$2; shift 2 ;;
    --no-build) no_build=1; shift ;;
    --limits) need_value "$@"; limits_file=$2; shift 2 ;;
    --timeout) need_value "$@"; timeout_s=$2; shift 2 ;;
    --raw) need_value "$@"; raw_file=$2; shift 2 ;;
    --peer-python) need_value "$@"; peer_python=$2; shift 2 ;;
    --peer-script) need_value "$@"; peer_script=$2; shift 2 ;;
    --peer-modes) need_value "$@"; peer_modes=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "compare_bert_train: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

is_count() { [[ $1 =~ ^[0-9]+$ ]]; }
for pair in "batch:$batch" "seq:$seq" "steps:$steps" "rounds:$rounds"; do
  is_count "${pair#*:}" && (( ${pair#*:} > 0 )) || { echo "compare_bert_train: --${pair%%:*} must be a positive integer" >&2; exit 2; }
done
is_count "$warmup" || { echo "compare_bert_train: --warmup must be a non-negative integer" >&2; exit 2; }
is_count "$timeout_s" || { echo "compare_bert_train: --timeout must be a non-negative integer" >&2; exit 2; }
[[ $stat == best || $stat == median ]] || { echo "compare_bert_train: --stat must be best or median" >&2; exit 2; }
IFS=, read -r -a config_arr <<<"$configs"
IFS=, read -r -a task_arr <<<"$tasks"
IFS=, read -r -a dtype_arr <<<"$dtypes"
IFS=, read -r -a thread_arr <<<"$threads_list"
IFS=, read -r -a mode_arr <<<"$peer_modes"
for c in "${config_arr[@]}"; do [[ $c == bert-mini || $c == bert-tiny || $c == bert-base ]] || { echo "compare_bert_train: unknown config $c" >&2; exit 2; }; done
for t in "${task_arr[@]}"; do [[ $t == mlm || $t == cls ]] || { echo "compare_bert_train: unknown task $t" >&2; exit 2; }; done
for d in "${dtype_arr[@]}"; do [[ $d == f32 || $d == bf16 ]] || { echo "compare_bert_train: unknown dtype $d" >&2; exit 2; }; done
for n in "${thread_arr[@]}"; do is_count "$n" && (( n > 0 )) || { echo "compare_bert_train: bad thread count $n" >&2; exit 2; }; done
(( ${#mode_arr[@]} > 0 )) || { echo "compare_bert_train: --peer-modes is empty" >&2; exit 2; }
for m in "${mode_arr[@]}"; do [[ $m == eager || $m == sdpa || $m == compile ]] || { echo "compare_bert_train: unknown peer mode $m (eager, sdpa, compile)" >&2; exit 2; }; done
[[ -z $limits_file || -r $limits_file ]] || { echo "compare_bert_train: cannot read --limits $limits_file" >&2; exit 2; }

log() { echo "compare_bert_train: $*" >&2; }

# Value of a numeric field in a JSON object ("" when absent or null), and of a string field.
json_num() { sed -n "s/.*\"$2\": *\\(-\\{0,1\\}[0-9][0-9.eE+-]*\\).*/\\1/p" <<<"$1" | head -n1; }
json_str() { sed -n "s/.*\"$2\": *\"\\([^\"]*\\)\".*/\\1/p" <<<"$1" | head -n1; }

# ---- Ember's binaries: given, found, or built
if [[ -z $ember_bin ]]; then
  ember_bin="$build_dir/bench/bert_train"
  if (( ! no_build )); then
    if [[ ! -f $build_dir/build.ninja ]]; then
      log "configuring $build_dir"
      cmake -S "$repo_root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DEMBER_BUILD_BENCH=ON -DEMBER_BUILD_TESTS=OFF -DEMBER_BUILD_EXAMPLES=OFF >&2
    fi
    targets=(bert_train)
    [[ -z $limits_file ]] && targets+=(machine_limits)
    log "building ${targets[*]} in $build_dir"
    ninja -C "$build_dir" -j "$(nproc)" "${targets[@]}" >&2
  fi
fi
[[ -x $ember_bin ]] || { echo "compare_bert_train: no Ember binary at $ember_bin (build it or pass --ember-bin)" >&2; exit 1; }

# ---- this machine's limits: measured now by machine_limits (beside bert_train), or --limits FILE
if [[ -n $limits_file ]]; then
  limits=$(cat "$limits_file") limits_origin="read from $limits_file"
else
  limits_bin="$(dirname "$ember_bin")/machine_limits"
  [[ -x $limits_bin ]] || { echo "compare_bert_train: no machine_limits at $limits_bin (build it, or pass --limits FILE)" >&2; exit 1; }
  limits_tmp=$(mktemp)
  log "measuring this machine's limits: $limits_bin --json $limits_tmp"
  "$limits_bin" --json "$limits_tmp" >&2 || { echo "compare_bert_train: $limits_bin failed" >&2; rm -f "$limits_tmp"; exit 1; }
  limits=$(cat "$limits_tmp") limits_origin="measured at the start by bench/machine_limits"
  rm -f "$limits_tmp"
fi
# machine_limits writes one key a line; the bandwidth tables are one line each
limits_bw() { sed -n "s/.*\"bandwidth_gbs\": *{.*\"$1\": *{\"1\": *\\([0-9][0-9.eE+-]*\\).*/\\1/p" <<<"$limits" | head -n1; }
fma_peak=$(json_num "$limits" fma_f32_gflops_per_core) fma_isa=$(json_str "$limits" fma_isa)
fma_all=$(json_num "$limits" fma_f32_gflops_all_cores) limits_threads=$(json_num "$limits" threads)
bf16_peak=$(json_num "$limits" bf16_peak_gflops_per_core) bf16_source=$(json_str "$limits" bf16_peak_source)
vdp_peak=$(json_num "$limits" vdpbf16ps_gflops_per_core) amx_peak=$(json_num "$limits" amx_bf16_gflops_per_core)
[[ -n $fma_peak && -n $bf16_peak && -n $bf16_source ]] ||
  { echo "compare_bert_train: the limits ($limits_origin) lack fma_f32_gflops_per_core or bf16_peak_*" >&2; exit 1; }
case $bf16_source in
  amx) bf16_name="AMX tdpbf16ps" ;;
  vdpbf16ps) bf16_name="AVX512-BF16 vdpbf16ps (no AMX)" ;;
  *) bf16_name="the f32 FMA peak: this CPU has neither AMX nor AVX512-BF16" ;;
esac
log "f32 FMA peak $fma_peak GFLOP/s per core ($fma_isa); bf16 peak $bf16_peak GFLOP/s per core ($bf16_name)"

# Multiply-add FLOPs of one training step, bert_train.cpp's step_flops(): the GEMMs and the
# attention products, backward twice the forward except the masked-LM decoder's (over the 15%
# of rows scored); from the shape fields of a result line.
step_flops() {
  awk -v L="$(json_num "$1" layers)" -v h="$(json_num "$1" hidden)" -v f="$(json_num "$1" ffn)" \
      -v V="$(json_num "$1" vocab)" -v s="$(json_num "$1" seq)" -v b="$(json_num "$1" batch)" \
      -v task="$(json_str "$1" task)" 'BEGIN {
    t = b * s
    enc = L * (2 * t * (4 * h * h + 2 * h * f) + 4 * t * s * h)
    if (task == "mlm") total = 3 * (enc + 2 * t * h * h) + 2 * t * h * V * (1 + 2 * 0.15)
    else total = 3 * (enc + 2 * b * (h * h + 2 * h))
    printf "%.6e", total }'
}
# MFU of a result line against a per-core peak in GFLOP/s: FLOPs / step time / (threads x peak).
mfu_of() {
  awk -v fl="$(step_flops "$1")" -v ms="$(json_num "$1" median_step_ms)" -v th="$(json_num "$1" threads)" \
      -v p="$2" 'BEGIN { if (ms > 0 && th > 0 && p > 0) printf "%.3f", fl / (ms / 1000) / (th * p * 1e9) }'
}

# ---- the PyTorch peer, exactly as shared/peer/README.md runs it, or a note why not
if [[ -z $peer_script ]]; then
  peer_script="$repo_root/../shared/peer/bert_ref.py"
  if [[ ! -f $peer_script ]]; then
    log "no shared peer at $peer_script: using bench/bert_train_peer.py (the same model, the same modes)"
    peer_script="$repo_root/bench/bert_train_peer.py"
  fi
fi
peer_script=$(realpath -m "$peer_script")
peer_cmd=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE
          GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736
          OMP_WAIT_POLICY=PASSIVE "$peer_python" "$peer_script")
# The flags of each mode (shared/peer/README.md's three). torch.compile compiles during its first
# steps, so that mode gets at least 5 warm-up steps, as the shared README runs it.
mode_flags() {
  case $1 in
    eager) ;;
    sdpa) echo "--sdpa --fused" ;;
    compile) echo "--sdpa --fused --compile --warmup $(( warmup > 5 ? warmup : 5 ))" ;;
  esac
}
# The peer gets each preset's sizes as explicit flags (the shared bert_ref.py has no bert-base
# preset), and --config where it has the preset, so that its JSON names it.
preset_flags() {
  case $1 in
    bert-tiny) echo "--config bert-tiny --layers 2 --hidden 128 --heads 2 --ffn 512" ;;
    bert-mini) echo "--config bert-mini --layers 4 --hidden 256 --heads 4 --ffn 1024" ;;
    bert-base) echo "--layers 12 --hidden 768 --heads 12 --ffn 3072" ;;
  esac
}
peer_ok=1 peer_note=""
if [[ ! -f $peer_script ]]; then
  peer_ok=0 peer_note="no peer program at $peer_script"
elif [[ ! -x $peer_python ]]; then
  peer_ok=0 peer_note="$peer_python not found (bash scripts/install_peer.sh installs the peer)"
elif ! "$peer_python" -c 'import torch' >/dev/null 2>&1; then
  peer_ok=0 peer_note="$peer_python cannot import torch (bash scripts/install_peer.sh installs the peer)"
fi
(( peer_ok )) || log "PyTorch peer skipped: $peer_note"
# The shared peer prints no peak RSS: GNU time measures it where installed (the same getrusage figure).
rss_cmd=()
[[ -x /usr/bin/time ]] && rss_cmd=(/usr/bin/time -q -f '%M')

timeout_cmd=()
(( timeout_s > 0 )) && timeout_cmd=(timeout "$timeout_s")

# Runs one program; prints its result line, or FAIL:<message> (its last stderr lines). A result
# line without peak_rss_mb gets the one GNU time measured, when it could.
run_one() {
  local out err rss rc=0
  err=$(mktemp) rss=$(mktemp)
  local wrap=()
  (( ${#rss_cmd[@]} )) && wrap=("${rss_cmd[@]}" -o "$rss")
  out=$("${timeout_cmd[@]}" "${wrap[@]}" "$@" 2>"$err") || rc=$?
  local line
  line=$(grep '"kind": *"result"' <<<"$out" | tail -n1 || true)
  if (( rc == 0 )) && [[ -n $line ]]; then
    local kb
    kb=$(grep -E '^[0-9]+$' "$rss" | tail -n1 || true)
    if [[ -z $(json_num "$line" peak_rss_mb) && -n $kb ]]; then
      line=$(sed "s/}[[:space:]]*\$/, \"peak_rss_mb\": $(awk -v k="$kb" 'BEGIN { printf "%.1f", k / 1024 }')}/" <<<"$line")
    fi
    echo "$line"
  else
    # progress redraws are carriage-return separated; keep what follows the last one
    local msg
    msg=$(tr '\r' '\n' <"$err" | grep -v '^\s*$' | grep -v -E '^(bert_train|\s*[0-9]+%)' | tail -n 3 | tr '\n' ' ' || true)
    (( rc == 124 )) && msg="timed out after ${timeout_s}s $msg"
    [[ -z $msg ]] && msg="exit status $rc, no result line"
    echo "FAIL:$msg"
  fi
  rm -f "$err" "$rss"
}

# Picks the reported run among "ms|line" entries: the fastest, or the lower median.
pick() {
  local sorted n idx
  sorted=$(sort -t'|' -k1,1g)
  n=$(grep -c . <<<"$sorted")
  if [[ $stat == best ]]; then idx=1; else idx=$(( (n + 1) / 2 )); fi
  sed -n "${idx}p" <<<"$sorted" | cut -d'|' -f2-
}

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
fmt() { [[ -n $1 ]] && printf '%.*f' "$2" "$1" || printf 'n/a'; }
# a bf16-peak MFU cell: the figure on bf16 rows, a dash on f32 rows
m16() { [[ $dtype == bf16 ]] && fmt "$1" 3 || printf -- '-'; }

rows=() failures=() mode_notes=()
load_start=$(loadavg)
for config in "${config_arr[@]}"; do
  for task in "${task_arr[@]}"; do
    for dtype in "${dtype_arr[@]}"; do
      for threads in "${thread_arr[@]}"; do
        common=(--task "$task" --dtype "$dtype" --threads "$threads" --batch "$batch" --seq "$seq"
                --warmup "$warmup" --steps "$steps")
        ember_args=(--config "$config" "${common[@]}" --peak-gflops "$fma_peak" "${extra[@]}")
        read -r -a preset <<<"$(preset_flags "$config")"
        ember_runs="" ember_fail=""
        declare -A peer_runs=() peer_fail=()
        # One round runs Ember and every peer mode; the order reverses from round to round so
        # that a drifting background load favours none of them.
        order=(ember)
        (( peer_ok )) && for m in "${mode_arr[@]}"; do order+=("$m"); done
        for (( r = 1; r <= rounds; r++ )); do
          round_order=("${order[@]}")
          if (( r % 2 == 0 )); then
            round_order=()
            for (( i = ${#order[@]} - 1; i >= 0; i-- )); do round_order+=("${order[i]}"); done
          fi
          for who in "${round_order[@]}"; do
            if [[ $who == ember ]]; then
              [[ -n $ember_fail ]] && continue
              log "$config $task $dtype ${threads}t round $r/$rounds: ember"
              res=$(run_one "$ember_bin" "${ember_args[@]}")
              if [[ $res == FAIL:* ]]; then ember_fail=${res#FAIL:}; continue; fi
              ember_runs+="$(json_num "$res" median_step_ms)|$res"$'\n'
            else
              [[ -z ${peer_fail[$who]:-} ]] || continue
              read -r -a mflags <<<"$(mode_flags "$who")"
              log "$config $task $dtype ${threads}t round $r/$rounds: pytorch $who"
              res=$(run_one "${peer_cmd[@]}" "${preset[@]}" "${common[@]}" "${mflags[@]}" "${extra[@]}")
              if [[ $res == FAIL:* ]]; then peer_fail[$who]=${res#FAIL:}; continue; fi
              # the row's preset and the mode in the line (a peer without the preset names its default)
              res=$(sed -e "s/\"config\": *\"[^\"]*\"/\"config\": \"$config\"/" \
                        -e "s/}[[:space:]]*\$/, \"peer_mode\": \"$who\"}/" <<<"$res")
              peer_runs[$who]+="$(json_num "$res" median_step_ms)|$res"$'\n'
            fi
            log "  $(json_num "$res" median_step_ms) ms/step (load $(loadavg))"
            [[ -n $raw_file ]] && echo "$res" >>"$raw_file"
          done
        done
        e_ms="" e_mfu="" e_mfu16="" e_rss="" p_ms="" p_mode="" p_mfu="" p_mfu16="" p_rss="" ratio=""
        if [[ -n $ember_runs ]]; then
          best=$(printf '%s' "$ember_runs" | pick)
          e_ms=$(json_num "$best" median_step_ms) e_mfu=$(json_num "$best" mfu) e_rss=$(json_num "$best" peak_rss_mb)
          [[ $dtype == bf16 ]] && e_mfu16=$(mfu_of "$best" "$bf16_peak")
        fi
        # a program (or peer mode) that failed in any round is reported as failed, not by its
        # lucky rounds; the peer's figure is the fastest mode that never failed
        mode_cells=()
        if (( peer_ok )); then
          for m in "${mode_arr[@]}"; do
            if [[ -n ${peer_fail[$m]:-} ]]; then
              failures+=("PyTorch ($m) $config $task $dtype ${threads}t: ${peer_fail[$m]}")
              mode_cells+=("$m failed")
              continue
            fi
            [[ -n ${peer_runs[$m]:-} ]] || continue
            line=$(printf '%s' "${peer_runs[$m]}" | pick)
            ms=$(json_num "$line" median_step_ms)
            mode_cells+=("$m $(fmt "$ms" 1)")
            if [[ -z $p_ms ]] || awk -v a="$ms" -v b="$p_ms" 'BEGIN { exit !(a < b) }'; then
              p_ms=$ms p_mode=$m p_line=$line
            fi
          done
          mode_notes+=("$config $task $dtype ${threads}t: $(IFS=';'; echo "${mode_cells[*]}" | sed 's/;/, /g')")
        fi
        if [[ -n $p_ms ]]; then
          p_rss=$(json_num "$p_line" peak_rss_mb) p_mfu=$(mfu_of "$p_line" "$fma_peak")
          [[ $dtype == bf16 ]] && p_mfu16=$(mfu_of "$p_line" "$bf16_peak")
        fi
        [[ -n $ember_fail ]] && { e_ms="" e_mfu="" e_mfu16="" e_rss=""; failures+=("Ember $config $task $dtype ${threads}t: $ember_fail"); }
        [[ -n $e_ms && -n $p_ms ]] && ratio=$(awk -v p="$p_ms" -v e="$e_ms" 'BEGIN { printf "%.2f", p / e }')
        e_cell=$(fmt "$e_ms" 1); [[ -n $ember_fail ]] && e_cell="failed"
        p_cell=$(fmt "$p_ms" 1); (( peer_ok )) && [[ -z $p_ms ]] && p_cell="failed"; (( peer_ok )) || p_cell="skipped"
        rows+=("| $config | $task | $dtype | $threads | $e_cell | $p_cell | ${p_mode:-n/a} | ${ratio:-n/a} | $(fmt "$e_mfu" 3) | $(fmt "$p_mfu" 3) | $(m16 "$e_mfu16") | $(m16 "$p_mfu16") | $(fmt "$e_rss" 0) | $(fmt "$p_rss" 0) |")
        unset peer_runs peer_fail
      done
    done
  done
done

fmt_or_na() { [[ -n $1 ]] && printf '%s GFLOP/s' "$1" || printf 'not available'; }
echo "BERT training step, batch $batch x seq $seq, $warmup warm-up + $steps timed steps per run, $stat of $rounds interleaved runs"
echo "load average at start: $load_start; at end: $(loadavg); $(nproc) CPUs"
echo "machine limits ($limits_origin): $(json_str "$limits" cpu); f32 FMA $fma_peak GFLOP/s per core ($fma_isa), ${fma_all:-n/a} on ${limits_threads:-?} threads;" \
     "bf16 per core: vdpbf16ps $(fmt_or_na "$vdp_peak"), AMX $(fmt_or_na "$amx_peak");" \
     "copy bandwidth, 1 thread: L1 $(limits_bw l1), L2 $(limits_bw l2), L3 $(limits_bw l3), memory $(limits_bw memory) GB/s"
echo "PyTorch: $(basename "$peer_script"), the fastest of modes ${mode_arr[*]} (eager: as written; sdpa: --sdpa --fused; compile: --sdpa --fused --compile)"
echo
echo "| config | task | dtype | threads | Ember ms/step | PyTorch ms/step | PyTorch mode | speed ratio (PyTorch/Ember) | Ember MFU | PyTorch MFU | Ember MFU, bf16 peak | PyTorch MFU, bf16 peak | Ember peak RSS MB | PyTorch peak RSS MB |"
echo "|---|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"
printf '%s\n' "${rows[@]}"
echo
echo "MFU: GEMM + attention FLOPs per step (bert_train.cpp's count, backward twice the forward, the MLM decoder's over its scored 15%) over the"
echo "median step time, divided by threads x a per-core peak of this machine. \"MFU\": the f32 FMA peak,"
echo "$fma_peak GFLOP/s per core ($fma_isa), for every row. \"bf16 peak\" (bf16 rows): $bf16_peak GFLOP/s per core, $bf16_name."
if (( peer_ok )) && (( ${#mode_notes[@]} )); then
  echo
  echo "PyTorch ms/step by mode ($stat of $rounds runs each):"
  for n in "${mode_notes[@]}"; do echo "- $n"; done
fi
(( peer_ok )) || { echo; echo "PyTorch peer skipped: $peer_note"; }
if (( ${#failures[@]} )); then
  echo
  for f in "${failures[@]}"; do echo "- failed: $f"; done
fi
