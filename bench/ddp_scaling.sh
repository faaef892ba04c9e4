#!/usr/bin/env bash
# Data-parallel weak scaling on the CPU, Ember against PyTorch DDP (Gloo), run in alternation.
# For each task: 1 rank x T threads and N ranks x T threads at the same per-rank batch;
# efficiency = T(1 rank) / T(N ranks) (1.0 = perfect weak scaling). Prints a Markdown table.
#
#   bench/ddp_scaling.sh                     # bert-mini, cls and mlm, 2 ranks x 1 thread, 3 rounds
#   bench/ddp_scaling.sh --tasks cls --rounds 5 --build-dir build
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
config=bert-mini tasks=cls,mlm ranks=2 threads=1 batch=16 seq=128 warmup=3 steps=10 rounds=3
build_dir="$repo_root/build" peer_python=${EMBER_PEER:-$HOME/.cache/ember-peer}/bin/python
while [[ $# -gt 0 ]]; do
  case "$1" in
    --config) config=$2; shift 2 ;;
    --tasks) tasks=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --build-dir) build_dir=$2; shift 2 ;;
    --peer-python) peer_python=$2; shift 2 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "ddp_scaling: unknown option $1" >&2; exit 2 ;;
  esac
done

ember_cli="$build_dir/bin/ember" bench_bin="$build_dir/bench/ddp_scaling"
[[ -x $ember_cli && -x $bench_bin ]] || { echo "ddp_scaling: build first ($ember_cli, $bench_bin)" >&2; exit 1; }
have_peer=0
if "$peer_python" -c "import torch.distributed as d; assert d.is_gloo_available()" 2>/dev/null; then have_peer=1; fi
# PyTorch runs under the settings of the reference peer (see README_bert.md); Ember as it is.
peer_env=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE
  GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736 OMP_WAIT_POLICY=PASSIVE)

field() { sed -n "s/.*\"$1\": \([0-9.e+-]*\).*/\1/p" | head -1; }
best() { sort -g | head -1; }

ember_run() {  # world task -> JSON line
  "$ember_cli" launch --num_processes "$1" --num_cpu_threads_per_process "$threads" "$bench_bin" \
    --config "$config" --task "$2" --batch "$batch" --seq "$seq" --warmup "$warmup" --steps "$steps" \
    --threads "$threads" | sed -n 's/^\[rank 0\] //p' | grep '"kind": "result"'
}
peer_once() {
  "${peer_env[@]}" "$peer_python" "$repo_root/bench/ddp_scaling_peer.py" --config "$config" --task "$2" \
    --world-size "$1" --threads "$threads" --batch "$batch" --seq "$seq" --warmup "$warmup" --steps "$steps" \
    | grep '"kind": "result"' || true
}
peer_run() {  # torch's Gloo teardown aborts now and then ("terminate called..."): one retry
  local line
  line=$(peer_once "$@")
  [[ -n $line ]] || line=$(peer_once "$@")
  echo "$line"
}

echo "| task | framework | 1 rank ms/step | $ranks ranks ms/step | efficiency | all-reduce hidden |"
echo "|---|---|---|---|---|---|"
IFS=, read -ra task_list <<<"$tasks"
for task in "${task_list[@]}"; do
  e1=() eN=() hidden=() p1=() pN=()
  for ((r = 0; r < rounds; ++r)); do
    line=$(ember_run 1 "$task"); e1+=("$(field median_step_ms <<<"$line")")
    line=$(ember_run "$ranks" "$task"); eN+=("$(field median_step_ms <<<"$line")"); hidden+=("$(field hidden_share <<<"$line")")
    if ((have_peer)); then
      line=$(peer_run 1 "$task"); p1+=("$(field median_step_ms <<<"$line")")
      line=$(peer_run "$ranks" "$task"); pN+=("$(field median_step_ms <<<"$line")")
    fi
  done
  t1=$(printf '%s\n' "${e1[@]}" | best) tN=$(printf '%s\n' "${eN[@]}" | best)
  h=$(printf '%s\n' "${hidden[@]}" | sort -g | tail -1)
  printf '| %s | Ember | %.1f | %.1f | %.2f | %.0f%% |\n' "$task" "$t1" "$tN" "$(awk "BEGIN{print $t1 / $tN}")" \
    "$(awk "BEGIN{print $h * 100}")"
  if ((have_peer)); then
    t1=$(printf '%s\n' "${p1[@]}" | best) tN=$(printf '%s\n' "${pN[@]}" | best)
    printf '| %s | PyTorch DDP (Gloo) | %.1f | %.1f | %.2f | |\n' "$task" "$t1" "$tN" "$(awk "BEGIN{print $t1 / $tN}")"
  fi
done
echo
echo "config $config, per-rank batch $batch x seq $seq, $threads thread(s) per rank, best of $rounds rounds"
