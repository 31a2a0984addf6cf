#!/usr/bin/env bash
# Installs what the tests need, then runs every test: formatting and lints, the Rust unit,
# property and integration tests (a real Garage S3 server included), and the end-to-end and
# Python tests on real FUSE mounts. `.ci/run` calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

scripts/install-deps.sh

echo "== format and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -q -- -D warnings

echo "== Rust tests"
cargo build --workspace --all-targets -q
mkdir -p target
if ! cargo test --workspace > target/cargo-test.log 2>&1; then
  grep -E "^(---- |failures:|test .* FAILED)|panicked" target/cargo-test.log | head -40
  tail -40 target/cargo-test.log
  exit 1
fi
grep -E "^test result" target/cargo-test.log

echo "== end-to-end and Python tests"
export METFS_BIN="$PWD/target/debug/metfs"
# Daemons that tests start without --history (Slurm scripts, CLI checks) keep their rf history
# here rather than in the user's ~/.local/share/metfs.
XDG_DATA_HOME=$(mktemp -d /tmp/metfs-test-data.XXXXXX)
export XDG_DATA_HOME
trap 'rm -rf "$XDG_DATA_HOME"' EXIT
python3 -m pytest -q -p no:cacheprovider tests bindings/python/tests
