#!/usr/bin/env bash
# Installs what the tests need, then runs every test: formatting and lints, the Rust unit,
# property and integration tests (a real Garage S3 server and etcd included), a build without
# HDF5, a short fuzzing run of every parser of untrusted input, the wheel built and installed
# into a fresh virtual environment, and the end-to-end, stress and Python tests on real FUSE
# mounts (tests/stress runs briefly here; scripts/stress.sh runs it at full
# size).
# `.ci/run` calls exactly this.
#
# Python runs in the virtual environment scripts/install-deps.sh makes and fills (its header
# says where and why: outside the clone, so CI's fresh clones reuse it); `python3` is that
# environment's once it exists. METFS_VENV names another environment.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

# Each step's time is printed when the next begins and all of them at the end (also when a step
# fails), so the command's time by step stays in view (docs/DEVELOPMENT.md: CI has 2 cores and
# the command should stay under 30 minutes).
T0=$(date +%s) STEP="" STEP_T=$T0 TIMES="" CLEANUP="" CLEANUP_PIDS=""
step() {
  local now
  now=$(date +%s)
  [ -z "$STEP" ] || TIMES+="$(printf '%6d s  %s' $((now - STEP_T)) "$STEP")"$'\n'
  STEP=$1 STEP_T=$now
  echo "== $1"
}
# A process and everything it started (a background step's cargo and its compilers).
kill_tree() {
  local c
  for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do kill_tree "$c"; done
  kill "$1" 2>/dev/null || true
}
finish() {
  local rc=$? now
  now=$(date +%s)
  [ -z "$STEP" ] || TIMES+="$(printf '%6d s  %s' $((now - STEP_T)) "$STEP")"$'\n'
  printf '\n== time by step (exit status %d)\n%s%6d s  in all\n' "$rc" "$TIMES" $((now - T0))
  local p
  for p in $CLEANUP_PIDS; do kill_tree "$p"; done
  # shellcheck disable=SC2086
  [ -z "$CLEANUP" ] || rm -rf $CLEANUP
}
trap finish EXIT

step "install"

scripts/install-deps.sh
# The demo's own dependency step, run on its own as `scripts/demo.sh` runs it first thing, then
# checked: every package its build needs is there (the list lives once, in install-deps.sh).
scripts/install-deps.sh demo
scripts/install-deps.sh --check demo
VIRTUAL_ENV=$(scripts/install-deps.sh --venv)
export VIRTUAL_ENV PATH="$VIRTUAL_ENV/bin:$PATH"
echo "== python: $(command -v python3) ($(python3 --version))"
# The tests that need a server (Garage, etcd) or the wheel are mandatory here; a contributor's
# plain `cargo test` without them passes and names what it did not run. Under this variable a
# pytest skip whose reason is not in tests/skips-allowed.toml fails the run (conftest.py).
export METFS_REQUIRE_SERVERS=1

# The builds (debug, the build without HDF5, the wheel) take ~8 GB and the tests' tiers and
# caches ~3 GB at once; a disk short of that fails far into the run with errors that do not
# say why, so say it first.
free_gb() { df -P -BG "$1" | awk 'NR == 2 { sub("G", "", $4); print $4 }'; }
for d in . /tmp; do
  if [ "$(free_gb "$d")" -lt 12 ]; then
    echo "warning: $(cd "$d" && pwd) has only $(free_gb "$d") GB free; the tests need ~12 GB" >&2
  fi
done

step "format and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -q -- -D warnings
# metfs-shuffle (aggregate-cache mode's MPI exchange) builds only with the `mpi` feature.
cargo clippy -p metfs-exchange --features mpi --bin metfs-shuffle -q -- -D warnings
# The Python package and its tests (settings in bindings/python/pyproject.toml).
(cd bindings/python && python3 -m ruff check -q . && python3 -m ruff format --check -q . \
  && python3 -m mypy)
# Everything else in Python: tests, benchmarks, examples (settings in ruff.toml).
python3 -m ruff check -q . && python3 -m ruff format --check -q .

