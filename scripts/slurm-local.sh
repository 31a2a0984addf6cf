#!/usr/bin/env bash
# A local Slurm cluster of emulated nodes on this host (two by default), for testing the job
# scripts in deploy/slurm.
#
#   scripts/slurm-local.sh start    # install if needed, start munge, slurmctld, slurmd n1 .. nN
#   scripts/slurm-local.sh stop     # cancel leftover jobs, stop the daemons (by pid)
#   scripts/slurm-local.sh status   # sinfo and squeue
#   scripts/slurm-local.sh env      # print the export line without starting anything
#
# `start` prints `export SLURM_CONF=...` on stdout, so `eval "$(scripts/slurm-local.sh start)"`
# points srun, sbatch, squeue and scancel at this cluster. Everything else goes to stderr.
# Both commands are idempotent: `start` starts only what is not running, `stop` stops only
# what this script started (pid files under the cluster directory), munged included unless
# another Slurm daemon on this host still needs it.
#
# Settings (environment):
#   SLURM_LOCAL_DIR     directory for slurm.conf, state, spool, pid and log files
#                       (default /tmp/metfs-slurm)
#   SLURM_LOCAL_PORT    slurmctld port; the nodes use PORT+1 .. PORT+N (default 16817)
#   SLURM_LOCAL_NODES   N, the number of nodes n1 .. nN: 1 to 64 (default 2). `stop` stops
#                       every node the cluster was started with, whatever N is then; `start`
#                       refuses a running cluster of another size (stop it first)
#   SLURM_LOCAL_EPILOG  optional Epilog script (absolute path), e.g. deploy/slurm/epilog.sh
#   SLURM_LOCAL_PROLOG  optional Prolog script (absolute path), run on every node of a job at
#                       allocation (PrologFlags=Alloc), e.g. a wrapper of deploy/slurm/prolog.sh
#   SLURM_LOCAL_TASK_PROLOG  optional TaskProlog script (absolute path)
#   SLURM_LOCAL_KILLWAIT  seconds between SIGTERM and SIGKILL when a job is cancelled or hits
#                       its time limit (default 15)
#
# The nodes n1 .. nN are N slurmd processes on this host (`slurmd -N n1`): they share one
# hostname, one /tmp, one disk and the host's cores, so anything node-local must be keyed by
# $SLURMD_NODENAME, and timings at many nodes measure the host, not N machines.
# Requires root (slurmd runs jobs as their users) and Debian 12's slurm-wlm 22.05.
set -euo pipefail

DIR=${SLURM_LOCAL_DIR:-/tmp/metfs-slurm}
PORT=${SLURM_LOCAL_PORT:-16817}
EPILOG=${SLURM_LOCAL_EPILOG:-}
PROLOG=${SLURM_LOCAL_PROLOG:-}
TASK_PROLOG=${SLURM_LOCAL_TASK_PROLOG:-}
KILLWAIT=${SLURM_LOCAL_KILLWAIT:-15}
CONF="$DIR/slurm.conf"
MAX_NODES=64
NNODES=${SLURM_LOCAL_NODES:-2}

log() { printf 'slurm-local: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

case "$NNODES" in
  0) die "SLURM_LOCAL_NODES=0: a cluster has at least 1 node" ;;
  '' | *[!0-9]* | 0*) die "SLURM_LOCAL_NODES=$NNODES: not a node count (a whole number from 1 to $MAX_NODES)" ;;
esac
[ "$NNODES" -le "$MAX_NODES" ] \
  || die "SLURM_LOCAL_NODES=$NNODES: more nodes than this script emulates on one host (at most $MAX_NODES)"
NODES=()
for ((i = 1; i <= NNODES; i++)); do NODES+=("n$i"); done
# Slurm's names for all of them: n1, or n[1-N].
if [ "$NNODES" = 1 ]; then NODELIST=n1; PORTS=$((PORT + 1)); else
  NODELIST="n[1-$NNODES]"; PORTS="$((PORT + 1))-$((PORT + NNODES))"; fi

# The node count of the cluster whose slurm.conf is in DIR (0: none written yet; 2: one
# written before the count was recorded, when there were always two).
conf_nodes() {
  [ -f "$CONF" ] || { echo 0; return; }
  sed -n 's/^# nodes: //p' "$CONF" | head -n 1 | grep -E '^[0-9]+$' || echo 2
}

