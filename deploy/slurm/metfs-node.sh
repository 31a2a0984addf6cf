#!/usr/bin/env bash
# metfs on one node of a Slurm job. A job script runs it once per node:
#
#   srun --ntasks-per-node=1 deploy/slurm/metfs-node.sh mount
#   srun --ntasks-per-node=1 --overlap deploy/slurm/metfs-node.sh guard &
#   ... training ...
#   srun --ntasks-per-node=1 --overlap deploy/slurm/metfs-node.sh umount
#
# Commands:
#   mount    Mount metfs on this node. Returns 0 once the node's first mini-epoch is staged
#            and the mount is live; otherwise prints "metfs-node: NODE: ..." with the reason
#            on stderr and exits non-zero, which fails the job step. Does nothing but report
#            when this node's mount is already up. Before mounting, checks the node with
#            `metfs doctor` (FUSE, fusermount3, /dev/fuse, the cache's file system and room
#            for the budget, the tier, the Python package): a failed check fails the step
#            with the doctor's report, every failure with its fix; warnings are printed.
#   catalog  Make the job's catalog file (METFS_CATALOG) on the node it runs on: the source is
#            listed (or its manifest read) once, here, and every node's mount then reads the
#            file instead of listing the tier (`metfs mount --catalog`). A file already there
#            that is a current catalog of the same source is kept (`metfs catalog`: one stat per
#            directory of a POSIX source, one listing of an object store), so a job of the
#            same dataset version reuses the last job's. Job scripts run it once, before
#            `mount`. Does nothing but say so when METFS_CATALOG is empty.
#   umount   Stop this node's daemon and remove its mount, also when the daemon died or hangs
#            (SIGTERM, then SIGKILL, then a lazy unmount). Succeeds when nothing was mounted.
#            The cache directory is kept, so a later mount resumes from it.
#   status   Print this node's daemon state (`metfs status`); extra arguments such as --json
#            are passed on. Fails when the daemon does not answer.
#   guard    Stay in the background for the whole job and unmount this node when signalled
#            (SIGTERM/SIGINT/SIGHUP). Slurm signals every running step when a job is cancelled
#            (`scancel`) or hits its time limit, at a moment when a new `srun ... umount` step
#            can no longer start; the guard step is already running, so it cleans up within
#            KillWait. If the node's daemon is not running when the guard starts (on sites
#            with proctrack/cgroup, processes left behind by a finished step are killed), the
#            guard mounts again; the remount resumes from the cache.
#   ready    Wait (up to METFS_MOUNT_TIMEOUT) until this node's mount is up and its daemon
#            answers; fails with the reason otherwise. Returns at once where the daemon of the
#            mount step lives on; where it was killed with its step, this waits for the guard's
#            remount.
#   paths    Print this node's expanded settings as shell assignments (for scripts).
#   etcd     Run the job's own etcd in the foreground (for METFS_DDS=auto; the job scripts run
#            it as one step on the first node). It lives as long as its step: the queue does not
#            survive the loss of that node (point METFS_DDS at a site etcd for that).
#
# Settings (environment; `%n` in a path stands for the node name, `%j` for the job id, so that
# several nodes emulated on one host, or several jobs on one node, do not collide):
#   METFS_SOURCE       capacity tier: a directory (Lustre, GPFS, NFS) or s3://bucket/prefix.
#                      Required for mount.
#   METFS_CACHE_ROOT   cache directory on node-local storage (NVMe, /dev/shm). Created if its
#                      parent exists; a missing parent fails the mount (node-local storage not
#                      there). Required.
#   METFS_BUDGET       most bytes metfs may keep in the cache (e.g. 200GiB): two mini-epoch
#                      slots plus metadata, see README.md. Required for mount.
#   METFS_MOUNTPOINT   where the job reads the current mini-epoch; created if missing, must be
#                      empty. Required.
#   METFS_SOCKET       control socket (default: METFS_CACHE_ROOT/metfs.sock).
#   METFS_ARGS         further `metfs mount` flags, word-split, e.g. "--rf 4 --compose random
#                      --seed 1". Every node of a job must use the same seed and composition.
#   METFS_BIN          the metfs executable (default: `metfs` on PATH).
#   METFS_CATALOG      the catalog file, on a file system every node reads (home, project
#                      space): `catalog` writes it and `mount` reads it (`--catalog`), so no
#                      node lists the source. Empty or unset: every node lists the source.
#   METFS_MOUNT_TIMEOUT  seconds to wait for the first mini-epoch (default 1800).
#   METFS_UMOUNT_TIMEOUT seconds to wait for the daemon to stop before killing it (default 30).
#   METFS_DOCTOR       0 to mount without checking the node first (default 1).
#   PYTHON             the Python whose metfs package the check compares with the binary
#                      (default python3).
#   METFS_DDS          dynamic sharding (docs/DYNAMIC_SHARDING.md): unset for a fixed share of
#                      each mini-epoch per node; a queue etcd://HOST:PORT[,...]/PREFIX on a site
#                      etcd (three or five members survive the loss of a node); or `auto`: the
#                      job's own etcd on its first node (`etcd` above) at
#                      etcd://METFS_ETCD_ADDR:METFS_ETCD_PORT/metfs/JOBID.
#   METFS_ETCD_ADDR    address of the job's first node, where its etcd listens (the job scripts
#                      set it; default 127.0.0.1).
#   METFS_ETCD_PORT    client port of the job's etcd (default 40000 + 2 * (JOBID % 10000); the
#                      peer port is the next one).
#   METFS_ETCD_DIR     data directory of the job's etcd, on node-local storage (default
#                      etcd-%j beside the cache directory).
# Rank and node count come from SLURM_NODEID and SLURM_NNODES (override with --node-rank and
# --nodes in METFS_ARGS); the node name from SLURMD_NODENAME, else `hostname -s`.
set -euo pipefail