step "Rust tests"
cargo build --workspace --all-targets -q
mkdir -p target
if ! cargo test --workspace > target/cargo-test.log 2>&1; then
  # Each failed test's own output (its panic message and what it printed), without the
  # backtrace's frames, which would push the message out of a CI log's tail.
  grep -E "^test .* FAILED" target/cargo-test.log
  awk '/^---- .* stdout ----$/ { on = 1 } /^failures:$/ && on { on = 0 }
       on && !/^ +[0-9]+: / && !/^ +at / { print }' target/cargo-test.log | head -200
  grep -E "^(error|test result)" target/cargo-test.log | tail -5
  exit 1
fi
grep -E "^test result" target/cargo-test.log

step "metfs without HDF5"
# `cargo build -p metfs --no-default-features` must build and link without libhdf5, and then
# refuse HDF5 settings by name. It shares the default build's target directory: only the crates
# whose features differ are built again (a directory of its own built every dependency a second
# time, minutes on 2 cores). Cargo keeps both builds' artifacts apart, but target/debug/metfs is
# the last one built, so the binary is copied out and the default one put back after.
cargo build -q -p metfs --no-default-features
if ldd target/debug/metfs | grep -q libhdf5; then
  echo "metfs built with --no-default-features still links libhdf5" >&2
  exit 1
fi
mkdir -p target/nohdf5-bin
cp target/debug/metfs target/nohdf5-bin/metfs
cargo build -q --workspace --all-targets
cargo test -q -p metfs-prefetcher --no-default-features --lib hdf5
export METFS_NOHDF5_BIN="$PWD/target/nohdf5-bin/metfs"
NOHDF5_DIR=$(mktemp -d /tmp/metfs-nohdf5.XXXXXX)
mkdir "$NOHDF5_DIR/src" "$NOHDF5_DIR/mnt"
if "$METFS_NOHDF5_BIN" mount --source "$NOHDF5_DIR/src" --cache "$NOHDF5_DIR/cache" --budget 1MiB \
  --hdf5-container "$NOHDF5_DIR/mnt" 2> "$NOHDF5_DIR/err"; then
  echo "a metfs built without hdf5 accepted --hdf5-container" >&2
  exit 1
fi
cat "$NOHDF5_DIR/err"
grep -q 'built without the `hdf5` feature' "$NOHDF5_DIR/err"
rm -rf "$NOHDF5_DIR"

step "end-to-end and Python tests on two workers; the fuzzing and the wheel's build beside them"
# The end-to-end tests mostly wait (on mounts, staging, servers and Slurm), so they run on two
# pytest-xdist workers, a test file to a worker (a module's servers and cluster start once), and
# the two CPU-bound steps that need nothing from them run at the same time: a short fuzzing run
# of every parser of untrusted input (the pinned nightly's build, then each target for 20 s) and
# the wheel's build (Cargo.toml's [profile.wheel-check]: the release wheel's sources, features,
# zig link and manylinux check, not optimised). Their logs are printed when they end; the wheel's
# own tests run once it is built. Every test passes on a busy machine (docs/DEVELOPMENT.md), and
# this is one.
BG=$PWD/target/test-bg
rm -rf "$BG"
mkdir -p "$BG"
# Each background step writes its exit status when it ends; a step still running when this script
# exits (a failure elsewhere) is stopped with it.
(set +e; scripts/fuzz.sh --short > "$BG/fuzz.log" 2>&1; echo $? > "$BG/fuzz.rc") &
FUZZ_PID=$!
(set +e; scripts/wheel.sh --profile wheel-check > "$BG/wheel.log" 2>&1; echo $? > "$BG/wheel.rc") &
WHEEL_PID=$!
CLEANUP_PIDS="$FUZZ_PID $WHEEL_PID"
# An ordinary user for the tests that run a daemon as one (here and again below). fusermount3
# opens /dev/fuse with the user's own rights; where the device is root-only (0600), grant it to
# a `fuse` group, as sites that allow user mounts do.
TEST_USER=metfs-user
id -u "$TEST_USER" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$TEST_USER"
if ! runuser -u "$TEST_USER" -- test -r /dev/fuse -a -w /dev/fuse; then
  getent group fuse >/dev/null || groupadd --system fuse
  chgrp fuse /dev/fuse
  chmod g+rw /dev/fuse
  usermod -aG fuse "$TEST_USER"
