#!/usr/bin/env bash
# Data parallel over a slow link: two "machines" as two network namespaces joined by a veth
# pair shaped with tc's token-bucket filter (tbf), one rank of one thread on each side, BERT-mini
# CLS and MLM steps. For each rate and task, Ember's DDP variants and PyTorch DDP (Gloo, with its
# bf16 and PowerSGD hooks) run in alternation; best of --rounds. Prints a Markdown table: step
# time, communication time and its hidden share (Ember's counters), and bytes sent per step.
# Needs root (ip netns, tc); without it, it says so and exits with status 2.
#
#   bash bench/ddp_shaped_link.sh                              # 10gbit and 1gbit, cls and mlm, 1 round
#   bash bench/ddp_shaped_link.sh --rates 1gbit --tasks cls --rounds 2 --steps 8
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rates=10gbit,1gbit tasks=cls,mlm batch=16 seq=128 warmup=3 steps=6 rounds=1
build_dir="$repo_root/build" peer_python=${EMBER_PEER:-$HOME/.cache/ember-peer}/bin/python
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rates) rates=$2; shift 2 ;;
    --tasks) tasks=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --build-dir) build_dir=$2; shift 2 ;;
    --peer-python) peer_python=$2; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "ddp_shaped_link: unknown option $1" >&2; exit 2 ;;
  esac
done

if [[ $(id -u) -ne 0 ]] || ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
  echo "ddp_shaped_link: needs root and iproute2 (ip netns, tc) to build the shaped link; not run" >&2
  exit 2
fi
ember_cli="$build_dir/bin/ember" bench_bin="$build_dir/bench/ddp_scaling"
[[ -x $ember_cli && -x $bench_bin ]] || { echo "ddp_shaped_link: build first ($ember_cli, $bench_bin)" >&2; exit 1; }
have_peer=0
if "$peer_python" -c "import torch.distributed as d; assert d.is_gloo_available()" 2>/dev/null; then have_peer=1; fi
peer_env=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE
  GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736 OMP_WAIT_POLICY=PASSIVE)

# ---- the two machines
tag=$$
ns=("eshl0_$tag" "eshl1_$tag") dev=("esv0_$tag" "esv1_$tag") addr=(10.213.0.1 10.213.0.2)
work=$(mktemp -d)
cleanup() {
  for n in "${ns[@]}"; do ip netns del "$n" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
ip netns add "${ns[0]}"
ip netns add "${ns[1]}"
ip link add "${dev[0]}" type veth peer name "${dev[1]}"
for m in 0 1; do
  ip link set "${dev[m]}" netns "${ns[m]}"
  ip -n "${ns[m]}" addr add "${addr[m]}/24" dev "${dev[m]}"
  ip -n "${ns[m]}" link set "${dev[m]}" up
  ip -n "${ns[m]}" link set lo up
done

shape() {  # rate, e.g. 1gbit: both directions, a 10 ms burst
  local mbit
  case "$1" in
    *gbit) mbit=$((${1%gbit} * 1000)) ;;
    *mbit) mbit=${1%mbit} ;;
    *) echo "ddp_shaped_link: rate must end in gbit or mbit, got $1" >&2; exit 2 ;;
  esac
  for m in 0 1; do
    tc -n "${ns[m]}" qdisc replace dev "${dev[m]}" root tbf rate "$1" burst "$((mbit * 1250))" latency 100ms
  done
}

field() { sed -n "s/.*\"$1\": \([0-9.e+-]*\).*/\1/p" | head -1; }
port() { echo $((20000 + RANDOM % 20000)); }

ember_job() {  # task, ddp_scaling flags... -> rank 0's JSON line
  local task=$1 p
  shift
  p=$(port)
  local common=(launch --num_machines 2 --num_processes 2 --main_process_ip "${addr[0]}" --main_process_port "$p"
    --num_cpu_threads_per_process 1 "$bench_bin" --config bert-mini --task "$task" --batch "$batch" --seq "$seq"
    --warmup "$warmup" --steps "$steps" --threads 1 "$@")
  ip netns exec "${ns[1]}" "$ember_cli" "${common[@]:0:1}" --machine_rank 1 "${common[@]:1}" >"$work/m1.log" 2>&1 &
  local other=$!
  ip netns exec "${ns[0]}" "$ember_cli" "${common[@]:0:1}" --machine_rank 0 "${common[@]:1}" 2>"$work/m0.err" |
    sed -n 's/^\[rank 0\] //p' | grep '"kind": "result"' || true
  wait "$other" || true
}
peer_job() {  # task, comm hook -> rank 0's JSON line
  local p
  p=$(port)
  local common=(--config bert-mini --task "$1" --world-size 2 --threads 1 --batch "$batch" --seq "$seq"
    --warmup "$warmup" --steps "$steps" --comm-hook "$2" --master "${addr[0]}:$p")
  ip netns exec "${ns[1]}" "${peer_env[@]}" GLOO_SOCKET_IFNAME="${dev[1]}" "$peer_python" \
    "$repo_root/bench/ddp_scaling_peer.py" "${common[@]}" --rank 1 >"$work/p1.log" 2>&1 &
  local other=$!
  ip netns exec "${ns[0]}" "${peer_env[@]}" GLOO_SOCKET_IFNAME="${dev[0]}" "$peer_python" \
    "$repo_root/bench/ddp_scaling_peer.py" "${common[@]}" --rank 0 2>"$work/p0.err" | grep '"kind": "result"' || true
  wait "$other" || true
}

