#!/usr/bin/env bash
# Ember's BERT training step against the same model in PyTorch, on this machine, run in
# alternation so that both see the same background load. Prints a Markdown table.
#
#   bench/compare_bert_train.sh                                  # bert-mini, mlm+cls, f32, 2 threads
#   bench/compare_bert_train.sh --configs bert-mini,bert-tiny --tasks cls --dtypes f32,bf16 --rounds 5
#
# See bench/README_bert.md for every flag and what the columns mean.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: bench/compare_bert_train.sh [options] [-- extra flags for both programs]

  --configs LIST     comma-separated presets: bert-mini, bert-tiny          (bert-mini)
  --tasks LIST       mlm, cls                                               (mlm,cls)
  --dtypes LIST      f32, bf16                                              (f32)
  --threads LIST     thread counts                                          (2)
  --batch N          sequences per step                                     (16)
  --seq N            tokens per sequence                                    (128)
  --warmup N         untimed steps per run                                  (3)
  --steps N          timed steps per run (each run reports their median)    (10)
  --rounds N         runs of each program per row, interleaved              (3)
  --stat best|median which run of the rounds a row reports                  (best)
  --build-dir DIR    Ember build directory holding bench/bert_train         (<repo>/build)
  --ember-bin PATH   use this bert_train as is (no build)
  --no-build         do not configure/build; the binary must already exist
  --timeout SEC      kill a run that takes longer (0 = never)               (0)
  --raw FILE         also append every JSON result line to FILE
  --peer-python PATH interpreter for the PyTorch peer (~/.cache/ember-peer/bin/python,
                     installed by scripts/install_peer.sh)
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
    --timeout) need_value "$@"; timeout_s=$2; shift 2 ;;
    --raw) need_value "$@"; raw_file=$2; shift 2 ;;
    --peer-python) need_value "$@"; peer_python=$2; shift 2 ;;
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
for c in "${config_arr[@]}"; do [[ $c == bert-mini || $c == bert-tiny ]] || { echo "compare_bert_train: unknown config $c" >&2; exit 2; }; done
for t in "${task_arr[@]}"; do [[ $t == mlm || $t == cls ]] || { echo "compare_bert_train: unknown task $t" >&2; exit 2; }; done
for d in "${dtype_arr[@]}"; do [[ $d == f32 || $d == bf16 ]] || { echo "compare_bert_train: unknown dtype $d" >&2; exit 2; }; done
for n in "${thread_arr[@]}"; do is_count "$n" && (( n > 0 )) || { echo "compare_bert_train: bad thread count $n" >&2; exit 2; }; done

log() { echo "compare_bert_train: $*" >&2; }

# ---- Ember's binary: given, found, or built
if [[ -z $ember_bin ]]; then
  ember_bin="$build_dir/bench/bert_train"
  if (( ! no_build )); then
    if [[ ! -f $build_dir/build.ninja ]]; then
      log "configuring $build_dir"
      cmake -S "$repo_root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DEMBER_BUILD_BENCH=ON -DEMBER_BUILD_TESTS=OFF -DEMBER_BUILD_EXAMPLES=OFF >&2
    fi
    log "building bert_train in $build_dir"
    ninja -C "$build_dir" -j "$(nproc)" bert_train >&2
  fi
fi
[[ -x $ember_bin ]] || { echo "compare_bert_train: no Ember binary at $ember_bin (build it or pass --ember-bin)" >&2; exit 1; }

# ---- the PyTorch peer, exactly as shared/peer/README.md runs it, or a note why not
peer_script="$repo_root/bench/bert_train_peer.py"
peer_cmd=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE
          GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736
          OMP_WAIT_POLICY=PASSIVE "$peer_python" "$peer_script")
peer_ok=1 peer_note=""
if [[ ! -x $peer_python ]]; then
  peer_ok=0 peer_note="$peer_python not found (bash scripts/install_peer.sh installs the peer)"
elif ! "$peer_python" -c 'import torch' >/dev/null 2>&1; then
  peer_ok=0 peer_note="$peer_python cannot import torch (bash scripts/install_peer.sh installs the peer)"
fi
(( peer_ok )) || log "PyTorch peer skipped: $peer_note"

timeout_cmd=()
(( timeout_s > 0 )) && timeout_cmd=(timeout "$timeout_s")

# Value of a numeric field in a one-line JSON object ("" when absent).
json_num() { sed -n "s/.*\"$2\": *\\(-\\{0,1\\}[0-9][0-9.eE+-]*\\).*/\\1/p" <<<"$1" | head -n1; }

