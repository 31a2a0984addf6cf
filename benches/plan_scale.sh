#!/usr/bin/env bash
# Planning at scale: wall time and peak RSS of reading a manifest and planning one epoch
# (stratified, 1,000 classes, 8 nodes) at 1.28M and 10M samples, against the goals
# (1.28M: 2 s, 300 MB; 10M: 15 s, 2 GB). Results go in docs/BENCHMARKS.md.
#
# usage: benches/plan_scale.sh [WORKDIR]   (manifests are generated there once and reused;
#        set SHUFFLED=1 to also time manifests whose rows are not in path order)
#        benches/plan_scale.sh --quick [WORKDIR]   (10,000 and 20,000 samples, shuffled too,
#        against the same goals: seconds)
# METFS_BIN picks the binary (no build); else the release build.
set -euo pipefail
cd "$(dirname "$0")/.."
specs=("1.28M 1281167 2 300" "10M 10000000 15 2048")
if [ "${1:-}" = --quick ]; then
  shift
  specs=("10k 10000 2 300" "20k 20000 15 2048")
  SHUFFLED=1
fi
work="${1:-target/plan-scale}"
mkdir -p "$work"
# A 4 GiB node budget (2 GiB per share) gives ~9 mini-epochs at 1.28M samples and ~66 at 10M.
budget="${BUDGET:-4GiB}"

if [ -n "${METFS_BIN:-}" ]; then
  bin=$METFS_BIN
else
  cargo build --release -q -p metfs
  bin=target/release/metfs
fi
[ -x /usr/bin/time ] || { echo "needs /usr/bin/time (GNU time: apt-get install time)" >&2; exit 1; }

run() { # label samples goal_s goal_mb manifest
  local label=$1 n=$2 goal_s=$3 goal_mb=$4 manifest=$5 log
  log="$work/$label.log"
  /usr/bin/time -v "$bin" plan --manifest "$manifest" --compose stratified --nodes 8 \
    --node-rank 0 --budget "$budget" > "$work/$label.out" 2> "$log"
  local wall rss cpu
  wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$log" |
    awk -F: '{ if (NF == 3) print $1*3600 + $2*60 + $3; else print $1*60 + $2 }')
  rss=$(awk -F': ' '/Maximum resident set size/ {print int($2 / 1024)}' "$log")
  # CPU time too: on a shared machine wall time mostly measures the other tenants.
  cpu=$(awk -F': ' '/User time|System time/ {s += $2} END {printf "%.2f", s}' "$log")
  local ok=PASS
  awk -v w="$wall" -v g="$goal_s" 'BEGIN { exit !(w <= g) }' || ok=FAIL
  [ "$rss" -le "$goal_mb" ] || ok=FAIL
  # What the plan says it read, where it says so (older builds did, on stderr).
  local read
  read=$(grep -o '^read .*' "$log" | sed 's/, [0-9]* samples//' || true)
  printf '%-11s %8s samples  %6.2f s wall (goal %s s), %5.2f s CPU  %5d MB peak RSS (goal %s MB)  %s  [%sload %s]\n' \
    "$label" "$n" "$wall" "$goal_s" "$cpu" "$rss" "$goal_mb" "$ok" \
    "${read:+$read; }" "$(cut -d' ' -f1 /proc/loadavg)"
}

for spec in "${specs[@]}"; do
  read -r label n goal_s goal_mb <<< "$spec"
  m="$work/manifest-$label.csv"
  [ -s "$m" ] || python3 benches/gen_manifest.py "$n" 1000 "$m"
  run "$label" "$n" "$goal_s" "$goal_mb" "$m"
  if [ "${SHUFFLED:-0}" = 1 ]; then
    ms="$work/manifest-$label-shuffled.csv"
    [ -s "$ms" ] || python3 benches/gen_manifest.py "$n" 1000 "$ms" --shuffled
    run "$label-shuf" "$n" "$goal_s" "$goal_mb" "$ms"
  fi
done
