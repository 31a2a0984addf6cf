#!/usr/bin/env bash
# S3 staging benchmark: metfs staging one mini-epoch from a Garage server on loopback, side by
# side with `aws s3 cp --recursive` and with a raw object_store parallel download (the ceiling of
# what the server gives), for (a) 2,000 objects of 128 KiB and (b) 16 objects of 64 MiB.
#
#   benches/s3_staging.sh [RUNS]        RUNS >= 3 (default 5); prints medians and ratios
#   benches/s3_staging.sh --quick       one run of (a) 40 objects of 128 KiB and (b) 2 of 8 MiB
#
# Tools, each timed as a whole process (listing included), in a rotating order per run:
#   awscli         aws s3 cp --recursive --only-show-errors (default settings: 10 requests at once)
#   ceiling        metfs-prefetcher/examples/s3_fetch.rs `ceiling`: object_store, 32 objects at once,
#                  8 MiB ranges (8 per object, 64 requests in all), each chunk written as it
#                  arrives, no checks, no fsync
#   ceiling-sync   ceiling followed by `sync`: the same download ending with the data on disk, as
#                  staging does (the ceiling leaves it dirty in the page cache, to be written
#                  after the timer stops)
#   discard        the same without writing anything: what the server alone gives
#   metfs          S3Tier + Stager, one slot holding every object, default settings (fsync on)
#   metfs-nofsync  the same with `fsync = false` (what the ceiling and awscli do)
#   metfs-mount    `metfs mount --source s3://...` until it returns (first mini-epoch staged),
#                  when target/release/metfs exists and accepts the mount; else left out
#
# Goals (docs/BENCHMARKS.md): metfs >= 1.5x awscli and >= 0.9x the ceiling on both sets. The
# ceiling is compared both ways: metfs (durable) against ceiling-sync, metfs-nofsync against
# ceiling (both leave the data in the page cache).
# Environment: BENCH_DIR (work directory, default a new /tmp/metfs-s3-bench.*; removed unless
# KEEP=1). Needs python3, awscli (pip install awscli) and Garage (scripts/garage.sh install).
# METFS_BIN set: that metfs and the s3_fetch example beside it (its build, e.g. the test
# command's debug one), not built here; else the release build.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
# Objects of the two sets: count and bytes each.
SMALL_N=2000 SMALL_SIZE=131072 LARGE_N=16 LARGE_SIZE=67108864
MIN_RUNS=3
if [ "${1:-}" = --quick ]; then
    shift
    RUNS=1 MIN_RUNS=1
    SMALL_N=40 LARGE_N=2 LARGE_SIZE=8388608
fi
RUNS=${1:-${RUNS:-5}}
[ "$RUNS" -ge "$MIN_RUNS" ] || {
    echo "s3_staging.sh: RUNS must be at least $MIN_RUNS" >&2
    exit 2
}

scripts/garage.sh install >/dev/null
command -v aws >/dev/null || python3 -m pip install --quiet awscli
if [ -n "${METFS_BIN:-}" ]; then
    METFS=$METFS_BIN
    FETCH=$(dirname "$METFS_BIN")/examples/s3_fetch
    [ -x "$FETCH" ] || {
        echo "no $FETCH (cargo build -p metfs-prefetcher --example s3_fetch)" >&2
        exit 1
    }
else
    cargo build --release --quiet -p metfs-prefetcher --example s3_fetch
    FETCH=$ROOT/target/release/examples/s3_fetch
    METFS=$ROOT/target/release/metfs
fi

