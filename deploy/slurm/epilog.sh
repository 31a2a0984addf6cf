#!/usr/bin/env bash
# Slurm Epilog example: remove every metfs mount and daemon a job left on this node.
#
# The job scripts in this directory clean up by themselves (a trap, and a guard step that
# Slurm signals on cancel and at the time limit). This Epilog is the last line of defence for
# jobs that do not, or that were killed hard (SIGKILL after KillWait, a crashed batch script):
#
#   slurm.conf:  Epilog=/etc/slurm/epilog.d/metfs-epilog.sh     (a copy of this file)
#
# slurmd runs it as root on every node of the job once the job has ended, with SLURM_JOB_ID,
# SLURM_JOB_UID and SLURMD_NODENAME set. It
#   1. finds the metfs processes started by this job on this node (their environment holds
#      SLURM_JOB_ID=<job>, and SLURMD_NODENAME=<node> where several nodes share a host),
#   2. stops each one with SIGTERM (the daemon unmounts and saves its position), then SIGKILL
#      after METFS_EPILOG_WAIT seconds (default 10),
#   3. detaches (umount -l) the mount of each such daemon if it is still there, and any metfs
#      mount whose daemon is gone (a dead FUSE mount only returns errors, whoever left it),
#   4. removes their entries from metfs's mount registry (/run/metfs, /tmp/metfs-<uid>),
#   5. removes the job's directory of the node service (prolog.sh, under METFS_PROLOG_ROOT,
#      default /var/tmp/metfs-jobs), or with METFS_PROLOG_KEEP=1 keeps its cache as
#      ROOT/kept-<uid> for the user's next job on the node.
# Caches of jobs that mounted for themselves are left in place, so the next job on the node
# resumes from them.
#
# It always exits 0 (a failing Epilog drains the node); what it did and what it could not do
# goes to stderr and, where `logger` exists, to syslog with the tag metfs-epilog. Set
# METFS_EPILOG_STRICT=1 to exit 1 when something is left (Slurm then drains the node).
#
# Test it by hand: SLURM_JOB_ID=1234 SLURMD_NODENAME=$(hostname -s) ./epilog.sh
set -euo pipefail

JOB=${SLURM_JOB_ID:-}
NODE=${SLURMD_NODENAME:-}
WAIT=${METFS_EPILOG_WAIT:-10}
STRICT=${METFS_EPILOG_STRICT:-0}
left=0

note() {
  printf 'metfs-epilog: job %s on %s: %s\n' "${JOB:-?}" "${NODE:-$(hostname -s)}" "$*" >&2
  if command -v logger >/dev/null 2>&1; then
    logger -t metfs-epilog -- "job ${JOB:-?}: $*" 2>/dev/null || true
  fi
}

if [ -z "$JOB" ]; then
  note "SLURM_JOB_ID is not set; nothing to do"
  exit 0
fi

