#!/usr/bin/env bash
# Sharded data parallel on the CPU, Ember against PyTorch FSDP2 / DDP (Gloo), run in alternation.
# For each rank count and mode (ddp, NO_SHARD, SHARD_OPTIMIZER, SHARD_GRAD_OP, FULL_SHARD,
# FULL_SHARD_AC) Ember's fsdp_scaling and fsdp_scaling_peer.py train BERT MLM at the same
# per-rank batch, one thread per rank. Prints a Markdown table: best step time of the rounds,
# peer/Ember ratio, and per-rank peak memory (the largest of the ranks and rounds). Builds nothing.
#
#   bench/fsdp_scaling.sh                          # bert-mini, 2 ranks, batch 4 x 128, 2 rounds
#   bench/fsdp_scaling.sh --ranks 2,4 --rounds 1 --modes ddp,FULL_SHARD --config bert-base
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
config=bert-mini ranks=2 threads=1 batch=4 seq=128 warmup=2 steps=5 rounds=2
modes=ddp,NO_SHARD,SHARD_OPTIMIZER,SHARD_GRAD_OP,FULL_SHARD,FULL_SHARD_AC
build_dir="$repo_root/build" peer_python=${EMBER_PEER:-$HOME/.cache/ember-peer}/bin/python
while [[ $# -gt 0 ]]; do
  case "$1" in
    --config) config=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --build-dir) build_dir=$2; shift 2 ;;
    --peer-python) peer_python=$2; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "fsdp_scaling: unknown option $1" >&2; exit 2 ;;
  esac
done

ember_cli="$build_dir/bin/ember" bench_bin="$build_dir/bench/fsdp_scaling"
[[ -x $ember_cli && -x $bench_bin ]] || { echo "fsdp_scaling: build first ($ember_cli, $bench_bin)" >&2; exit 1; }
have_peer=0
if "$peer_python" -c "import torch.distributed as d; assert d.is_gloo_available()" 2>/dev/null; then have_peer=1; fi
# PyTorch runs under the settings of the reference peer (see README_bert.md); Ember as it is.
peer_env=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE
  GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736 OMP_WAIT_POLICY=PASSIVE)
common=(--config "$config" --batch "$batch" --seq "$seq" --warmup "$warmup" --steps "$steps" --threads "$threads")

# The JSON result lines of every rank, one a line (ranks may print on one line together).
results() { grep -o '{"kind": "result"[^}]*}'; }
field() { sed -n "s/.*\"$1\": \([0-9.e+-]*\).*/\1/p"; }
min() { sort -g | head -1; }
max() { sort -g | tail -1; }
fmt() { [[ -n $1 ]] && printf '%.*f' "$2" "$1" || printf -- '-'; }

ember_run() {  # world mode -> the ranks' JSON lines
  EMBER_PROGRESS=${EMBER_PROGRESS:-off} "$ember_cli" launch --num_processes "$1" --num_cpu_threads_per_process "$threads" "$bench_bin" \
    --mode "$2" "${common[@]}" | results
}
peer_run() {
  "${peer_env[@]}" "$peer_python" "$repo_root/bench/fsdp_scaling_peer.py" --mode "$2" --world-size "$1" \
    "${common[@]}" | results
}

# Runs `"$@"` (ember_run or peer_run), once more if it fails (PyTorch's Gloo ranks now and then
# abort at teardown); a run that fails twice leaves its cell empty rather than ending the table.
attempt() {
  local out
  if out=$("$@"); then printf '%s\n' "$out"; return; fi
  echo "fsdp_scaling: '$*' failed; running it once more" >&2
  if out=$("$@"); then printf '%s\n' "$out"; return; fi
  echo "fsdp_scaling: '$*' failed twice; its cell stays empty" >&2
}

grep -m1 'Model name' <(lscpu) | sed 's/^ *Model name: */CPU: /'
echo
echo "| ranks | mode | PyTorch counterpart | Ember ms/step | peer ms/step | peer/Ember | Ember peak alloc MB | Ember held MB | Ember peak RSS MB | peer peak RSS MB |"
echo "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"
IFS=, read -ra rank_list <<<"$ranks"
IFS=, read -ra mode_list <<<"$modes"
for n in "${rank_list[@]}"; do
  for mode in "${mode_list[@]}"; do
    e_ms=() e_alloc=() e_held=() e_rss=() p_ms=() p_rss=() peer_name=-
    for ((r = 0; r < rounds; ++r)); do
      lines=$(attempt ember_run "$n" "$mode")
      e_ms+=($(field median_step_ms <<<"$lines" | head -1)); e_alloc+=($(field peak_alloc_mb <<<"$lines"))
      e_held+=($(field held_alloc_mb <<<"$lines")); e_rss+=($(field peak_rss_mb <<<"$lines"))
      if ((have_peer)); then
        lines=$(attempt peer_run "$n" "$mode")
        p_ms+=($(field median_step_ms <<<"$lines" | head -1)); p_rss+=($(field peak_rss_mb <<<"$lines"))
        peer_name=$(sed -n 's/.*"peer": "\([^"]*\)".*/\1/p' <<<"$lines" | head -1)
      fi
    done
    te=$(printf '%s\n' "${e_ms[@]}" | min) tp=$( ((${#p_ms[@]})) && printf '%s\n' "${p_ms[@]}" | min || true)
    ratio=$([[ -n $tp && -n $te ]] && awk "BEGIN{print $tp / $te}" || true)
    printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$n" "$mode" "$peer_name" "$(fmt "$te" 0)" \
      "$(fmt "$tp" 0)" "$(fmt "$ratio" 2)" "$(fmt "$(printf '%s\n' "${e_alloc[@]}" | max)" 0)" \
      "$(fmt "$(printf '%s\n' "${e_held[@]}" | max)" 0)" "$(fmt "$(printf '%s\n' "${e_rss[@]}" | max)" 0)" \
      "$(fmt "$( ((${#p_rss[@]})) && printf '%s\n' "${p_rss[@]}" | max || true)" 0)"
  done
done
echo
echo "config $config MLM, per-rank batch $batch x seq $seq, $threads thread(s) per rank, median of $steps steps" \
  "after $warmup warm-up, best of $rounds round(s); memory: the largest rank"