WORK=${BENCH_DIR:-$(mktemp -d /tmp/metfs-s3-bench.XXXXXX)}
mkdir -p "$WORK"
MNT=$WORK/mnt
cleanup() {
    if mountpoint -q "$MNT" 2>/dev/null; then
        "$METFS" umount "$MNT" >/dev/null 2>&1 || umount -l "$MNT" 2>/dev/null || true
    fi
    scripts/garage.sh stop "$WORK/garage" || true
    [ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"
}
trap cleanup EXIT

# Two distinct free ports: both sockets stay bound until both are chosen, so the second cannot
# be the first handed out again (garage.sh refuses S3 and RPC on one port). A port taken again
# before Garage binds it fails the start at once; fresh ports are tried, as tests/conftest.py's
# Garage does.
for try in 1 2 3; do
    read -r S3_PORT RPC_PORT < <(python3 -c '
import socket
a, b = socket.socket(), socket.socket()
a.bind(("127.0.0.1", 0)); b.bind(("127.0.0.1", 0))
print(a.getsockname()[1], b.getsockname()[1])')
    scripts/garage.sh stop "$WORK/garage" >/dev/null 2>&1 || true
    rm -rf "$WORK/garage"
    scripts/garage.sh start "$WORK/garage" "$S3_PORT" "$RPC_PORT" >/dev/null && break
    [ "$try" -lt 3 ] || {
        echo "s3_staging.sh: Garage did not start in 3 tries" >&2
        exit 1
    }
    echo "# Garage did not start on port $S3_PORT; trying fresh ports" >&2
done
eval "$(scripts/garage.sh env "$WORK/garage")"
B=$METFS_S3_BUCKET

echo "# uploading test data to Garage (not timed)"
"$FETCH" upload "s3://$B/small" "$SMALL_N" "$SMALL_SIZE"
"$FETCH" upload "s3://$B/large" "$LARGE_N" "$LARGE_SIZE"

# The mount is measured only when a metfs binary exists and takes S3 sources.
TOOLS=(awscli ceiling ceiling-sync discard metfs metfs-nofsync)
if [ -x "$METFS" ] && "$METFS" mount --help 2>/dev/null | grep -q -- "--source"; then
    TOOLS+=(metfs-mount)
fi

RESULTS=$WORK/results.tsv
: >"$RESULTS"

run_tool() { # tool dataset bytes
    local tool=$1 ds=$2 bytes=$3 out=$WORK/out t0 t1
    rm -rf "$out" "$WORK/cache"
    mkdir -p "$out"
    sync
    t0=$(date +%s.%N)
    case $tool in
    awscli) aws s3 cp --recursive --only-show-errors "s3://$B/$ds/" "$out/" ;;
    ceiling) "$FETCH" ceiling "s3://$B/$ds" "$out" >/dev/null ;;
    ceiling-sync)
        "$FETCH" ceiling "s3://$B/$ds" "$out" >/dev/null
        sync
        ;;
    discard) "$FETCH" ceiling-discard "s3://$B/$ds" >/dev/null ;;
    metfs) "$FETCH" stage "s3://$B/$ds" "$out" >/dev/null 2>&1 ;;
    metfs-nofsync) "$FETCH" stage "s3://$B/$ds" "$out" --no-fsync >/dev/null 2>&1 ;;
    metfs-mount)
        mkdir -p "$MNT" "$WORK/cache"
        if ! "$METFS" mount "$MNT" --source "s3://$B/$ds" --cache "$WORK/cache" \
            --budget "$((bytes * 3))" --mini-epochs 1 --history "$WORK/rf-history.json" \
            >"$WORK/mount.log" 2>&1; then
            echo "# metfs mount failed (left out): $(tail -n 3 "$WORK/mount.log" | tr '\n' ' ')" >&2
            return 0
        fi
        ;;
    esac
    t1=$(date +%s.%N)
    if [ "$tool" = metfs-mount ]; then
        "$METFS" umount "$MNT" >/dev/null 2>&1 || umount -l "$MNT" || true
    fi
    printf '%s\t%s\t%s\t%s\n' "$ds" "$tool" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')" "$bytes" >>"$RESULTS"
}

for ds in small large; do
    case $ds in
    small) bytes=$((SMALL_N * SMALL_SIZE)) ;;
    large) bytes=$((LARGE_N * LARGE_SIZE)) ;;
    esac
    for run in $(seq 1 "$RUNS"); do
        n=${#TOOLS[@]}
        for i in $(seq 0 $((n - 1))); do
            tool=${TOOLS[$(((i + run) % n))]}
            run_tool "$tool" "$ds" "$bytes"
        done
        echo "# $ds run $run/$RUNS done"
    done
done
rm -rf "$WORK/out"

python3 - "$RESULTS" "$RUNS" "$SMALL_N" "$SMALL_SIZE" "$LARGE_N" "$LARGE_SIZE" <<'EOF'
import collections, statistics, sys
rows = [l.split("\t") for l in open(sys.argv[1]).read().splitlines() if l]
t = collections.defaultdict(list)
size = {}
for ds, tool, s, b in rows:
    t[ds, tool].append(float(s))
    size[ds] = int(b)
def name(n, b):
    return f"{int(n):,} x {int(b) >> 20} MiB" if int(b) >= 1 << 20 else f"{int(n):,} x {int(b) >> 10} KiB"
names = {"small": name(*sys.argv[3:5]), "large": name(*sys.argv[5:7])}
print(f"\nS3 staging from Garage on loopback, medians of {sys.argv[2]} runs\n")
print(f"| objects | tool | median s | MiB/s | runs (s) |")
print(f"|---|---|---:|---:|---|")
for ds in ("small", "large"):
    for tool in ("awscli", "discard", "ceiling", "ceiling-sync", "metfs", "metfs-nofsync", "metfs-mount"):
        if (ds, tool) not in t:
            continue
        v = t[ds, tool]
        m = statistics.median(v)
        runs = " ".join(f"{x:.2f}" for x in v)
        print(f"| {names[ds]} | {tool} | {m:.2f} | {size[ds] / 2**20 / m:.0f} | {runs} |")
print()
print("| objects | metfs vs awscli (goal >= 1.5x) | metfs vs ceiling-sync (both durable) | metfs-mount vs ceiling-sync | metfs-nofsync vs ceiling (both in page cache) | metfs vs ceiling |")
print("|---|---:|---:|---:|---:|---:|")
for ds in ("small", "large"):
    med = {k[1]: statistics.median(v) for k, v in t.items() if k[0] == ds}
    r = lambda a, b: f"{med[a] / med[b]:.2f}x" if a in med and b in med else "n/a"
    print(f"| {names[ds]} | {r('awscli', 'metfs')} | {r('ceiling-sync', 'metfs')} | {r('ceiling-sync', 'metfs-mount')} | "
          f"{r('ceiling', 'metfs-nofsync')} | {r('ceiling', 'metfs')} |")
EOF
