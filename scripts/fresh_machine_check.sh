#!/usr/bin/env bash
# Fresh-machine check: does a newcomer's first command, `bash scripts/test.sh` in a fresh clone,
# install, build and pass on a fresh Debian 12 system without the CUDA toolkit?
#
#   sudo bash scripts/fresh_machine_check.sh [--fresh] [--base-only]
#
# Run as root on a Debian 12 host (amd64). It installs debootstrap on the host if missing, builds
# a minimal bookworm system (debootstrap --variant=minbase) and adds to it only what a newcomer
# has before reading the README: git and ca-certificates (no Recommends). It clones the committed
# HEAD of this repository into it and runs `bash scripts/test.sh` there as root, with a clean
# environment (PATH, HOME=/root, TERM, and OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE if the host sets
# them) and no standard input. No CUDA toolkit is inside, so the CUDA backend is off. Whatever
# the build and the tests need must come from the project's own scripts. It prints CTest's summary
# and exits with test.sh's status (2 when the check itself cannot run).
#
#   --fresh       delete the base system and the caches first and start from nothing.
#   --base-only   make the base system if it is missing, and stop there.
#
# Under $EMBER_FRESH_DIR (default /var/tmp/ember-fresh-root):
#   base/     the minimal system with git and ca-certificates, made once, never changed later
#   run/      a copy of base/ that one check runs in, made anew at every run and left in place
#             afterwards for inspection
#   cache/    kept between runs: the compiler cache (/root/.cache/ember-ccache inside), the
#             downloaded .deb files and pip's download cache. The project's scripts still
#             install every package on every run; only compile outputs and downloads are reused.
#   test.log  the output of the last run's test.sh (override with $EMBER_FRESH_LOG)
# Other settings: EMBER_FRESH_SOURCE (the git repository to clone; default: the one holding this
# script), EMBER_FRESH_REV (the commit to test; default HEAD), EMBER_FRESH_MIRROR (default
# http://deb.debian.org/debian) and EMBER_FRESH_SECURITY_MIRROR (default
# http://deb.debian.org/debian-security).
#
# Time on 2 cores: a cold run (the first, or with --fresh) takes about half an hour on a quiet
# machine and an hour on a busy one: the base system 2 min, the packages test.sh installs about
# 10 min (500 MB of .deb files), then the build and the tests. A later run on a newer commit
# compiles from the cache: about 5 min when little changed.
#
# The check shares the host's kernel, host name and network namespace: tests that listen on
# loopback ports can collide with tests running on the host at the same time, so run it when the
# host is otherwise quiet. What only says how this network is reached comes from the host too:
# /etc/hosts, /etc/resolv.conf, the Acquire settings of APT files that no package installed, and
# the certificate authorities in /usr/local/share/ca-certificates (a network that inspects TLS
# needs them for pip to reach PyPI).
set -euo pipefail

log() { echo "fresh_machine_check: $*"; }
die() { echo "fresh_machine_check: $*" >&2; exit 2; }

FRESH=0
BASE_ONLY=0
for arg in "$@"; do
  case $arg in
    --fresh) FRESH=1 ;;
    --base-only) BASE_ONLY=1 ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) die "unknown argument '$arg' (see --help)" ;;
  esac
done

[[ $(id -u) -eq 0 ]] || die "run as root: it runs debootstrap, chroot and mount"
command -v apt-get >/dev/null || die "needs a Debian host (apt-get not found)"

