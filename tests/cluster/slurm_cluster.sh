#!/usr/bin/env bash
# A real one-node Slurm cluster (munged + slurmctld + slurmd) on this machine, for tests that
# run Ember's launchers and examples under srun/sbatch.
#
#   eval "$(bash tests/cluster/slurm_cluster.sh start)"   # prints: export SLURM_CONF=...
#   srun -n 2 hostname
#   bash tests/cluster/slurm_cluster.sh status            # exit 0 when all three daemons run
#   bash tests/cluster/slurm_cluster.sh stop
#
# Everything (munge key and socket, slurm.conf, state, spool, logs, pid files) lives in a private
# directory, $EMBER_SLURM_DIR (default /tmp/ember-slurm), so the cluster neither needs nor disturbs
# a system munge or Slurm. Clients find it only through SLURM_CONF=$EMBER_SLURM_DIR/slurm.conf
# (the AuthInfo line in it points them at our munged socket).
#
# Exit codes: 0 ok; 1 failure (logs printed to stderr); 2 usage; 3 "slurm_cluster: cannot run:
# <reason>" on stderr when the binaries are missing, we are not root, or a daemon dies as it
# starts (a test skips with that line). Only the export line goes to stdout, so eval is safe.
set -euo pipefail

DIR=${EMBER_SLURM_DIR:-/tmp/ember-slurm}
# Absolute, so that the printed SLURM_CONF works from any directory.
[[ $DIR == /* ]] || DIR=$PWD/$DIR
DIR=${DIR%/}
[[ -n $DIR ]] || { echo "slurm_cluster: EMBER_SLURM_DIR must not be /" >&2; exit 2; }
CONF=$DIR/slurm.conf
MUNGE_DIR=$DIR/munge
SOCKET=$MUNGE_DIR/munge.socket
MUNGE_PID=$MUNGE_DIR/munged.pid
CTLD_PID=$DIR/run/slurmctld.pid
SLURMD_PID=$DIR/run/slurmd.pid
START_TIMEOUT=${EMBER_SLURM_START_TIMEOUT:-60}
STOP_TIMEOUT=15

# Daemon binaries live in /usr/sbin, which a non-login root shell may lack on its PATH.
PATH=$PATH:/usr/sbin:/sbin
export PATH
NODE=$(hostname -s 2>/dev/null || echo "${HOSTNAME%%.*}")

STARTING=0 # set while `start` runs: a failure then stops what it had started
say() { echo "slurm_cluster: $*" >&2; }
cannot_run() {
  if ((STARTING)); then log_tails; do_stop; fi
  echo "slurm_cluster: cannot run: $*" >&2
  exit 3
}

check_binaries() {
  local b missing=()
  for b in munged slurmctld slurmd sinfo srun scontrol squeue scancel; do
    command -v "$b" >/dev/null 2>&1 || missing+=("$b")
  done
  ((${#missing[@]} == 0)) || cannot_run "missing ${missing[*]} (install munge and slurm-wlm)"
  # SlurmUser/SlurmdUser=root: slurmd must be root to start job steps as the submitting user.
  [[ $(id -u) == 0 ]] || cannot_run "must run as root (slurmd starts job steps as root)"
}

# The pid in pid file $1, printed only when that process is alive and is the daemon $2 (a stale
# pid file, e.g. from before a reboot, may name an unrelated process that we must not kill).
live_pid() {
  local pid comm
  [[ -r $1 ]] || return 1
  pid=$(tr -dc '0-9' <"$1")
  [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 1
  comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
  [[ $comm == "$2" ]] && echo "$pid"
}

pidfile_of() {
  case $1 in
    munged) echo "$MUNGE_PID" ;; slurmctld) echo "$CTLD_PID" ;; slurmd) echo "$SLURMD_PID" ;;
  esac
}

# In the foreground (-F/-D) the daemons log to stderr, i.e. log/<daemon>.out, which also holds
# what they print before they open their log file; slurm*.log only if the .out is empty.
log_tails() {
  local name f
  for name in munged slurmctld slurmd; do
    f=$DIR/log/$name.out
    [[ -s $f ]] || f=$DIR/log/$name.log
    [[ -s $f ]] || continue
    echo "----- tail of $f -----" >&2
    tail -n 25 "$f" >&2
  done
}

fail() {
  say "$*"
  log_tails
  if ((STARTING)); then do_stop; fi
  exit 1
}

# Starts a daemon in the foreground mode (-F/-D) as a detached session leader: its exit is seen
# at once through kill -0, it writes its own pid file, and it holds none of the caller's file
# descriptors (so `$(slurm_cluster.sh start)` returns, and a test's pipes get their EOF).
spawn() {
  local out=$1; shift
  (
    for fd in /proc/self/fd/*; do
      fd=${fd##*/}
      if ((fd > 2)); then eval "exec $fd>&-" 2>/dev/null || true; fi
    done
    exec setsid "$@" </dev/null >"$out" 2>&1
  ) &
  echo $!
}