NODE=${SLURMD_NODENAME:-$(hostname -s)}
PROG="metfs-node: $NODE"

say() { printf '%s: %s\n' "$PROG" "$*" >&2; }
fail() { say "$*"; exit 1; }

# Expands %n (node name), %j (job id) and %% in a path.
expand() {
  local s=$1 out="" c
  while [ -n "$s" ]; do
    c=${s:0:1}
    if [ "$c" = "%" ] && [ ${#s} -ge 2 ]; then
      case "${s:1:1}" in
        n) out+=$NODE; s=${s:2}; continue ;;
        j) out+=${SLURM_JOB_ID:-nojob}; s=${s:2}; continue ;;
        %) out+=%; s=${s:2}; continue ;;
      esac
    fi
    out+=$c
    s=${s:1}
  done
  printf '%s' "$out"
}

METFS_BIN=${METFS_BIN:-metfs}
MOUNT_TIMEOUT=${METFS_MOUNT_TIMEOUT:-1800}
UMOUNT_TIMEOUT=${METFS_UMOUNT_TIMEOUT:-30}

need() {
  local name=$1
  [ -n "${!name:-}" ] || fail "$name is not set (see the header of $0)"
}

setup_paths() {
  need METFS_CACHE_ROOT
  need METFS_MOUNTPOINT
  CACHE=$(expand "$METFS_CACHE_ROOT")
  MNT=$(expand "$METFS_MOUNTPOINT")
  SOCK=$(expand "${METFS_SOCKET:-$CACHE/metfs.sock}")
  # metfs takes absolute paths apart from `metfs umount`; keep them absolute throughout.
  case "$CACHE" in /*) ;; *) CACHE=$PWD/$CACHE ;; esac
  case "$MNT" in /*) ;; *) MNT=$PWD/$MNT ;; esac
  case "$SOCK" in /*) ;; *) SOCK=$PWD/$SOCK ;; esac
}

# Whether MNT is a metfs mount now (/proc/mounts escapes spaces as \040). A root mount made
# by the daemon itself shows type "fuse" with source "metfs"; one made through fusermount3
# shows type "fuse.metfs".
is_mounted() {
  local want=${MNT// /\\040}
  awk -v m="$want" '$2 == m && ($3 == "fuse.metfs" || ($3 == "fuse" && $1 == "metfs")) { found = 1 }
                    END { exit !found }' /proc/mounts
}

# Whether a process runs (a zombie waiting to be reaped by init has exited already).
alive() {
  local state
  state=$(sed -e 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
  [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}

# The pid of this cache's daemon, if it is alive (from CACHE/metfs.lock, checked against the
# process's command line so that a recycled pid is never signalled).
daemon_pid() {
  local pid
  [ -r "$CACHE/metfs.lock" ] || return 1
  pid=$(tr -dc '0-9' < "$CACHE/metfs.lock")
  [ -n "$pid" ] && alive "$pid" || return 1
  tr '\0' '\n' < "/proc/$pid/cmdline" 2>/dev/null | grep -qxF -- "$CACHE" || return 1
  printf '%s' "$pid"
}

daemon_answers() {
  "$METFS_BIN" status --socket "$SOCK" --json >/dev/null 2>&1
}

log_tail() {
  if [ -r "$CACHE/metfs.log" ]; then
    say "last lines of $CACHE/metfs.log:"
    tail -n 5 "$CACHE/metfs.log" | sed "s/^/  /" >&2
  fi
}

etcd_port() {
  printf '%s' "${METFS_ETCD_PORT:-$((40000 + 2 * (${SLURM_JOB_ID:-0} % 10000)))}"
}

# The job's etcd data directory on this node (its log is the same path with `.log`).
etcd_dir() {
  expand "${METFS_ETCD_DIR:-$(dirname "$CACHE")/etcd-%j}"
}

# METFS_DDS=auto: the address of the job's etcd, once it answers (the mount reads METFS_DDS
# as its --dds).
resolve_dds() {
  [ "${METFS_DDS:-}" = auto ] || return 0
  local url="etcd://${METFS_ETCD_ADDR:-127.0.0.1}:$(etcd_port)/metfs/${SLURM_JOB_ID:-0}"
  local end=$((SECONDS + 60)) out
  while true; do
    # Reachable: a status, or the queue does not exist yet (the first mount makes it).
    if out=$("$METFS_BIN" dds status "$url" --etcd-timeout 2 2>&1) || [[ "$out" == *"no queue at"* ]]; then
      break
    fi
    if [ "$SECONDS" -ge "$end" ]; then
      # On the node that runs it, etcd's own log says why it is not up (a port taken, a data
      # directory it cannot use).
      local log
      log="$(etcd_dir).log"
      if [ -r "$log" ]; then
        out+="; the last lines of $log: $(tail -n 3 "$log" | tr '\n' ' ')"
      fi
      fail "the job's etcd at $url does not answer after 60 s: $out"
    fi
    sleep 0.5
  done
  export METFS_DDS=$url
}

cmd_etcd() {
  setup_paths
  command -v etcd >/dev/null 2>&1 || fail "etcd not found on this node (Debian: etcd-server); or set METFS_DDS to a site etcd's address"
  local addr=${METFS_ETCD_ADDR:-127.0.0.1} port dir name
  port=$(etcd_port)
  dir=$(etcd_dir)
  name="metfs-job-${SLURM_JOB_ID:-0}"
  mkdir -p -m 0700 "$dir" || fail "etcd data directory $dir: cannot create it"
  say "etcd for the job's shard queue at $addr:$port (data $dir)"
  exec etcd --name "$name" --data-dir "$dir" \
    --listen-client-urls "http://$addr:$port" --advertise-client-urls "http://$addr:$port" \
    --listen-peer-urls "http://$addr:$((port + 1))" --initial-advertise-peer-urls "http://$addr:$((port + 1))" \
    --initial-cluster "$name=http://$addr:$((port + 1))" >>"$dir.log" 2>&1
}

# METFS_CATALOG expanded and absolute (CATALOG), or empty.
catalog_path() {
  CATALOG=""
  [ -n "${METFS_CATALOG:-}" ] || return 0
  CATALOG=$(expand "$METFS_CATALOG")
  case "$CATALOG" in /*) ;; *) CATALOG=$PWD/$CATALOG ;; esac
}

# The flags of METFS_ARGS, word-split as documented.
extra_args() {
  EXTRA=()
  if [ -n "${METFS_ARGS:-}" ]; then
    # shellcheck disable=SC2206 # word splitting of the documented flag string is intended
    EXTRA=($METFS_ARGS)
  fi
}

cmd_catalog() {
  need METFS_SOURCE
  catalog_path
  if [ -z "$CATALOG" ]; then
    say "METFS_CATALOG is not set: every node lists the source itself"
    return 0
  fi
  command -v "$METFS_BIN" >/dev/null 2>&1 || fail "metfs executable '$METFS_BIN' not found (set METFS_BIN)"
  mkdir -p "$(dirname "$CATALOG")" 2>/dev/null || fail "catalog file $CATALOG: cannot create its directory"
  extra_args
  local out rc=0
  # The catalog is of the whole source whatever the mode, and METFS_DDS may still say `auto`
  # here (the job's etcd is resolved at mount), which no setting parses: leave the mode out.
  out=$(env -u METFS_DDS "$METFS_BIN" catalog --source "$METFS_SOURCE" -o "$CATALOG" "${EXTRA[@]}" 2>&1) || rc=$?
  if [ "$rc" -ne 0 ]; then
    fail "catalog failed: $(printf '%s' "$out" | sed -e 's/^metfs: //' | tr '\n' ' ')"
  fi
  say "$(printf '%s' "$out" | tr '\n' ' ')"
}

# `metfs doctor` with the mount's settings: fails the step with its report when a check fails
# (exit 1) or the settings are refused (exit 2, the mount's own message); prints its warnings.
check_node() {
  local report rc=0 line fails=""
  report=$("$METFS_BIN" doctor --python "${PYTHON:-python3}" "$@" 2>&1) || rc=$?
  if [ "$rc" -eq 2 ]; then
    fail "mount failed: $(printf '%s' "$report" | sed -e 's/^metfs: //' | tr '\n' ' ')"
  fi
  while IFS= read -r line; do
    case "$line" in
      "FAIL "*) line=${line#FAIL }; fails+="${fails:+; }${line%% -- fix: *}" ;;
      "warn "*) say "node check: ${line#warn }" ;;
    esac
  done <<<"$report"
  if [ "$rc" -ne 0 ]; then
    say "node check failed (metfs doctor):"
    printf '%s\n' "$report" | sed 's/^/  /' >&2
    fail "node check failed: ${fails:-$report}"
  fi
}

cmd_mount() {
  need METFS_SOURCE
  need METFS_BUDGET
  setup_paths
  resolve_dds
  command -v "$METFS_BIN" >/dev/null 2>&1 || fail "metfs executable '$METFS_BIN' not found (set METFS_BIN)"
  [ -e /dev/fuse ] || fail "/dev/fuse is missing: FUSE is not available on this node"
  if is_mounted && daemon_pid >/dev/null && daemon_answers; then
    say "already mounted at $MNT (daemon pid $(daemon_pid))"
    return 0
  fi
  if is_mounted || daemon_pid >/dev/null; then
    # A mount whose daemon died (or does not answer) cannot be mounted over: clear it first.
    say "clearing a stale metfs mount or daemon at $MNT"
    do_umount || fail "cannot clear the stale mount at $MNT"
  fi
  local parent
  parent=$(dirname "$CACHE")
  if [ ! -d "$CACHE" ]; then
    [ -d "$parent" ] || fail "cache directory $CACHE: its parent $parent does not exist (is node-local storage mounted on this node? METFS_CACHE_ROOT=$METFS_CACHE_ROOT)"
    mkdir -p -m 0700 "$CACHE" 2>/dev/null || fail "cache directory $CACHE: cannot create it in $parent"
  fi
  [ -w "$CACHE" ] || fail "cache directory $CACHE is not writable"
  mkdir -p "$MNT" 2>/dev/null || fail "mountpoint $MNT: cannot create it"
  # Node sharding: the same rank and count on every node's command line.
  local rank=${SLURM_NODEID:-0} nodes=${SLURM_NNODES:-1}
  extra_args
  local -a settings=(--source "$METFS_SOURCE" --cache "$CACHE" --budget "$METFS_BUDGET"
                     --node-rank "$rank" --nodes "$nodes" --socket "$SOCK" "${EXTRA[@]}")
  catalog_path
  if [ -n "$CATALOG" ]; then
    [ -r "$CATALOG" ] || fail "catalog file $CATALOG cannot be read: run \`metfs-node.sh catalog\` once before mounting (or unset METFS_CATALOG)"
    settings+=(--catalog "$CATALOG")
  fi
  if [ "${METFS_DOCTOR:-1}" != 0 ]; then
    check_node "${settings[@]}"
  fi
  local -a cmd=("$METFS_BIN" mount "${settings[@]}" "$MNT")
  if [ -n "${METFS_DDS:-}" ]; then
    say "mounting $MNT (shards from the queue $METFS_DDS, cache $CACHE, budget $METFS_BUDGET)"
  else
    say "mounting $MNT (node $rank of $nodes, cache $CACHE, budget $METFS_BUDGET${CATALOG:+, catalog $CATALOG})"
  fi
  local out rc=0
  out=$(timeout --kill-after=10 "$MOUNT_TIMEOUT" "${cmd[@]}" 2>&1) || rc=$?
  if [ "$rc" -ne 0 ]; then
    local reason
    reason=$(printf '%s' "$out" | sed -e 's/^metfs: //' | tr '\n' ' ')
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      reason="the first mini-epoch was not staged within ${MOUNT_TIMEOUT}s (METFS_MOUNT_TIMEOUT)"
    fi
    # Leave nothing half-started behind.
    do_umount >/dev/null 2>&1 || true
    fail "mount failed: $reason"
  fi
  is_mounted || fail "metfs mount returned 0 but $MNT is not mounted"
  say "mounted $MNT, first mini-epoch staged (daemon pid $(daemon_pid || echo '?'), socket $SOCK)"
}

# Unmounts MNT and stops the daemon; returns non-zero if something is left.
do_umount() {
  local pid="" _
  pid=$(daemon_pid) || pid=""
  if is_mounted || [ -n "$pid" ]; then
    if command -v "$METFS_BIN" >/dev/null 2>&1; then
      timeout --kill-after=5 $((UMOUNT_TIMEOUT + 5)) \
        "$METFS_BIN" umount --timeout "$UMOUNT_TIMEOUT" "$MNT" >/dev/null 2>&1 || true
    fi
  fi
  if [ -n "$pid" ] && alive "$pid"; then
    say "daemon $pid still running after metfs umount; SIGTERM"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do
      alive "$pid" || break
      sleep 0.1
    done
    if alive "$pid"; then
      say "daemon $pid ignored SIGTERM; SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      sleep 0.2
    fi
  fi
  if is_mounted; then
    say "$MNT still mounted; detaching it"
    umount -l "$MNT" 2>/dev/null || fusermount3 -u -z "$MNT" 2>/dev/null || true
  fi
  if is_mounted; then
    say "cannot unmount $MNT"
    return 1
  fi
  if pid=$(daemon_pid); then
    say "daemon $pid is still running"
    return 1
  fi
  return 0
}

cmd_umount() {
  setup_paths
  local was=no
  if is_mounted || daemon_pid >/dev/null; then was=yes; fi
  do_umount || fail "umount incomplete"
  if [ "$was" = yes ]; then
    say "unmounted $MNT"
  fi
}

cmd_status() {
  setup_paths
  if ! is_mounted; then
    fail "$MNT is not mounted"
  fi
  "$METFS_BIN" status --socket "$SOCK" "$@" || fail "the daemon does not answer on $SOCK"
}

GUARD_SLEEP=""
guard_stop() {
  trap '' TERM INT HUP
  if [ -n "$GUARD_SLEEP" ]; then kill "$GUARD_SLEEP" 2>/dev/null || true; fi
  setup_paths
  if is_mounted || daemon_pid >/dev/null; then
    say "job ending: unmounting $MNT"
    do_umount || fail "umount incomplete"
    say "unmounted $MNT"
  fi
  exit 0
}

cmd_guard() {
  setup_paths
  trap guard_stop TERM INT HUP
  if ! { is_mounted && daemon_pid >/dev/null; }; then
    say "no live metfs daemon for $MNT; mounting (again)"
    cmd_mount
  fi
  # `wait` returns as soon as a trapped signal arrives; `sleep` alone would delay the trap.
  while true; do
    sleep 3600 &
    GUARD_SLEEP=$!
    wait "$GUARD_SLEEP" || true
  done
}

cmd_ready() {
  setup_paths
  local end=$((SECONDS + MOUNT_TIMEOUT))
  while ! { is_mounted && daemon_pid >/dev/null && daemon_answers; }; do
    if [ "$SECONDS" -ge "$end" ]; then
      log_tail
      fail "no live metfs mount at $MNT after ${MOUNT_TIMEOUT}s (METFS_MOUNT_TIMEOUT)"
    fi
    sleep 0.5
  done
}

cmd_paths() {
  setup_paths
  printf 'METFS_NODE=%q\nMETFS_CACHE=%q\nMETFS_MOUNT=%q\nMETFS_SOCKET=%q\n' "$NODE" "$CACHE" "$MNT" "$SOCK"
}

case "${1:-}" in
  mount) cmd_mount ;;
  catalog) cmd_catalog ;;
  umount) cmd_umount ;;
  status) shift; cmd_status "$@" ;;
  guard) cmd_guard ;;
  ready) cmd_ready ;;
  paths) cmd_paths ;;
  etcd) cmd_etcd ;;
  *) echo "usage: $0 catalog|mount|umount|status [--json]|guard|ready|paths|etcd" >&2; exit 2 ;;
esac