# A zombie (a daemon killed and not reaped yet) is not alive: `start` must start it again.
pid_alive() {
  local f=$1 pid state
  [ -s "$f" ] || return 1
  pid=$(cat "$f")
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  state=$(ps -o stat= -p "$pid" 2>/dev/null) || return 1
  [ "${state:0:1}" != Z ]
}

install_if_needed() {
  local pkgs=(slurm-wlm slurmctld slurmd slurm-client munge) missing=() p
  for p in "${pkgs[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "apt-get install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >/dev/null
  fi
}

munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
  if munge_ok; then
    return
  fi
  install -d -o munge -g munge -m 0755 /run/munge
  if [ ! -s /etc/munge/munge.key ]; then
    die "/etc/munge/munge.key is missing (the munge package creates it)"
  fi
  log "starting munged"
  runuser -u munge -- /usr/sbin/munged
  local i
  for i in $(seq 1 50); do
    munge_ok && break
    sleep 0.1
  done
  munge_ok || die "munged did not come up"
  # Remember that munged is ours, so that `stop` stops it and nothing else.
  cp /run/munge/munged.pid "$DIR/munged.pid" 2>/dev/null \
    || pgrep -u munge -x munged -n > "$DIR/munged.pid"
}

write_conf() {
  local host epilog_line="" prolog_lines=""
  host=$(hostname -s)
  if [ -n "$EPILOG" ]; then
    [ -x "$EPILOG" ] || die "SLURM_LOCAL_EPILOG=$EPILOG is not an executable file"
    epilog_line="Epilog=$EPILOG"
  fi
  if [ -n "$PROLOG" ]; then
    [ -x "$PROLOG" ] || die "SLURM_LOCAL_PROLOG=$PROLOG is not an executable file"
    prolog_lines="Prolog=$PROLOG"$'\n'"PrologFlags=Alloc"
  fi
  if [ -n "$TASK_PROLOG" ]; then
    [ -x "$TASK_PROLOG" ] || die "SLURM_LOCAL_TASK_PROLOG=$TASK_PROLOG is not an executable file"
    prolog_lines="$prolog_lines"$'\n'"TaskProlog=$TASK_PROLOG"
  fi
  mkdir -p "$DIR/state" "$DIR/log"
  for n in "${NODES[@]}"; do
    mkdir -p "$DIR/spool/$n" "$DIR/tmp/$n"
  done
  cat > "$CONF.tmp" <<EOF
# Written by scripts/slurm-local.sh: emulated nodes on one host.
# nodes: $NNODES
ClusterName=metfslocal
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
StateSaveLocation=$DIR/state
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmdSpoolDir=$DIR/spool/%n
TmpFS=$DIR/tmp/%n
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MailProg=/bin/true
ReturnToService=2
SlurmctldTimeout=60
SlurmdTimeout=60
InactiveLimit=0
MinJobAge=600
KillWait=$KILLWAIT
MessageTimeout=10
SlurmdParameters=config_overrides
$epilog_line
$prolog_lines
NodeName=$NODELIST NodeHostname=$host NodeAddr=127.0.0.1 Port=$PORTS CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=$NODELIST Default=YES MaxTime=INFINITE State=UP
EOF
  mv "$CONF.tmp" "$CONF"
}

# Every node up: idle, or running a job (a restart of one slurmd while jobs run).
wait_nodes_idle() {
  local i state up
  for i in $(seq 1 $((100 + 5 * NNODES))); do
    state=$(SLURM_CONF=$CONF sinfo -h -N -o '%N %T' 2>/dev/null | sort -V | tr '\n' ' ' || true)
    up=$(SLURM_CONF=$CONF sinfo -h -N -o '%N %T' 2>/dev/null \
      | grep -cE ' (idle|mixed|allocated|completing)$' || true)
    [ "$up" = "$NNODES" ] && return 0
    # A node that registered before the controller knew it may be down; bring it back.
    if [ "$i" = 30 ]; then
      SLURM_CONF=$CONF scontrol update NodeName="$NODELIST" State=RESUME >/dev/null 2>&1 || true
    fi
    sleep 0.2
  done
  die "nodes not idle after $(((100 + 5 * NNODES) / 5)) s: $state (logs in $DIR/log)"
}

