#!/usr/bin/env bash
# Slurm Prolog: the metfs node service. On each node of a job, as root, it starts one metfs
# daemon that mounts the site's dataset for the job's user, so the user's reads take FUSE
# passthrough (which the kernel grants only to a daemon with CAP_SYS_ADMIN) while the tier is
# read with the user's own rights (`metfs mount --run-as`: the daemon runs as the user and keeps
# of root only CAP_SYS_ADMIN; a file the user may not read at the source is never staged,
# listed or served).
#
#   slurm.conf:  Prolog=/etc/slurm/prolog.d/metfs-prolog.sh      (a wrapper, see below)
#                PrologFlags=Alloc                               (run it on every node at once)
#                TaskProlog=/etc/slurm/metfs-task-prolog.sh      (task-prolog.sh: the job's env)
#                Epilog=/etc/slurm/epilog.d/metfs-epilog.sh      (epilog.sh: unmount, clean up)
#
# Site settings (environment; a site sets them in a two-line wrapper that exports them and
# execs this file, since slurmd gives the Prolog only Slurm's own variables):
#   METFS_PROLOG_CONFIG  the mount's settings, a `metfs mount --config` TOML file: source,
#                        budget, rf, ... (required; `cache`, `socket` and `allow_other` are
#                        set here)
#   METFS_PROLOG_ROOT    where each job's directory goes on node-local storage (default
#                        /var/tmp/metfs-jobs); created 0755 root if missing
#   METFS_PROLOG_KEEP    1: the Epilog keeps the user's cache for their next job on the node
#                        (default 0: it is removed with the job)
#   METFS_BIN            the metfs executable (default `metfs` on PATH)
#   METFS_PROLOG_CATALOG a directory on a file system every node reads (and root may create
#                        directories in) for the catalog files: the source is then listed once
#                        per job, not once per node. The job's first node makes
#                        DIR/<uid>/catalog.bin as the job's user (`metfs catalog`, which keeps
#                        the user's last one while the source is unchanged) and writes the job's
#                        id to DIR/<uid>/catalog.job; the other nodes wait for that id, then
#                        every node mounts from the file (`--catalog`). Unset: every node lists
#                        the source itself
#   METFS_PROLOG_CATALOG_TIMEOUT  seconds the other nodes wait for the first one's catalog
#                        (default 600)
#
# Each job gets ROOT/<job>-<node>/ (the node name in it because test clusters run several
# slurmd on one host), owned by the job's user, mode 0700: nobody else can reach the mount, the
# cache or the socket inside it. In it: `cache/` (the slots, the log, the socket
# `cache/metfs.sock`), `mnt/` (the mount) and `metfs.env`, the lines task-prolog.sh prints
# (METFS_MOUNT, METFS_SOCKET), for jobs on clusters without a TaskProlog.
#
# A Prolog that fails drains the node, so this exits non-zero only when the job cannot get its
# mount (it then says why on stderr, which slurmd logs): the job's user not known, no config,
# or `metfs mount` failing (for example the source unreachable).
set -euo pipefail

JOB=${SLURM_JOB_ID:-}
NODE=${SLURMD_NODENAME:-$(hostname -s)}
ROOT=${METFS_PROLOG_ROOT:-/var/tmp/metfs-jobs}
CONF=${METFS_PROLOG_CONFIG:-}
KEEP=${METFS_PROLOG_KEEP:-0}
BIN=${METFS_BIN:-metfs}

die() {
  printf 'metfs-prolog: job %s on %s: %s\n' "${JOB:-?}" "$NODE" "$*" >&2
  if command -v logger >/dev/null 2>&1; then
    logger -t metfs-prolog -- "job ${JOB:-?}: $*" 2>/dev/null || true
  fi
  exit 1
}

[ -n "$JOB" ] || die "SLURM_JOB_ID is not set: run this as slurmd's Prolog"
# Slurm 22.05 sets SLURM_JOB_USER and SLURM_JOB_UID in the Prolog's environment.
user=${SLURM_JOB_USER:-${SLURM_JOB_UID:-}}
[ -n "$user" ] || die "the job's user is not known (neither SLURM_JOB_USER nor SLURM_JOB_UID is set); nothing was mounted"
uid=$(id -u "$user" 2>/dev/null) || die "the job's user '$user' is not known on this node; nothing was mounted"
[ "$uid" != 0 ] || die "the job runs as root; a root job mounts metfs itself (deploy/slurm/metfs-node.sh)"
[ -n "$CONF" ] || die "METFS_PROLOG_CONFIG is not set (the site's metfs mount settings, a TOML file)"
[ -r "$CONF" ] || die "METFS_PROLOG_CONFIG=$CONF cannot be read"
gid=$(id -g "$user")