alive() {
  local state
  state=$(sed -e 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
  [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}

# One variable of a process's environment.
env_of() {
  { tr '\0' '\n' < "/proc/$1/environ"; } 2>/dev/null | sed -n "s/^$2=//p" | head -n 1
}

# Whether PATH is a metfs mount (type fuse.metfs, or fuse with source metfs).
is_metfs_mount() {
  local want=${1// /\\040}
  awk -v m="$want" '$2 == m && ($3 == "fuse.metfs" || ($3 == "fuse" && $1 == "metfs")) { f = 1 }
                    END { exit !f }' /proc/mounts
}

detach() {
  local mp=$1
  is_metfs_mount "$mp" || return 0
  umount -l "$mp" 2>/dev/null || fusermount3 -u -z "$mp" 2>/dev/null || true
  if is_metfs_mount "$mp"; then
    note "cannot unmount $mp"
    left=1
  else
    note "detached $mp"
  fi
}

# Registry entries: "FILE<TAB>PID<TAB>MOUNTPOINT" for every metfs mount registry file.
registry() {
  local f pid mp
  for f in /run/metfs/*.json /tmp/metfs-*/*.json "${TMPDIR:-/tmp}"/metfs-*/*.json; do
    [ -f "$f" ] || continue
    pid=$(sed -n 's/.*"pid":\([0-9]*\).*/\1/p' "$f")
    mp=$(sed -n 's/.*"mountpoint":"\([^"]*\)".*/\1/p' "$f")
    printf '%s\t%s\t%s\n' "$f" "$pid" "$mp"
  done | sort -u
}

# 1. This job's metfs processes on this node.
pids=()
for p in $(pgrep -x metfs 2>/dev/null || true); do
  [ "$(env_of "$p" SLURM_JOB_ID)" = "$JOB" ] || continue
  n=$(env_of "$p" SLURMD_NODENAME)
  if [ -n "$NODE" ] && [ -n "$n" ] && [ "$n" != "$NODE" ]; then
    continue
  fi
  pids+=("$p")
done

# Their mountpoints, from the registry, else the argument of their command line that is a
# metfs mount now.
declare -A mount_of=()
while IFS=$'\t' read -r f pid mp; do
  for p in "${pids[@]}"; do
    [ "$p" = "$pid" ] && mount_of[$p]="$mp|$f"
  done
done < <(registry)
for p in "${pids[@]}"; do
  if [ -z "${mount_of[$p]:-}" ]; then
    mp=""
    while IFS= read -r arg; do
      if [ "${arg:0:1}" = / ] && is_metfs_mount "$arg"; then mp=$arg; fi
    done < <({ tr '\0' '\n' < "/proc/$p/cmdline"; } 2>/dev/null)
    mount_of[$p]="$mp|"
  fi
done

# 2. Stop them.
for p in "${pids[@]}"; do
  note "stopping metfs daemon $p (${mount_of[$p]%%|*})"
  kill -TERM "$p" 2>/dev/null || true
done
deadline=$((SECONDS + WAIT))
for p in "${pids[@]}"; do
  while alive "$p" && [ "$SECONDS" -lt "$deadline" ]; do
    sleep 0.2
  done
  if alive "$p"; then
    note "metfs daemon $p ignored SIGTERM for ${WAIT}s; SIGKILL"
    kill -KILL "$p" 2>/dev/null || true
  fi
done

# 3. and 4. Their mounts, and every metfs mount whose daemon is gone.
for p in "${pids[@]}"; do
  entry=${mount_of[$p]}
  mp=${entry%%|*}
  f=${entry#*|}
  [ -n "$mp" ] && detach "$mp"
  [ -n "$f" ] && rm -f "$f"
done
while IFS=$'\t' read -r f pid mp; do
  if [ -n "$pid" ] && alive "$pid"; then
    continue
  fi
  [ -n "$mp" ] && detach "$mp"
  rm -f "$f"
done < <(registry)

# 5. The node service's job directory (prolog.sh): its mount is detached above; its cache goes
# (or, with METFS_PROLOG_KEEP=1, is kept for the user's next job on this node).
PROLOG_ROOT=${METFS_PROLOG_ROOT:-/var/tmp/metfs-jobs}
jobdir="$PROLOG_ROOT/$JOB-${NODE:-$(hostname -s)}"
if [ -d "$jobdir" ] && [ ! -L "$jobdir" ]; then
  detach "$jobdir/mnt"
  if is_metfs_mount "$jobdir/mnt"; then
    note "the job's mount $jobdir/mnt is still there; its directory is left"
    left=1
  else
    owner=$(stat -c %u "$jobdir")
    if [ "${METFS_PROLOG_KEEP:-0}" = 1 ] && [ -d "$jobdir/cache" ] && [ "$owner" != 0 ]; then
      rm -rf --one-file-system "$PROLOG_ROOT/kept-$owner"
      rm -f "$jobdir/cache/metfs.sock"
      mv "$jobdir/cache" "$PROLOG_ROOT/kept-$owner" && note "kept the cache for uid $owner's next job"
    fi
    rm -rf --one-file-system "$jobdir" && note "removed $jobdir"
  fi
fi

if [ "$left" -ne 0 ] && [ "$STRICT" = 1 ]; then
  exit 1
fi
exit 0