# Each Ember variant adds one thing to the one before it (bf16 and PowerSGD are alternatives).
variant_names=("first bucket 25 MB" "reordered, 1 MB first bucket" "+ sparse embeddings" "+ bf16 compression"
  "+ PowerSGD r=4 (instead of bf16)" "+ bf16 + optimizer overlap")
variant_flags=("--first-bucket-mb 25" "" "--sparse-embeddings yes" "--sparse-embeddings yes --comm-hook bf16"
  "--sparse-embeddings yes --comm-hook power_sgd --powersgd-rank 4"
  "--sparse-embeddings yes --comm-hook bf16 --overlap-optimizer yes")
peer_hooks=(no bf16 power_sgd)

declare -A best_ms comm hidden bytes
keep() {  # key, JSON line
  local ms
  ms=$(field median_step_ms <<<"$2")
  [[ -n $ms ]] || return 0
  if [[ -z ${best_ms[$1]:-} ]] || awk "BEGIN{exit !($ms < ${best_ms[$1]})}"; then
    best_ms[$1]=$ms
    comm[$1]=$(field allreduce_ms_per_step <<<"$2")
    hidden[$1]=$(field hidden_share <<<"$2")
    bytes[$1]=$(field bytes_sent_per_step <<<"$2")
  fi
}

IFS=, read -ra rate_list <<<"$rates"
IFS=, read -ra task_list <<<"$tasks"
for rate in "${rate_list[@]}"; do
  shape "$rate"
  for task in "${task_list[@]}"; do
    for ((r = 0; r < rounds; ++r)); do
      for v in "${!variant_names[@]}"; do
        # shellcheck disable=SC2086  # the flags are words
        keep "$rate/$task/ember/$v" "$(ember_job "$task" ${variant_flags[v]})"
        if ((have_peer && v < ${#peer_hooks[@]})); then
          keep "$rate/$task/peer/$v" "$(peer_job "$task" "${peer_hooks[v]}")"
        fi
      done
    done
  done
done

mb() { [[ -n $1 ]] && awk "BEGIN{printf \"%.1f\", $1 / 1048576}" || printf '-'; }
echo "| link | task | framework | variant | ms/step | comm ms/step | hidden | MB sent/step |"
echo "|---|---|---|---|---:|---:|---:|---:|"
for rate in "${rate_list[@]}"; do
  for task in "${task_list[@]}"; do
    for v in "${!variant_names[@]}"; do
      k="$rate/$task/ember/$v"
      if [[ -n ${best_ms[$k]:-} ]]; then
        printf '| %s | %s | Ember | %s | %.0f | %.0f | %.0f%% | %s |\n' "$rate" "$task" "${variant_names[v]}" \
          "${best_ms[$k]}" "${comm[$k]}" "$(awk "BEGIN{print ${hidden[$k]} * 100}")" "$(mb "${bytes[$k]}")"
      else
        printf '| %s | %s | Ember | %s | failed | | | |\n' "$rate" "$task" "${variant_names[v]}"
      fi
    done
    for v in "${!peer_hooks[@]}"; do
      ((have_peer)) || break
      k="$rate/$task/peer/$v"
      printf '| %s | %s | PyTorch DDP | %s | %s | | | |\n' "$rate" "$task" "comm hook ${peer_hooks[v]}" \
        "$([[ -n ${best_ms[$k]:-} ]] && printf '%.0f' "${best_ms[$k]}" || echo failed)"
    done
  done
done
echo
echo "bert-mini, 2 ranks (one per namespace) x 1 thread, per-rank batch $batch x seq $seq, median of $steps steps" \
  "after $warmup, best of $rounds round(s); $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores"
((have_peer)) || echo "PyTorch peer not found at $peer_python (../shared/peer/README.md sets it up)"