DIR=$(realpath -m -- "${EMBER_FRESH_DIR:-/var/tmp/ember-fresh-root}")
[[ $DIR == /*/* ]] || die "EMBER_FRESH_DIR must be a directory at least two levels below /, not '$DIR'"
BASE=$DIR/base
RUN=$DIR/run
CACHE=$DIR/cache
LOG=${EMBER_FRESH_LOG:-$DIR/test.log}
MIRROR=${EMBER_FRESH_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${EMBER_FRESH_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
SUITE=bookworm

SOURCE=$(realpath -- "${EMBER_FRESH_SOURCE:-$(dirname "${BASH_SOURCE[0]}")/..}")
host_git() { git -c safe.directory="$SOURCE" -C "$SOURCE" "$@"; }
COMMIT=$(host_git rev-parse --verify "${EMBER_FRESH_REV:-HEAD}^{commit}") ||
  die "no commit '${EMBER_FRESH_REV:-HEAD}' in $SOURCE"

# The environment inside: what a root login on a fresh machine has, nothing from this shell.
CLEAN_ENV=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
           "TERM=${TERM:-dumb}")
for var in OPENBLAS_CORETYPE OPENBLAS_L2_SIZE; do
  if [[ -v $var ]]; then CLEAN_ENV+=("$var=${!var}"); fi
done

# --- mounts: everything mounted in the systems under $DIR is this script's; all of it goes on exit

mounts_under() {  # mount points at or below $1, deepest first
  local top=$1
  awk -v t="$top" '{ m = $5; gsub(/\\040/, " ", m); if (m == t || index(m, t "/") == 1) print m }' \
    /proc/self/mountinfo | sort -r
}

kill_processes_in() {  # processes whose root is the chroot $1 (left behind by a test, say)
  local root=$1 pid_dir pids=()
  for pid_dir in /proc/[0-9]*; do
    if [[ $(readlink "$pid_dir/root" 2>/dev/null) == "$root" ]]; then pids+=("${pid_dir#/proc/}"); fi
  done
  ((${#pids[@]})) || return 0
  log "stopping ${#pids[@]} process(es) left in $root: ${pids[*]}"
  kill -TERM "${pids[@]}" 2>/dev/null || true
  sleep 2
  kill -KILL "${pids[@]}" 2>/dev/null || true
}

system_mounts() {  # every mount this script (or a test inside) made, deepest first
  local root
  for root in "$RUN" "$BASE.tmp" "$BASE"; do mounts_under "$root"; done | sort -r
}

unmount_all() {
  local root m
  for root in "$RUN" "$BASE.tmp"; do
    if [[ -d $root ]]; then kill_processes_in "$root"; fi
  done
  # Several passes: a mount point can hold more than one mount.
  for _ in 1 2 3; do
    [[ -n $(system_mounts) ]] || return 0
    while read -r m; do
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "could not unmount $m"
    done < <(system_mounts)
  done
  [[ -z $(system_mounts) ]] || log "still mounted: $(system_mounts | tr '\n' ' ')"
}

# A directory is deleted only when nothing is mounted below it: a bind mount left there would
# have rm delete through it.
remove_tree() {
  local tree=$1
  [[ -e $tree ]] || return 0
  unmount_all
  [[ -z $(mounts_under "$tree") ]] || die "still mounted below $tree; not deleting it"
  rm -rf --one-file-system -- "$tree"
}

trap unmount_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# The system's root is a mount point, as on a real machine (`ip netns` remounts / to build the
# two-machine test's network); /proc, /sys, /dev with its own pseudo-terminals (the launcher's
# progress test opens one) and its own /dev/shm (multi-process tests and Chromium use it).
mount_system() {
  local root=$1
  mount --bind "$root" "$root"
  mount -t proc proc "$root/proc"
  mount -t sysfs sysfs "$root/sys"
  mount -t devtmpfs devtmpfs "$root/dev"
  mkdir -p "$root/dev/pts" "$root/dev/shm"
  mount -t devpts -o newinstance,gid=5,mode=620,ptmxmode=0666 devpts "$root/dev/pts"
  mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/dev/shm"
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  cp /etc/hosts "$root/etc/hosts"
  if [[ -d /usr/local/share/ca-certificates ]]; then
    mkdir -p "$root/usr/local/share/ca-certificates"
    cp -a /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/"
  fi
}

bind() {  # bind SRC DST [ro]
  mkdir -p "$2"
  mount --bind "$1" "$2"
  [[ ${3:-} != ro ]] || mount -o remount,bind,ro "$2"
}

in_chroot() {
  local root=$1
  shift
  chroot "$root" /usr/bin/env -i "${CLEAN_ENV[@]}" "$@" </dev/null
}

# --- the base system ----------------------------------------------------------------------------

install_host_tools() {
  local need=()
  command -v debootstrap >/dev/null || need+=(debootstrap)
  [[ -r /usr/share/keyrings/debian-archive-keyring.gpg ]] || need+=(debian-archive-keyring)
  ((${#need[@]})) || return 0
  log "installing ${need[*]} on the host"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends "${need[@]}" ||
    { apt-get update && apt-get install -y --no-install-recommends "${need[@]}"; }
}

# The sources a Debian 12 installation has, plus the host's own settings for reaching its mirror
# (such as Acquire::Check-Valid-Until for a mirror that serves a dated snapshot): Acquire
# settings in files that no package installed.
write_apt_config() {
  local root=$1 conf
  rm -f "$root/etc/apt/sources.list"
  cat >"$root/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $SECURITY_MIRROR
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  for conf in /etc/apt/apt.conf.d/*; do
    if [[ -f $conf ]] && grep -q '^[[:space:]]*Acquire' "$conf" && ! dpkg -S "$conf" >/dev/null 2>&1; then
      cp "$conf" "$root/etc/apt/apt.conf.d/"
    fi
  done
}

make_base() {
  local tmp=$BASE.tmp
  remove_tree "$tmp"
  install_host_tools
  log "debootstrap $SUITE (minbase) into $tmp from $MIRROR"
  debootstrap --variant=minbase --components=main --arch="$(dpkg --print-architecture)" \
    "$SUITE" "$tmp" "$MIRROR"
  write_apt_config "$tmp"
  mount_system "$tmp"
  # What a newcomer installs to follow the README's first line: git, and certificates for https.
  in_chroot "$tmp" apt-get update
  in_chroot "$tmp" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y --no-install-recommends git ca-certificates
  in_chroot "$tmp" apt-get clean
  unmount_all
  mv -- "$tmp" "$BASE"
}

# --- the check ------------------------------------------------------------------------------------

T0=$SECONDS
mkdir -p "$DIR"
unmount_all  # from a run that was killed before its trap could run
if ((FRESH)); then
  log "--fresh: deleting $BASE and $CACHE"
  remove_tree "$RUN"
  remove_tree "$BASE"
  remove_tree "$CACHE"
fi
[[ -d $BASE ]] || make_base
if ((BASE_ONLY)); then
  log "base system ready in $BASE ($(du -sh "$BASE" | cut -f1))"
  exit 0
fi

log "new system $RUN from $BASE"
remove_tree "$RUN"
cp -a -- "$BASE" "$RUN"
mount_system "$RUN"
in_chroot "$RUN" update-ca-certificates >/dev/null 2>&1 || die "update-ca-certificates failed in $RUN"
mkdir -p "$CACHE/ccache" "$CACHE/apt-archives/partial" "$CACHE/pip"
bind "$CACHE/ccache" "$RUN/root/.cache/ember-ccache"
bind "$CACHE/apt-archives" "$RUN/var/cache/apt/archives"
bind "$CACHE/pip" "$RUN/root/.cache/pip"

# Clone as a newcomer would, from a read-only view of the repository that is gone again before
# the tests run.
bind "$SOURCE" "$RUN/mnt/ember-source" ro
in_chroot "$RUN" git -c safe.directory=/mnt/ember-source clone --quiet --no-hardlinks \
  file:///mnt/ember-source /root/ember
umount "$RUN/mnt/ember-source"
rmdir "$RUN/mnt/ember-source"
if [[ $(in_chroot "$RUN" git -C /root/ember rev-parse HEAD) != "$COMMIT" ]]; then
  in_chroot "$RUN" git -C /root/ember checkout --quiet --detach "$COMMIT"
fi
log "testing commit $(in_chroot "$RUN" git -C /root/ember log -1 --format='%H %s')"
log "test.sh output goes to $LOG"

# In the background, so that a signal to this script is handled at once (the trap then stops
# everything inside the system) instead of after test.sh ends.
T1=$SECONDS
rm -f "$DIR/test.rc"
{
  status=0
  in_chroot "$RUN" /bin/bash -c 'cd /root/ember && exec bash scripts/test.sh' || status=$?
  echo "$status" >"$DIR/test.rc"
} 2>&1 | tee "$LOG" &
wait $! || true
rc=$(cat "$DIR/test.rc" 2>/dev/null || echo 2)
T2=$SECONDS

echo
log "---- summary ----"
if grep -q 'tests passed, .* tests failed out of' "$LOG"; then
  sed -n '/tests passed, .* tests failed out of/,$p' "$LOG" | grep -v '^Label Time Summary\|sec\*proc'
  skipped=$(sed -n '/^The following tests did not run:/,/^$/p' "$LOG" | grep -c '(Skipped)' || true)
  log "skipped: $skipped"
else
  log "CTest did not finish; the last lines of $LOG:"
  tail -n 30 "$LOG"
fi
log "commit $COMMIT: test.sh exit $rc; test.sh $(( (T2 - T1) / 60 )) min $(( (T2 - T1) % 60 )) s," \
    "whole check $(( (T2 - T0) / 60 )) min $(( (T2 - T0) % 60 )) s"
exit "$rc"
