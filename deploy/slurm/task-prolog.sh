#!/usr/bin/env bash
# Slurm TaskProlog for the metfs node service (prolog.sh): runs as the job's user before each
# task and prints the lines Slurm turns into the task's environment:
#
#   export METFS_MOUNT=<the job's mount on this node>
#   export METFS_SOCKET=<its control socket>
#
# so `metfs.Client()` (which reads METFS_SOCKET) and a loader given $METFS_MOUNT find them with
# no setting in the job. METFS_PROLOG_ROOT must be the Prolog's (default /var/tmp/metfs-jobs);
# a job on a node where the Prolog mounted nothing gets no lines, and runs as it would without
# metfs.
set -u
ROOT=${METFS_PROLOG_ROOT:-/var/tmp/metfs-jobs}
NODE=${SLURMD_NODENAME:-$(hostname -s)}
env_file="$ROOT/${SLURM_JOB_ID:-none}-$NODE/metfs.env"
if [ -r "$env_file" ]; then
  cat "$env_file"
fi
exit 0
