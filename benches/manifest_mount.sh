#!/usr/bin/env bash
# A mount from a 10M-line manifest (issue 31, item 7): wall time of `metfs mount` until the
# first mini-epoch is staged and the mount serves, and the daemon's peak RSS, against the goals
# (60 s, 3 GB), the manifest read cold; and `metfs plan` on the same manifest, cold and warm
# (goal 5 s).
#
# usage: benches/manifest_mount.sh [N] [WORKDIR]   (default 10,000,000 samples, target/plan-scale)
#        benches/manifest_mount.sh --quick [WORKDIR]   (2,000 samples, a 64 MiB budget: seconds)
#
# The manifest is benches/gen_manifest.py's (ImageNet-like: 1,000 classes, lognormal sizes of
# mean ~110 KiB). The source holds only the files the first two mini-epochs take, as sparse
# files of the manifest's sizes: 1.1 TB of samples cannot be made here, and a sample is only
# opened when it is staged. Composition is sequential, so the first mini-epochs are the
# manifest's first rows; the budget is 4 GiB (mini-epochs of ~2 GiB, ~19,000 samples). The
# daemon runs in the foreground under GNU time for its peak RSS; the mount counts as done when
# `metfs status` answers with the first mini-epoch staged. BUDGET changes the budget; METFS_BIN
# picks the binary (no build), else the release build.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --quick ]; then
  shift
  set -- 2000 "$@"
  BUDGET=${BUDGET:-64MiB}
fi
n="${1:-10000000}"
work="${2:-target/plan-scale}"
budget="${BUDGET:-4GiB}"
mkdir -p "$work"
work=$(cd "$work" && pwd)
[ -x /usr/bin/time ] || { echo "needs /usr/bin/time (GNU time: apt-get install time)" >&2; exit 1; }
if [ -n "${METFS_BIN:-}" ]; then
  bin=$METFS_BIN
else
  cargo build --release -q -p metfs
  bin=$PWD/target/release/metfs
fi
manifest="$work/manifest-$n.csv"
[ -f "$manifest" ] || python3 benches/gen_manifest.py "$n" 1000 "$manifest"
src="$work/src-$n" cache="$work/cache-$n" mnt="$work/mnt-$n"
"$bin" umount "$mnt" 2>/dev/null || true
rm -rf "$cache"
mkdir -p "$src" "$cache" "$mnt"
# The first 40,000 rows, as sparse files (two mini-epochs with room to spare).
python3 - "$manifest" "$src" <<'PY'
import csv, os, sys
manifest, src = sys.argv[1], sys.argv[2]
with open(manifest, newline="") as f:
    for i, row in enumerate(csv.DictReader(f)):
        if i == 40_000:
            break
        p = os.path.join(src, row["path"])
        if not os.path.exists(p):
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as out:
                out.truncate(int(row["size"]))
PY
sync
echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true

plan() { # the plan's wall seconds; the first call reads the manifest cold, the second warm
  /usr/bin/time -v "$bin" plan --manifest "$manifest" --compose stratified --nodes 8 --node-rank 0 \
    --budget "$budget" > "$work/plan-$n.out" 2> "$work/plan-$n.log"
  awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$work/plan-$n.log" |
    awk -F: '{ if (NF == 3) print $1*3600 + $2*60 + $3; else print $1*60 + $2 }'
}
plan_cold=$(plan)
plan_warm=$(plan)
sync
echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true

start=$(date +%s.%N)
/usr/bin/time -v "$bin" mount --foreground --source "$src" --manifest "$manifest" --cache "$cache" \
  --budget "$budget" --compose sequential --rf 100 --history "$work/rf-history-$n.json" "$mnt" \
  > "$work/mount-$n.out" 2> "$work/mount-$n.log" &
daemon=$!
until "$bin" status --json --socket "$cache/metfs.sock" > "$work/status-$n.json" 2>/dev/null &&
      python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); sys.exit(0 if s.get("generation", 0) >= 1 else 1)' "$work/status-$n.json"; do
  kill -0 "$daemon" 2>/dev/null || { echo "the daemon exited:"; tail -20 "$work/mount-$n.log"; exit 1; }
  sleep 0.1
done
mount_s=$(python3 -c "import time; print(f'{time.time() - $start:.1f}')")
files=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["view_files"])' "$work/status-$n.json")
rss_now=$(awk '/VmRSS/ {print int($2 / 1024)}' "/proc/$(pgrep -n -f "mount --foreground --source $src")/status" 2>/dev/null || echo "?")
"$bin" umount "$mnt"
wait "$daemon" || true
peak=$(awk -F': ' '/Maximum resident set size/ {print int($2 / 1024)}' "$work/mount-$n.log")
printf '| samples in the manifest | mount until the first mini-epoch (%s files) serves | daemon RSS then / peak | `metfs plan`, manifest cold / warm |\n' "$files"
printf '|---|---|---|---|\n'
printf '| %s | %s s (goal 60 s) | %s / %s MB (goal 3,000 MB) | %s / %s s (goal 5 s) |\n' "$n" "$mount_s" "$rss_now" "$peak" "$plan_cold" "$plan_warm"
rm -rf "$cache"
