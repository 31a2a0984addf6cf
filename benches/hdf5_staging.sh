#!/usr/bin/env bash
# HDF5 container staging: one mini-epoch of random rows of a chunked float32 container, staged
# by metfs (metfs-prefetcher/examples/h5_stage.rs, release build) side by side with `cp` of a file of
# the same size on the same disk and with an h5py script (fancy indexing of the same rows, then
# writing them). Every tool ends with its data on disk (cp and h5py: `sync`; metfs: fsync of
# the staged file, as the stager does before renaming it into the slot).
#
#   benches/hdf5_staging.sh [RUNS]      RUNS >= 1 (default 3); prints medians, ratios, peak RSS
#   benches/hdf5_staging.sh --quick     one run of a 16 MiB container, an 8 MiB mini-epoch
#
# Goals (issue 6): metfs >= 0.7x cp and >= 2x h5py throughput; metfs peak RSS <= 256 MiB.
# Environment: BENCH_DIR (work directory, default /var/tmp/metfs-hdf5-bench, reused between
# runs so the container is written once), SRC_MIB (container size, default 2048), ME_MIB
# (mini-epoch size, default 1024: half the rows, as with a budget of one source's worth).
# Drops the page cache before every run when root (otherwise the numbers are warm-cache).
# Needs python3 with h5py and numpy (pip install h5py numpy) and GNU time (apt-get install time).
# METFS_BIN set: the h5_stage example beside it (its build, e.g. the test command's debug one),
# not built here; else the release build.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
if [ "${1:-}" = --quick ]; then
    shift
    RUNS=1 SRC_MIB=16 ME_MIB=8
fi
RUNS=${1:-${RUNS:-3}}
DIR=${BENCH_DIR:-/var/tmp/metfs-hdf5-bench}
SRC_MIB=${SRC_MIB:-2048}
ME_MIB=${ME_MIB:-1024}
PY="python3 $ROOT/tests/h5/make_h5.py"
[ -x /usr/bin/time ] || { echo "needs /usr/bin/time (apt-get install time)" >&2; exit 1; }
python3 -c 'import h5py, numpy' 2>/dev/null || python3 -m pip install --quiet h5py numpy
mkdir -p "$DIR"

if [ -n "${METFS_BIN:-}" ]; then
    BIN=$(dirname "$METFS_BIN")/examples/h5_stage
    [ -x "$BIN" ] || { echo "no $BIN (cargo build -p metfs-prefetcher --example h5_stage)" >&2; exit 1; }
else
    cargo build --release -q -p metfs-prefetcher --example h5_stage
    BIN=$ROOT/target/release/examples/h5_stage
fi

ROW=$((128 * 128 * 4))                       # bytes of one images row (float32 128 x 128)
if [ ! -f "$DIR/src-$SRC_MIB.h5" ]; then
    echo "writing a $SRC_MIB MiB container ..." >&2
    $PY bench-make "$DIR/src-$SRC_MIB.h5.tmp" "$SRC_MIB" >/dev/null
    mv "$DIR/src-$SRC_MIB.h5.tmp" "$DIR/src-$SRC_MIB.h5"
fi
SRC=src-$SRC_MIB.h5
N=$(((SRC_MIB << 20) / ROW))
K=$(((ME_MIB << 20) / ROW))
$PY bench-rows "$N" "$K" 1 "$DIR/rows.json"
BYTES=$((K * (ROW + 8 + 8)))                 # images + labels + metfs_index per row
head -c "$BYTES" /dev/urandom > "$DIR/same.bin"

drop() {
    sync
    if [ "$(id -u)" = 0 ]; then echo 3 > /proc/sys/vm/drop_caches; fi
}
# Runs a command under GNU time; prints "seconds max_rss_kib".
timed() {
    local log=$DIR/time.log
    /usr/bin/time -f "%e %M" -o "$log" "$@" >/dev/null
    cat "$log"
}
declare -A T RSS
for tool in cp metfs h5py; do T[$tool]=""; RSS[$tool]=""; done
tools=(cp metfs h5py)
for run in $(seq 1 "$RUNS"); do
    # Rotate the order so that no tool always runs after the same neighbour.
    for i in 0 1 2; do
        tool=${tools[$(((run + i) % 3))]}
        rm -f "$DIR/copy.bin" "$DIR/out.h5" "$DIR/py.h5"
        drop
        case $tool in
        cp) r=$(timed sh -c "cp '$DIR/same.bin' '$DIR/copy.bin' && sync") ;;
        metfs) r=$(timed sh -c "'$BIN' '$DIR' '$SRC' '$DIR/rows.json' '$DIR/out.h5' && sync") ;;
        h5py) r=$(timed sh -c "$PY bench-h5py '$DIR/$SRC' '$DIR/rows.json' '$DIR/py.h5' && sync") ;;
        esac
        T[$tool]+="${r% *} "
        RSS[$tool]+="${r#* } "
        echo "run $run $tool: ${r% *} s, peak RSS $((${r#* } / 1024)) MiB" >&2
        if [ "$tool" = metfs ] && [ "$run" = 1 ]; then
            $PY bench-verify "$DIR/$SRC" "$DIR/out.h5" "$DIR/rows.json" >/dev/null
        fi
    done
done
rm -f "$DIR/copy.bin" "$DIR/out.h5" "$DIR/py.h5"

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
maxof() { tr ' ' '\n' | grep -v '^$' | sort -g | tail -1; }
echo
echo "container: $SRC_MIB MiB ($N rows of 64 KiB, chunks of 8 rows, uncompressed); mini-epoch: $K random rows, $((BYTES >> 20)) MiB; $RUNS runs; $( [ "$(id -u)" = 0 ] && echo cold || echo warm ) cache"
echo
echo "| tool | median s | MiB/s | vs cp | peak RSS MiB | runs (s) |"
echo "|---|---:|---:|---:|---:|---|"
cp_s=$(echo "${T[cp]}" | median)
for tool in cp metfs h5py; do
    m=$(echo "${T[$tool]}" | median)
    rss=$(( $(echo "${RSS[$tool]}" | maxof) / 1024 ))
    awk -v t="$tool" -v m="$m" -v b="$BYTES" -v c="$cp_s" -v r="$rss" -v runs="${T[$tool]}" \
        'BEGIN { printf "| %s | %.2f | %.0f | %.2fx | %d | %s|\n", t, m, b / 1048576 / m, c / m, r, runs }'
done
m_s=$(echo "${T[metfs]}" | median)
h_s=$(echo "${T[h5py]}" | median)
echo
awk -v c="$cp_s" -v m="$m_s" -v h="$h_s" -v r="$(( $(echo "${RSS[metfs]}" | maxof) / 1024 ))" 'BEGIN {
    printf "metfs / cp throughput:   %.2fx (goal >= 0.7x) %s\n", c / m, (c / m >= 0.7) ? "PASS" : "MISS"
    printf "metfs / h5py throughput: %.2fx (goal >= 2x)   %s\n", h / m, (h / m >= 2) ? "PASS" : "MISS"
    printf "metfs peak RSS:          %d MiB (goal <= 256) %s\n", r, (r <= 256) ? "PASS" : "MISS"
}'
