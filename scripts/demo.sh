#!/usr/bin/env bash
# The main job on an embedded default: builds metfs, makes a small labelled dataset in a local
# "capacity tier" directory, mounts a MET view of it, trains a real model through the mount
# (scikit-learn SGDClassifier, one partial_fit per pass), and reports what MET did.
#
#   scripts/demo.sh              # everything under /tmp/metfs-demo
#   scripts/demo.sh --installed  # the metfs on PATH (pip install dist/metfs-*.whl), no build
#   METFS_DEMO_DIR=... RF=4 EPOCHS=3 BUDGET=6MiB scripts/demo.sh
#
# It installs what it needs itself: `scripts/install-deps.sh --list demo` (or `run` with
# --installed) prints the packages. Python runs in the virtual environment install-deps.sh
# names (`scripts/install-deps.sh --venv`: an active one, else one it makes); with --installed,
# the wheel goes there too: `"$(scripts/install-deps.sh --venv)/bin/pip" install dist/metfs-*.whl`.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
INSTALLED=0
case "${1:-}" in
--installed) INSTALLED=1 ;;
"") ;;
*) echo "usage: scripts/demo.sh [--installed]" >&2; exit 2 ;;
esac
DIR=${METFS_DEMO_DIR:-/tmp/metfs-demo}
RF=${RF:-3}
EPOCHS=${EPOCHS:-3}
BUDGET=${BUDGET:-6MiB}
PER_CLASS=${PER_CLASS:-150}

if [ "$INSTALLED" = 1 ]; then
  scripts/install-deps.sh run
  VENV=$(scripts/install-deps.sh --venv)
  METFS=$(command -v metfs) || METFS=$VENV/bin/metfs
  [ -x "$METFS" ] || { echo "demo: no metfs on PATH or in $VENV (pip install dist/metfs-*.whl)" >&2; exit 1; }
  # The installed package, not this tree's copy.
  PYPATH=${PYTHONPATH:-}
else
  scripts/install-deps.sh demo
  VENV=$(scripts/install-deps.sh --venv)
  cargo build --release -q -p metfs
  METFS=$ROOT/target/release/metfs
  PYPATH=bindings/python/src
fi
echo "== metfs: $METFS ($("$METFS" --version))"

mnt=$DIR/mnt
if grep -q " $mnt " /proc/mounts 2>/dev/null; then "$METFS" umount "$mnt" || umount -l "$mnt"; fi
rm -rf "$DIR"
mkdir -p "$DIR/cache" "$mnt"
echo "== making a dataset in $DIR/tier (the capacity tier)"
PY=$VENV/bin/python
"$PY" scripts/make_dataset.py "$DIR/tier" --per-class "$PER_CLASS" --val-out "$DIR/val"

echo "== mounting a MET view: budget $BUDGET, rf $RF"
"$METFS" mount --source "$DIR/tier" --cache "$DIR/cache" --budget "$BUDGET" --rf "$RF" "$mnt"
trap '"$METFS" umount "$mnt" >/dev/null 2>&1 || true' EXIT
"$METFS" status --socket "$DIR/cache/metfs.sock"

echo "== training through the mount"
PYTHONPATH=$PYPATH "$PY" examples/met_sklearn.py \
  --mount "$mnt" --socket "$DIR/cache/metfs.sock" --val "$DIR/val" --epochs "$EPOCHS"

"$METFS" umount "$mnt"
trap - EXIT
echo "== unmounted; the cache in $DIR/cache is kept for a later mount"