# Runs one program; prints its result line, or FAIL:<message> (its last stderr lines).
run_one() {
  local out err rc=0
  err=$(mktemp)
  out=$("${timeout_cmd[@]}" "$@" 2>"$err") || rc=$?
  local line
  line=$(grep '"kind": *"result"' <<<"$out" | tail -n1 || true)
  if (( rc == 0 )) && [[ -n $line ]]; then
    echo "$line"
  else
    # progress redraws are carriage-return separated; keep what follows the last one
    local msg
    msg=$(tr '\r' '\n' <"$err" | grep -v '^\s*$' | grep -v -E '^(bert_train|\s*[0-9]+%)' | tail -n 3 | tr '\n' ' ' || true)
    (( rc == 124 )) && msg="timed out after ${timeout_s}s $msg"
    [[ -z $msg ]] && msg="exit status $rc, no result line"
    echo "FAIL:$msg"
  fi
  rm -f "$err"
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

rows=() failures=()
load_start=$(loadavg)
for config in "${config_arr[@]}"; do
  for task in "${task_arr[@]}"; do
    for dtype in "${dtype_arr[@]}"; do
      for threads in "${thread_arr[@]}"; do
        args=(--config "$config" --task "$task" --dtype "$dtype" --threads "$threads" --batch "$batch"
              --seq "$seq" --warmup "$warmup" --steps "$steps" "${extra[@]}")
        ember_runs="" peer_runs="" ember_fail="" peer_fail=""
        for (( r = 1; r <= rounds; r++ )); do
          # alternate who goes first so that a drifting background load favours neither
          order=(ember peer); (( r % 2 == 0 )) && order=(peer ember)
          for who in "${order[@]}"; do
            if [[ $who == ember ]]; then
              [[ -n $ember_fail ]] && continue
              log "$config $task $dtype ${threads}t round $r/$rounds: ember"
              res=$(run_one "$ember_bin" "${args[@]}")
              if [[ $res == FAIL:* ]]; then ember_fail=${res#FAIL:}; continue; fi
              ember_runs+="$(json_num "$res" median_step_ms)|$res"$'\n'
            else
              (( peer_ok )) && [[ -z $peer_fail ]] || continue
              log "$config $task $dtype ${threads}t round $r/$rounds: pytorch"
              res=$(run_one "${peer_cmd[@]}" "${args[@]}")
              if [[ $res == FAIL:* ]]; then peer_fail=${res#FAIL:}; continue; fi
              peer_runs+="$(json_num "$res" median_step_ms)|$res"$'\n'
            fi
            log "  $(json_num "$res" median_step_ms) ms/step (load $(loadavg))"
            [[ -n $raw_file ]] && echo "$res" >>"$raw_file"
          done
        done
        e_ms="" e_mfu="" e_rss="" p_ms="" p_rss="" ratio=""
        if [[ -n $ember_runs ]]; then
          best=$(printf '%s' "$ember_runs" | pick)
          e_ms=$(json_num "$best" median_step_ms) e_mfu=$(json_num "$best" mfu) e_rss=$(json_num "$best" peak_rss_mb)
        fi
        if [[ -n $peer_runs ]]; then
          best=$(printf '%s' "$peer_runs" | pick)
          p_ms=$(json_num "$best" median_step_ms) p_rss=$(json_num "$best" peak_rss_mb)
        fi
        # a program that failed in any round is reported as failed, not by its lucky rounds
        [[ -n $ember_fail ]] && { e_ms="" e_mfu="" e_rss=""; failures+=("Ember $config $task $dtype ${threads}t: $ember_fail"); }
        [[ -n $peer_fail ]] && { p_ms="" p_rss=""; failures+=("PyTorch $config $task $dtype ${threads}t: $peer_fail"); }
        [[ -n $e_ms && -n $p_ms ]] && ratio=$(awk -v p="$p_ms" -v e="$e_ms" 'BEGIN { printf "%.2f", p / e }')
        e_cell=$(fmt "$e_ms" 1); [[ -n $ember_fail ]] && e_cell="failed"
        p_cell=$(fmt "$p_ms" 1); [[ -n $peer_fail ]] && p_cell="failed"; (( peer_ok )) || p_cell="skipped"
        rows+=("| $config | $task | $dtype | $threads | $e_cell | $p_cell | ${ratio:-n/a} | $(fmt "$e_mfu" 3) | $(fmt "$e_rss" 0) | $(fmt "$p_rss" 0) |")
      done
    done
  done
done

echo "BERT training step, batch $batch x seq $seq, $warmup warm-up + $steps timed steps per run, $stat of $rounds interleaved runs"
echo "load average at start: $load_start; at end: $(loadavg); $(nproc) CPUs"
echo
echo "| config | task | dtype | threads | Ember ms/step | PyTorch ms/step | speed ratio (PyTorch/Ember) | Ember MFU | Ember peak RSS MB | PyTorch peak RSS MB |"
echo "|---|---|---|---|---:|---:|---:|---:|---:|---:|"
printf '%s\n' "${rows[@]}"
(( peer_ok )) || { echo; echo "PyTorch peer skipped: $peer_note"; }
if (( ${#failures[@]} )); then
  echo
  for f in "${failures[@]}"; do echo "- failed: $f"; done
fi
