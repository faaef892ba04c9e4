#!/usr/bin/env bash
# Soak benchmark: bert-tiny fine-tuned on SST-2 by 2 ranks under `ember launch` for a fixed
# number of steps, twice at the same time from the same seed:
#   reference    uninterrupted;
#   interrupted  SIGKILLed (one rank, then the launcher tears the other down) at two moments
#                between checkpoints, each time restarted with --resume from its last checkpoint.
# Then it checks that
#   1. both runs end with bit-identical weights (final/model.safetensors);
#   2. memory is flat: in every uninterrupted stretch of every rank, the resident set after
#      warm-up (the first 20% of the stretch's samples) grows by less than 2% from its first
#      quarter to its last;
#   3. each kill made `ember launch` return non-zero.
# Checkpoints are written every --checkpoint-every steps (about every 4 minutes here). Each rank
# logs its resident set, the tensor cache and the longest batch so far (bench/soak_train.cpp);
# phrases are cut at 40 tokens so that every rank meets its longest batch in the first minute.
#
#   bash bench/soak.sh                       # 20000 steps: 40-60 min on 2 cores (both runs at once)
#   bash bench/soak.sh --steps 600 --checkpoint-every 100   # a quick rehearsal (~3 min)
#   SOAK_DIR=/tmp/soak bash bench/soak.sh    # default runs/soak-<date>
# Writes summary.txt (and the RSS logs, checkpoints, launcher logs) in the soak directory;
# exits non-zero when a check fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
STEPS=20000
EVERY=2000
while (($# > 0)); do
  case "$1" in
    --steps) STEPS=$2; shift 2 ;;
    --checkpoint-every) EVERY=$2; shift 2 ;;
    *) echo "soak.sh: unknown option $1 (--steps N, --checkpoint-every N)" >&2; exit 2 ;;
  esac
done
DIR=$(realpath -m "${SOAK_DIR:-runs/soak-$(date +%Y%m%d-%H%M%S)}")
BUILD=${EMBER_BUILD_DIR:-build}
export PATH="/usr/local/cuda/bin:$PATH"
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ember-ccache}" CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=true
if [[ ! -f "$BUILD/build.ninja" ]]; then
  bash scripts/install_deps.sh
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
cmake --build "$BUILD" --target soak_train ember_cli
mkdir -p "$DIR/bin"
# The runs use a private copy of the programs and the library, so that rebuilding the tree
# during the soak cannot mix two versions of Ember in one run.
cp "$BUILD/bench/soak_train" "$BUILD/bin/ember" "$BUILD"/libember.so* "$DIR/bin/"
export LD_LIBRARY_PATH="$DIR/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "soak: $STEPS steps, checkpoint every $EVERY, in $DIR"

RSS_EVERY=$((STEPS / 200 > 0 ? STEPS / 200 : 1))
PORT=${SOAK_PORT:-29611}
run() {  # run <name> [--resume]: one launch of the training program, on its own port
  local name=$1; shift
  local port=$PORT
  [[ $name == reference ]] || port=$((PORT + 1))
  "$DIR/bin/ember" launch --num_processes 2 --main_process_port "$port" "$DIR/bin/soak_train" --project-dir "$DIR/$name" \
    --steps "$STEPS" --checkpoint-every "$EVERY" --rss-every "$RSS_EVERY" --rss-log "$DIR/$name/rss" "$@" \
    >>"$DIR/$name.log" 2>&1
}
last_step() {  # the last step rank 0 of run <name> logged its memory at
  tail -n 1 "$DIR/$1/rss.rank0" 2>/dev/null | cut -d' ' -f1 || true
}

start=$(date +%s)
run reference &
reference_pid=$!