fi
export METFS_BIN="$PWD/target/debug/metfs"
cargo build -q -p metfs-exchange --features mpi --bin metfs-shuffle
# Daemons that tests start without --history (Slurm scripts, CLI checks) keep their rf history
# here rather than in the user's ~/.local/share/metfs.
XDG_DATA_HOME=$(mktemp -d /tmp/metfs-test-data.XXXXXX)
export XDG_DATA_HOME
CLEANUP+=" $XDG_DATA_HOME"
# A passed test's tmp_path (its tier, cache and mount) is deleted as soon as it passes, so the
# suite needs the disk of its largest tests rather than of all of them (~2.5 GB); a failed
# test's directory stays for reading.
# The slowest tests are named at the end, to keep the command's time in view (CI has 2 cores).
E2E_RC=0
python3 -m pytest -q -p no:cacheprovider -o tmp_path_retention_policy=failed --durations=20 \
  -n 2 --dist loadfile --ignore tests/test_wheel.py tests bindings/python/tests || E2E_RC=$?

# The background steps' results, each with its log's tail on failure.
bg_result() {
  local name=$1 pid=$2 rc
  wait "$pid" || true
  rc=$(cat "$BG/$name.rc" 2>/dev/null || echo "?")
  if [ "$rc" != 0 ]; then
    echo "== $name (in the background) FAILED (exit status $rc); the end of $BG/$name.log:" >&2
    tail -60 "$BG/$name.log" >&2
    return 1
  fi
}
BG_RC=0
bg_result fuzz "$FUZZ_PID" || BG_RC=1
sed -n '/^== fuzz summary/,$p' "$BG/fuzz.log"
bg_result wheel "$WHEEL_PID" || BG_RC=1
CLEANUP_PIDS=""
[ "$E2E_RC" = 0 ] || { echo "end-to-end and Python tests failed (exit status $E2E_RC)" >&2; exit "$E2E_RC"; }
[ "$BG_RC" = 0 ] || exit 1

step "the wheel's tests (tests/test_wheel.py installs it)"
METFS_WHEEL=$(ls "$PWD"/dist/metfs-*-manylinux_*_x86_64.whl)
export METFS_WHEEL
python3 -m pytest -q -p no:cacheprovider -o tmp_path_retention_policy=failed tests/test_wheel.py

step "core end-to-end tests again, as an ordinary user"
# Users on HPC nodes are not root: their mounts go through fusermount3 and passthrough is
# refused (EPERM), so they get the cached or pread path. Debian's python3 with its
# python3-pytest runs these (they need nothing from PyPI, and the environment's interpreter may
# live where the user cannot read, e.g. under /root/.pyenv); the tests that need root skip, each
# by a reason tests/skips-allowed.toml lists for this user, and any other skip fails.
USER_DIR=$(mktemp -d /tmp/metfs-user-test.XXXXXX)
chown "$TEST_USER" "$USER_DIR"
CLEANUP+=" $USER_DIR"
runuser -u "$TEST_USER" -- env -i PATH=/usr/bin:/bin HOME="$USER_DIR" TMPDIR="$USER_DIR" \
  PYTHONDONTWRITEBYTECODE=1 METFS_BIN="$METFS_BIN" XDG_DATA_HOME="$USER_DIR/data" METFS_REQUIRE_SERVERS=1 \
  /usr/bin/python3 -m pytest -q -p no:cacheprovider -o tmp_path_retention_policy=failed --basetemp="$USER_DIR/pytest" \
  tests/test_core.py tests/test_fs.py tests/test_sample_groups.py \
  -k "not s3 and not (test_sample_groups and (image_and_mask or load_from_disk or litdata or webdataset or mds or dataset_dict or corrupt_index or always_pattern or hugging_face))"
