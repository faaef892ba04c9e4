#!/usr/bin/env bash
# One program, unchanged, under every launcher a cluster uses: the SST-2 Accelerator example
# (a short run: 480 phrases, batch 8, 60 optimizer steps on 2 ranks x 1 thread) and the
# collectives snippet, started by
#   - `ember launch --num_processes 2` (the reference),
#   - Open MPI's `mpirun -np 2` (ranks from OMPI_COMM_WORLD_*, port from the MPI job's id),
#   - `srun -n 2 --cpus-per-task 1` on a real one-node Slurm cluster (slurm_cluster.sh),
#   - an `sbatch` script that runs `srun --ntasks-per-node=1 ember launch` (one launcher a node),
# must print the same losses (metrics.jsonl) and dev accuracy, and the snippet must agree.
#   bash tests/cluster/launchers_match.sh BUILD_DIR
# Exits 77 (a skip for CTest) with "SKIP: <reason>" when mpirun or the Slurm daemons cannot run.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/../support/free_port.sh"
build=$(realpath "$1")
ember=$build/bin/ember
example=$build/examples/sst2_finetune_accelerate
snippet=$build/docs/snippets/snippet_collectives
for program in "$ember" "$example" "$snippet"; do
  [[ -x $program ]] || { echo "launchers_match: $program is not built" >&2; exit 1; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/ember_launchers.XXXXXX")
export EMBER_SLURM_DIR=$work/slurm
cleanup() {
  bash "$here/slurm_cluster.sh" stop >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# Variables a developer's shell may carry from another job must not leak into these ones.
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT EMBER_NUM_THREADS
while read -r name; do unset "$name"; done < <(compgen -e | grep -E '^(SLURM_|OMPI_|PMI_|PMIX_)' || true)

args=(--train-limit 480 --batch 8 --epochs 1 --seed 3 --threads 1)
run() {  # run NAME COMMAND...: the example's output in $work/NAME.log, metrics under $work/NAME/
  local name=$1
  shift
  echo "== $name: $*"
  if ! timeout 600 "$@" "$example" "${args[@]}" --project-dir "$work/$name" >"$work/$name.log" 2>&1; then
    cat "$work/$name.log"
    echo "launchers_match: the example failed under $name" >&2
    exit 1
  fi
}

# The losses logged every 20 steps and the dev accuracy, one line each, from a run's tracker.
summary() {
  /usr/bin/python3 - "$work/$1/sst2_finetune_accelerate/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
for r in rows:
    for key in ("loss", "dev_accuracy"):
        if key in r:
            print(f"{key} step {r['step']}: {r[key]!r}")
PY
}

# Two runs agree when every figure is within f32 rounding (2e-6 relative) of the reference's.
same_as_reference() {
  local name=$1
  if ! /usr/bin/python3 - <(summary ember) <(summary "$name") "$name" <<'PY'; then
import sys
ref = open(sys.argv[1]).read().split("\n")
got = open(sys.argv[2]).read().split("\n")
ref = [l for l in ref if l]
got = [l for l in got if l]
ok = len(ref) == len(got) and len(ref) >= 4
for a, b in zip(ref, got):
    ka, va = a.rsplit(": ", 1)
    kb, vb = b.rsplit(": ", 1)
    ok = ok and ka == kb and abs(float(va) - float(vb)) <= 2e-6 * max(1.0, abs(float(va)))
if not ok:
    print("ember launch:\n  " + "\n  ".join(ref))
    print(sys.argv[3] + ":\n  " + "\n  ".join(got))
    sys.exit(1)
print(f"{sys.argv[3]}: {len(got)} figures equal to ember launch's ({got[-1]})")
PY
    echo "launchers_match: $name does not reproduce ember launch's run" >&2
    exit 1
  fi
}

snippet_agrees() {  # snippet_agrees NAME COMMAND...
  local name=$1
  shift
  if ! timeout 120 "$@" "$snippet" >"$work/$name.snippet.log" 2>&1 ||
     ! grep -q "2 processes on" "$work/$name.snippet.log" ||
     ! grep -q "collectives agree" "$work/$name.snippet.log"; then
    cat "$work/$name.snippet.log"
    echo "launchers_match: the collectives snippet failed under $name" >&2
    exit 1
  fi
  echo "$name: the collectives snippet agrees on 2 processes"
}

run ember "$ember" launch --num_processes 2 --num_cpu_threads_per_process 1 --main_process_port "$(free_port)"
summary ember
snippet_agrees ember "$ember" launch --num_processes 2 --main_process_port "$(free_port)"

# mpirun as root needs its consent; 2 ranks fit the 2 cores without --oversubscribe, but a
# machine with 1 would not.
if ! command -v mpirun >/dev/null; then
  echo "SKIP: mpirun is not installed (openmpi-bin; bash scripts/install_deps.sh)"
  exit 77
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
run mpirun mpirun -np 2
same_as_reference mpirun
snippet_agrees mpirun mpirun -np 2

set +e
conf=$(bash "$here/slurm_cluster.sh" start 2>"$work/slurm_start.err")
status=$?
set -e
if ((status == 3)); then
  echo "SKIP: $(grep -m1 'cannot run:' "$work/slurm_start.err")"
  exit 77
elif ((status != 0)); then
  cat "$work/slurm_start.err"
  echo "launchers_match: the Slurm cluster did not start" >&2
  exit 1
fi
eval "$conf"
run srun srun -n 2 --cpus-per-task 1
same_as_reference srun
snippet_agrees srun srun -n 2

# An sbatch script as a user writes one: one `ember launch` per node, each starting its ranks.
cat >"$work/train.sbatch" <<EOF
#!/bin/bash
#SBATCH --nodes=1 --ntasks-per-node=1 --cpus-per-task=2
srun --ntasks-per-node=1 "$ember" launch --num_processes 2 --num_cpu_threads_per_process 1 \\
  --main_process_port $(free_port) \\
  "$example" ${args[*]} --project-dir "$work/sbatch"
EOF
echo "== sbatch: $(tail -3 "$work/train.sbatch" | tr -d '\\\n')"
if ! timeout 600 sbatch --wait --output="$work/sbatch.log" "$work/train.sbatch" >/dev/null; then
  cat "$work/sbatch.log" 2>/dev/null || true
  echo "launchers_match: the sbatch job failed" >&2
  exit 1
fi
same_as_reference sbatch
echo "launchers_match: ember launch, mpirun, srun and sbatch + ember launch agree"
