#!/usr/bin/env bash
# The CNN and the GPT of the examples beside PyTorch 2.15 (../shared/peer/README.md's environment:
# bash scripts/install_peer.sh), training steps alternating in one run: Ember's
# build/bench/models_train and bench/models_train_peer.py in its eager, SDPA + fused AdamW and
# torch.compile modes, the order reversed every round; the peer's figure is its fastest mode.
# Prints a table of median step times, images/s or tokens/s, the ratio and peak RSS (GNU time).
#
#   bash bench/compare_models_train.sh                               # cnn,gpt x f32,bf16, 2 rounds
#   bash bench/compare_models_train.sh --models cnn --dtypes f32 --rounds 1 --peer-modes eager
# Options: --models LIST --dtypes LIST --rounds N --threads T --steps N --warmup N
#          --peer-modes LIST (eager,sdpa,compile) --build DIR --peer-python PATH --timeout S
set -euo pipefail
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
models=cnn,gpt dtypes=f32,bf16 rounds=2 threads=2 steps=10 warmup=3 peer_modes=eager,sdpa,compile
build=$repo_root/build peer_python=$HOME/.cache/ember-peer/bin/python timeout_s=0
while (($#)); do
  case $1 in
    --models) models=$2 ;; --dtypes) dtypes=$2 ;; --rounds) rounds=$2 ;; --threads) threads=$2 ;;
    --steps) steps=$2 ;; --warmup) warmup=$2 ;; --peer-modes) peer_modes=$2 ;; --build) build=$2 ;;
    --peer-python) peer_python=$2 ;; --timeout) timeout_s=$2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "compare_models_train.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift 2
done
ember_bin=$build/bench/models_train
[[ -x $ember_bin ]] || { echo "compare_models_train.sh: no $ember_bin (ninja -C $build models_train)" >&2; exit 2; }
"$peer_python" -c 'import torch' 2>/dev/null ||
  { echo "compare_models_train.sh: $peer_python cannot import torch (bash scripts/install_peer.sh)" >&2; exit 2; }
peer=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE
      GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736
      OMP_WAIT_POLICY=PASSIVE "$peer_python" "$repo_root/bench/models_train_peer.py")
timeout_cmd=()
((timeout_s > 0)) && timeout_cmd=(timeout "$timeout_s")

# Runs one program under GNU time; prints "<median_step_ms> <items_per_s> <peak_rss_mb>" or "FAIL".
run_one() {
  local out rss line
  rss=$(mktemp)
  if out=$("${timeout_cmd[@]}" /usr/bin/time -q -f '%M' -o "$rss" "$@" 2>/dev/null) &&
     line=$(grep '"kind": *"result"' <<<"$out" | tail -n1) && [[ -n $line ]]; then
    python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print(r["median_step_ms"], r["items_per_s"], round(int(sys.argv[2])/1024))' \
      "$line" "$(tail -n1 "$rss")"
  else
    echo FAIL
  fi
  rm -f "$rss"
}
mode_flags() {
  case $1 in
    eager) ;;
    sdpa) echo "--sdpa --fused" ;;
    compile) echo "--sdpa --fused --compile --warmup $((warmup > 5 ? warmup : 5))" ;;
  esac
}

echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $threads threads; $(date -u +%F)"
declare -A best best_rss best_mode ember ember_rss
for ((round = 0; round < rounds; ++round)); do
  for model in ${models//,/ }; do
    for dtype in ${dtypes//,/ }; do
      key=$model/$dtype
      common=(--model "$model" --dtype "$dtype" --threads "$threads" --steps "$steps")
      order=(ember ${peer_modes//,/ })
      ((round % 2)) && order=($(printf '%s\n' "${order[@]}" | tac))
      for who in "${order[@]}"; do
        if [[ $who == ember ]]; then
          r=$(run_one "$ember_bin" "${common[@]}" --warmup "$warmup")
        else
          # shellcheck disable=SC2046
          r=$(run_one "${peer[@]}" "${common[@]}" --warmup "$warmup" $(mode_flags "$who"))
        fi
        echo "round $((round + 1)) $key $who: ${r}" >&2
        [[ $r == FAIL ]] && continue
        read -r ms items rss <<<"$r"
        if [[ $who == ember ]]; then
          if [[ -z ${ember[$key]:-} ]] || python3 -c "import sys; sys.exit(not $ms < ${ember[$key]})"; then
            ember[$key]=$ms ember_rss[$key]=$rss
          fi
        elif [[ -z ${best[$key]:-} ]] || python3 -c "import sys; sys.exit(not $ms < ${best[$key]})"; then
          best[$key]=$ms best_rss[$key]=$rss best_mode[$key]=$who
        fi
      done
    done
  done
done
echo "| model | dtype | Ember ms/step | PyTorch 2.15 best ms/step (mode) | ratio | peak RSS Ember / PyTorch MB |"
echo "|---|---|---:|---:|---:|---:|"
for model in ${models//,/ }; do
  for dtype in ${dtypes//,/ }; do
    key=$model/$dtype
    e=${ember[$key]:-} p=${best[$key]:-}
    ratio=-
    [[ -n $e && -n $p ]] && ratio=$(python3 -c "print(f'{$p / $e:.2f}')")
    echo "| $model | $dtype | ${e:-FAIL} | ${p:-FAIL} (${best_mode[$key]:--}) | $ratio | ${ember_rss[$key]:--} / ${best_rss[$key]:--} |"
  done
done