# Two kills, each a third of a checkpoint interval past a checkpoint, so work is redone.
kills=($((STEPS * 35 / 100 / EVERY * EVERY + EVERY / 3)) $((STEPS * 70 / 100 / EVERY * EVERY + EVERY / 3)))
launch_status=()
resume=()
for kill_at in "${kills[@]}"; do
  run interrupted "${resume[@]}" &
  pid=$!
  until [[ "$(last_step interrupted)" -ge "$kill_at" ]] 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || { echo "soak: the interrupted run ended before step $kill_at" >&2; exit 1; }
    sleep 2
  done
  # SIGKILL rank 0 (it also serves the rendezvous store): no chance to clean up. The rank, not
  # the launcher (whose command line names the program too): the process whose environment
  # says RANK=0.
  victim=""
  for p in $(pgrep -f "^$DIR/bin/soak_train --project-dir $DIR/interrupted"); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx 'RANK=0'; then victim=$p; fi
  done
  [[ -n $victim ]] || { echo "soak: rank 0 of the interrupted run not found" >&2; exit 1; }
  echo "soak: SIGKILL rank 0 (pid $victim) at step $(last_step interrupted) (target $kill_at)"
  kill -9 "$victim"
  set +e; wait "$pid"; launch_status+=($?); set -e
  echo "=== killed at step $(last_step interrupted); ember launch returned ${launch_status[-1]}" >>"$DIR/interrupted.log"
  resume=(--resume)
done
run interrupted --resume
wait "$reference_pid"
elapsed=$(($(date +%s) - start))

status=0
{
  echo "soak: $STEPS steps, 2 ranks, checkpoint every $EVERY steps, ${elapsed} s wall"
  echo "kills at steps ${kills[*]}; ember launch returned ${launch_status[*]} after them"
  for s in "${launch_status[@]}"; do
    ((s != 0)) || echo "FAIL: ember launch returned 0 after a kill"
  done
} >"$DIR/summary.txt"
grep -q FAIL "$DIR/summary.txt" && status=1
"$DIR/bin/soak_train" --compare "$DIR/reference/final/model.safetensors" \
  "$DIR/interrupted/final/model.safetensors" >>"$DIR/summary.txt" ||
  { echo "FAIL: final weights differ" >>"$DIR/summary.txt"; status=1; }

# Memory: split each RSS log into uninterrupted stretches (the step goes down after a resume).
/usr/bin/python3 - "$DIR" >>"$DIR/summary.txt" <<'PY' || status=1
import glob, os, sys
root = sys.argv[1]
ok = True
for path in sorted(glob.glob(os.path.join(root, "*", "rss.rank*"))):
    rows = [tuple(map(float, l.split())) for l in open(path) if l.strip()]
    stretches, cur = [], []
    for r in rows:
        if cur and r[0] <= cur[-1][0]:
            stretches.append(cur); cur = []
        cur.append(r)
    stretches.append(cur)
    for i, s in enumerate(stretches):
        s = s[len(s) // 5:]
        if len(s) < 8:
            print(f"{os.path.relpath(path, root)} stretch {i}: {len(s)} samples after warm-up, too short to judge")
            continue
        q = max(2, len(s) // 4)
        first, last = max(r[2] for r in s[:q]), max(r[2] for r in s[-q:])
        growth = (last - first) / first
        verdict = "flat" if growth < 0.02 else "GROWS"
        ok &= growth < 0.02
        # Who holds the memory (soak_train's later columns): the tensor cache, and the longest
        # batch run so far, which the cache follows.
        held = ""
        if len(s[0]) >= 8:
            held = (f"; tensor cache {s[0][3] / 1024:.1f} -> {s[-1][3] / 1024:.1f} MiB, "
                    f"longest batch {int(s[0][7])} -> {int(s[-1][7])} tokens")
        print(f"{os.path.relpath(path, root)} stretch {i}: steps {int(s[0][0])}-{int(s[-1][0])}, "
              f"RSS {first / 1024:.1f} MiB -> {last / 1024:.1f} MiB ({100 * growth:+.2f}%) {verdict}{held}")
sys.exit(0 if ok else 1)
PY
cat "$DIR/summary.txt"
exit $status