# Waits (10 s at most) for a just-spawned daemon's pid file to name a live process. A daemon
# that exits at once cannot run on this machine. (The spawned pid may exit early and legitimately
# when setsid had to fork; the pid file is what counts.)
wait_alive() {
  local name=$1 pid=$2 pidfile=$3 i dead=0
  for ((i = 0; i < 100; i++)); do
    live_pid "$pidfile" "$name" >/dev/null && return 0
    if ! kill -0 "$pid" 2>/dev/null; then
      ((++dead > 10)) && cannot_run "$name exited at start (logs above)"
    fi
    sleep 0.1
  done
  fail "$name wrote no pid file $pidfile in 10s"
}

# Two consecutive ports (slurmctld, slurmd) in 16800-16999 nobody listens on, so that a system
# Slurm (6817/6818) or a second private cluster does not clash with ours.
pick_ports() {
  local p
  for ((p = 16800 + (RANDOM % 100) * 2, n = 0; n < 100; n++, p = p + 2 > 16998 ? 16800 : p + 2)); do
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null &&
       ! (exec 3<>"/dev/tcp/127.0.0.1/$((p + 1))") 2>/dev/null; then
      echo "$p"; return 0
    fi
  done
  fail "no free port pair in 16800-16999"
}

# SIGTERM to every daemon with a live pid file at once (each takes 1.5-2 s to shut down, so in
# turn they would take 5-6 s), then waits STOP_TIMEOUT s for them all before SIGKILL.
stop_daemons() {
  local name pidfile pid pids=() i alive
  for name in slurmd slurmctld munged; do
    pidfile=$(pidfile_of "$name")
    if pid=$(live_pid "$pidfile" "$name"); then
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
  done
  set -- "$SLURMD_PID" "$CTLD_PID" "$MUNGE_PID"
  for ((i = 0; i < STOP_TIMEOUT * 10; i++)); do
    alive=0
    for pid in "${pids[@]}"; do
      if kill -0 "$pid" 2>/dev/null; then alive=1; fi
    done
    ((alive)) || { rm -f "$@"; return 0; }
    sleep 0.1
  done
  for pid in "${pids[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      say "pid $pid ignored SIGTERM for ${STOP_TIMEOUT}s; killing it"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  sleep 0.2
  rm -f "$@"
}

do_stop() {
  # Cancel our jobs first so slurmd's slurmstepd processes end with their steps rather than
  # outlive the daemons (bounded: squeue/scancel time out against a dead slurmctld).
  if live_pid "$CTLD_PID" slurmctld >/dev/null && [[ -r $CONF ]]; then
    local jobs i
    jobs=$(SLURM_CONF=$CONF timeout 10 squeue -h -o %i 2>/dev/null || true)
    if [[ -n $jobs ]]; then
      # shellcheck disable=SC2086 # one job id a word
      SLURM_CONF=$CONF timeout 10 scancel $jobs 2>/dev/null || true
      for ((i = 0; i < STOP_TIMEOUT; i++)); do
        [[ -z $(SLURM_CONF=$CONF timeout 5 squeue -h -o %i 2>/dev/null || true) ]] && break
        sleep 1
      done
    fi
  fi
  stop_daemons
}