all_slurmd_alive() {
  local n
  for n in "${NODES[@]}"; do pid_alive "$DIR/slurmd-$n.pid" || return 1; done
}

start() {
  install_if_needed
  mkdir -p "$DIR"
  local running
  running=$(conf_nodes)
  if pid_alive "$DIR/slurmctld.pid" && [ "$running" != "$NNODES" ]; then
    die "a cluster of $running nodes runs in $DIR; SLURM_LOCAL_NODES=$NNODES asks for $NNODES (scripts/slurm-local.sh stop first)"
  fi
  if pid_alive "$DIR/slurmctld.pid" && all_slurmd_alive; then
    log "already running ($DIR)"
    echo "export SLURM_CONF=$CONF"
    return
  fi
  start_munge
  write_conf
  export SLURM_CONF=$CONF
  if ! pid_alive "$DIR/slurmctld.pid"; then
    log "starting slurmctld on port $PORT"
    # -i: ignore state files left by an earlier run with another configuration.
    /usr/sbin/slurmctld -i
  fi
  local i n
  for i in $(seq 1 50); do
    scontrol ping 2>/dev/null | grep -q UP && break
    sleep 0.2
  done
  scontrol ping 2>/dev/null | grep -q UP || die "slurmctld did not answer (log $DIR/log/slurmctld.log)"
  for n in "${NODES[@]}"; do
    if ! pid_alive "$DIR/slurmd-$n.pid"; then
      log "starting slurmd -N $n"
      /usr/sbin/slurmd -N "$n"
    fi
  done
  wait_nodes_idle
  log "cluster up: $(sinfo -h -o '%P %D %T' | tr '\n' ' ')"
  echo "export SLURM_CONF=$CONF"
}

# Pids of job step daemons started by our slurmd (their environment names our slurm.conf).
our_stepds() {
  local p
  for p in $(pgrep -x slurmstepd 2>/dev/null || true); do
    if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "SLURM_CONF=$CONF"; then
      echo "$p"
    fi
  done
}

stop_pidfile() {
  local f=$1 what=$2 pid i
  pid_alive "$f" || { rm -f "$f"; return 0; }
  pid=$(cat "$f")
  log "stopping $what (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    log "$what did not stop in 10 s; SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

stop() {
  [ -d "$DIR" ] || { log "nothing to stop ($DIR missing)"; return 0; }
  export SLURM_CONF=$CONF
  local i n p
  if pid_alive "$DIR/slurmctld.pid" && [ -n "$(squeue -h -o %i 2>/dev/null)" ]; then
    log "cancelling leftover jobs: $(squeue -h -o %i | tr '\n' ' ')"
    for p in $(squeue -h -o %i); do scancel --quiet "$p" 2>/dev/null || true; done
    for i in $(seq 1 $(( (KILLWAIT + 15) * 5 ))); do
      [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
  # The daemons take about two seconds each to stop; stop them together. Every node the
  # cluster was started with, whatever SLURM_LOCAL_NODES is now.
  local -a bg=()
  local f
  for f in "$DIR"/slurmd-*.pid; do
    [ -e "$f" ] || continue
    n=${f##*/slurmd-}
    stop_pidfile "$f" "slurmd ${n%.pid}" &
    bg+=($!)
  done
  stop_pidfile "$DIR/slurmctld.pid" "slurmctld" &
  bg+=($!)
  wait "${bg[@]}"
  for p in $(our_stepds); do
    log "killing leftover slurmstepd $p"
    kill -KILL "$p" 2>/dev/null || true
  done
  if [ -f "$DIR/munged.pid" ]; then
    # munged serves the whole host: leave it to any other Slurm daemon still running here.
    if pgrep -x slurmctld >/dev/null 2>&1 || pgrep -x slurmd >/dev/null 2>&1; then
      log "leaving munged running: other Slurm daemons on this host use it"
      rm -f "$DIR/munged.pid"
    else
      stop_pidfile "$DIR/munged.pid" "munged"
    fi
  fi
  log "stopped"
}

status() {
  export SLURM_CONF=$CONF
  sinfo
  squeue
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