# A node list such as `n[1-2],gpu[01-03,07],login`, one name per line: scontrol's expansion,
# else this one (one bracket group per name, ranges keep their zero padding).
expand_hosts() {
  if scontrol show hostnames "$1" 2>/dev/null; then
    return
  fi
  local list=$1 part prefix body suffix item a b w i
  # Split at commas outside brackets.
  local -a parts=()
  local cur=""
  local depth=0 c
  for ((i = 0; i < ${#list}; i++)); do
    c=${list:i:1}
    case "$c" in
      '[') depth=$((depth + 1)); cur+=$c ;;
      ']') depth=$((depth - 1)); cur+=$c ;;
      ',') if [ "$depth" -eq 0 ]; then parts+=("$cur"); cur=""; else cur+=$c; fi ;;
      *) cur+=$c ;;
    esac
  done
  [ -n "$cur" ] && parts+=("$cur")
  for part in "${parts[@]}"; do
    if [[ $part =~ ^([^\[]*)\[([^]]*)\](.*)$ ]]; then
      prefix=${BASH_REMATCH[1]} body=${BASH_REMATCH[2]} suffix=${BASH_REMATCH[3]}
      IFS=, read -ra items <<< "$body"
      for item in "${items[@]}"; do
        if [[ $item =~ ^([0-9]+)-([0-9]+)$ ]]; then
          a=${BASH_REMATCH[1]} b=${BASH_REMATCH[2]} w=${#BASH_REMATCH[1]}
          for ((i = 10#$a; i <= 10#$b; i++)); do printf '%s%0*d%s\n' "$prefix" "$w" "$i" "$suffix"; done
        else
          printf '%s%s%s\n' "$prefix" "$item" "$suffix"
        fi
      done
    else
      printf '%s\n' "$part"
    fi
  done
}

# The node's share of each mini-epoch: this node's place in the job's node list.
# slurmd 22.05 names it SLURM_NODELIST in the Prolog, SLURM_JOB_NODELIST in jobs.
nodelist=${SLURM_JOB_NODELIST:-${SLURM_NODELIST:-}}
rank=0 nodes=1
if [ -n "$nodelist" ]; then
  mapfile -t hosts < <(expand_hosts "$nodelist")
  found=0
  for i in "${!hosts[@]}"; do
    if [ "${hosts[$i]}" = "$NODE" ]; then
      rank=$i found=1
    fi
  done
  [ "$found" = 1 ] || die "node $NODE is not in the job's node list $nodelist; nothing was mounted"
  nodes=${#hosts[@]}
fi

install -d -m 0755 -o root -g root "$ROOT"
dir="$ROOT/$JOB-$NODE"
# A directory of this name left by an earlier run of this job id is not ours to trust.
if [ -e "$dir" ] || [ -L "$dir" ]; then
  umount -l "$dir/mnt" 2>/dev/null || true
  rm -rf --one-file-system "$dir"
fi
install -d -m 0700 -o "$uid" -g "$gid" "$dir"
kept="$ROOT/kept-$uid"
if [ "$KEEP" = 1 ] && [ -d "$kept" ] && [ ! -L "$kept" ] && [ "$(stat -c %u "$kept")" = "$uid" ]; then
  # The user's cache from their last job on this node: the daemon resumes what it can of it.
  mv "$kept" "$dir/cache"
else
  install -d -m 0700 -o "$uid" -g "$gid" "$dir/cache"
fi
install -d -m 0700 -o "$uid" -g "$gid" "$dir/mnt"

# One listing per job (METFS_PROLOG_CATALOG): the first node catalogues the source as the
# job's user, the others wait for its word in catalog.job ("JOB" done, "failed JOB" not).
catalog_args=()
if [ -n "${METFS_PROLOG_CATALOG:-}" ]; then
  udir="$METFS_PROLOG_CATALOG/$uid"
  catfile="$udir/catalog.bin"
  word="$udir/catalog.job"
  # Written by the user, so that a file system that squashes root takes it.
  say_job() {
    # shellcheck disable=SC2016 # $1 and $2 are the inner shell's arguments
    runuser -u "$user" -- sh -c 'printf "%s\n" "$1" > "$2.tmp" && mv -f "$2.tmp" "$2"' sh "$1" "$word"
  }
  if [ "$rank" = 0 ]; then
    install -d -m 0700 -o "$uid" -g "$gid" "$udir" || die "catalog directory $udir: cannot create it; nothing was mounted"
    if ! out=$(cd / && runuser -u "$user" -- "$BIN" catalog --config "$CONF" -o "$catfile" 2>&1); then
      say_job "failed $JOB" || true
      die "metfs catalog failed: $(printf '%s' "$out" | tail -n 5 | tr '\n' ' ')"
    fi
    say_job "$JOB" || die "catalog directory $udir: cannot write $word"
    printf 'metfs-prolog: job %s on %s: %s\n' "$JOB" "$NODE" "$out" >&2
  else
    end=$((SECONDS + ${METFS_PROLOG_CATALOG_TIMEOUT:-600}))
    while :; do
      said=$(cat "$word" 2>/dev/null || true)
      [ "$said" = "$JOB" ] && break
      [ "$said" = "failed $JOB" ] && die "the job's first node could not catalogue the source (its Prolog log says why); nothing was mounted"
      [ "$SECONDS" -lt "$end" ] || die "no catalog from the job's first node after ${METFS_PROLOG_CATALOG_TIMEOUT:-600} s ($word); nothing was mounted"
      sleep 0.5
    done
  fi
  catalog_args=(--catalog "$catfile")
fi

# The daemon's environment names the job and node, so that epilog.sh finds it.
if ! out=$(SLURM_JOB_ID=$JOB SLURMD_NODENAME=$NODE "$BIN" mount --run-as "$user" --config "$CONF" \
    --cache "$dir/cache" --socket "$dir/cache/metfs.sock" --allow-other \
    --history "$dir/cache/rf-history.json" --node-rank "$rank" --nodes "$nodes" \
    "${catalog_args[@]}" "$dir/mnt" 2>&1); then
  die "metfs mount failed: $(printf '%s' "$out" | tail -n 5 | tr '\n' ' ')"
fi
printf 'export METFS_MOUNT=%s\nexport METFS_SOCKET=%s\n' "$dir/mnt" "$dir/cache/metfs.sock" > "$dir/metfs.env"
chown "$uid:$gid" "$dir/metfs.env"
chmod 0600 "$dir/metfs.env"
printf 'metfs-prolog: job %s on %s: mounted %s for %s (node %s of %s)\n' "$JOB" "$NODE" "$dir/mnt" "$user" "$rank" "$nodes" >&2
exit 0