write_conf() {
  local ctld_port=$1 cpus mem
  cpus=$(nproc)
  # RealMemory above what slurmd detects would drain the node: leave a margin of 10%, >= 512 MiB.
  mem=$(free -m | awk '/^Mem:/ {print $2}')
  mem=$((mem - (mem / 10 > 512 ? mem / 10 : 512)))
  ((mem > 0)) || mem=1
  : >"$DIR/plugstack.conf" # keep the system's SPANK plugins out
  cat >"$CONF" <<EOF
# Written by tests/cluster/slurm_cluster.sh; everything points inside $DIR.
ClusterName=ember
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$((ctld_port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCKET
# No cgroups: they are unavailable or read-only in containers, and a test cluster needs no
# confinement.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
PlugStackConfig=$DIR/plugstack.conf
MailProg=/bin/true
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/slurmd.%n
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$SLURMD_PID
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# A node that registers comes back to service by itself; finished jobs leave squeue quickly.
ReturnToService=2
MinJobAge=10
KillWait=5
InactiveLimit=0
SlurmdTimeout=60
SlurmctldTimeout=60
# Trust the CPU count/memory given here rather than slurmd's probe (sockets/threads may differ).
SlurmdParameters=config_overrides
NodeName=$NODE NodeAddr=127.0.0.1 NodeHostname=$NODE CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
}

do_start() {
  check_binaries
  STARTING=1
  # Idempotent: an earlier cluster in this directory goes first (its ports, key and state too).
  do_stop
  mkdir -p "$DIR"
  rm -rf "$MUNGE_DIR" "$DIR/state" "$DIR/spool" "$DIR/log" "$DIR/run"
  mkdir -p "$DIR/state" "$DIR/spool/slurmd.$NODE" "$DIR/log" "$DIR/run"
  # munged refuses keys and sockets in directories others can write to; 0755 (not 0700) on the
  # socket's directory lets non-root clients (srun as a user) reach it. The key stays 0400.
  chmod 0755 "$DIR"
  install -d -m 0755 "$MUNGE_DIR"

  # munged runs as us (root); its key is ours, 0400, 1 KiB of randomness.
  dd if=/dev/urandom of="$MUNGE_DIR/munge.key" bs=1024 count=1 status=none
  chmod 0400 "$MUNGE_DIR/munge.key"
  local pid
  # --force: munged as root, and /tmp as an ancestor, are otherwise refused on some versions.
  # In --foreground mode munged logs to stderr, i.e. $DIR/log/munged.out; --log-file is the
  # path it would use if someone ran it daemonized.
  pid=$(spawn "$DIR/log/munged.out" munged --foreground --force \
    --socket="$SOCKET" --key-file="$MUNGE_DIR/munge.key" --pid-file="$MUNGE_PID" \
    --log-file="$MUNGE_DIR/munged.log" --seed-file="$MUNGE_DIR/munged.seed")
  wait_alive munged "$pid" "$MUNGE_PID"
  local i
  for ((i = 0; i < 50; i++)); do [[ -S $SOCKET ]] && break; sleep 0.1; done
  [[ -S $SOCKET ]] || fail "munged did not create $SOCKET"
  if command -v munge >/dev/null && command -v unmunge >/dev/null; then
    munge -n -S "$SOCKET" | unmunge -S "$SOCKET" >/dev/null 2>&1 ||
      fail "munge credential round trip through $SOCKET failed"
  fi

  local port
  port=$(pick_ports)
  write_conf "$port"

  # -c: start from clean state; -i: ignore state that does not match the config.
  pid=$(spawn "$DIR/log/slurmctld.out" slurmctld -D -c -i -f "$CONF")
  wait_alive slurmctld "$pid" "$CTLD_PID"
  pid=$(spawn "$DIR/log/slurmd.out" slurmd -D -N "$NODE" -f "$CONF")
  wait_alive slurmd "$pid" "$SLURMD_PID"

  local state="" deadline=$((SECONDS + START_TIMEOUT))
  while ((SECONDS < deadline)); do
    live_pid "$CTLD_PID" slurmctld >/dev/null || cannot_run "slurmctld exited while starting (logs above)"
    live_pid "$SLURMD_PID" slurmd >/dev/null || cannot_run "slurmd exited while starting (logs above)"
    state=$(SLURM_CONF=$CONF timeout 5 sinfo -h -N -n "$NODE" -o %T 2>/dev/null || true)
    [[ $state == idle ]] && break
    sleep 0.5
  done
  [[ $state == idle ]] ||
    fail "node $NODE not idle after ${START_TIMEOUT}s (state '${state:-no answer}')"
  STARTING=0
  say "up: node $NODE idle, slurmctld port $port, slurmd port $((port + 1)), dir $DIR"
  echo "export SLURM_CONF=$CONF"
}

do_status() {
  local name pidfile pid down=0
  for name in munged slurmctld slurmd; do
    pidfile=$(pidfile_of "$name")
    if pid=$(live_pid "$pidfile" "$name"); then
      echo "$name: running (pid $pid)"
    else
      echo "$name: not running"; down=1
    fi
  done
  if ((down == 0)); then
    echo "node: $(SLURM_CONF=$CONF timeout 5 sinfo -h -N -n "$NODE" -o %T 2>/dev/null || echo '?')"
    echo "export SLURM_CONF=$CONF"
  fi
  return "$down"
}

case ${1:-} in
  start) do_start ;;
  stop) do_stop ;;
  status) do_status ;;
  *) echo "usage: $0 start|stop|status   (state in \$EMBER_SLURM_DIR, default /tmp/ember-slurm)" >&2
     exit 2 ;;
esac
