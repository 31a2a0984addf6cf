#!/usr/bin/env bash
# Fuzzes metfs's parsers of untrusted input with `cargo fuzz` (libFuzzer, nightly Rust): the
# control socket's request parser, the manifest reader, the config loader, the saved catalog
# and the stager's journal (targets in fuzz/fuzz_targets/).
#
#   scripts/fuzz.sh --short [TARGET...]     each target for 20 s, built without optimisation (the
#                                           test command runs this: an optimised build of the
#                                           targets' dependencies costs ~10 minutes more on 2 cores)
#   scripts/fuzz.sh [--runs N] [TARGET...]  each target for N executions (default 1000000)
#   scripts/fuzz.sh --seconds S [TARGET...] each target for S seconds
#   scripts/fuzz.sh --install               install the pinned nightly and cargo-fuzz when they
#                                           are missing (scripts/install-deps.sh runs this)
#
# The toolchain and cargo-fuzz are pinned below: a new nightly or cargo-fuzz can break the
# targets' build with no change of ours. The nightly is rustup's `nightly-DATE`; a plain
# `nightly` toolchain that is that same build is used as it is, without a second download.
#
# Each target starts from its committed seed corpus (fuzz/corpus/TARGET, read only) and keeps
# what it finds in target/fuzz/corpus/TARGET, outside the repository. A crash fails the script;
# the input is saved under target/fuzz/artifacts/TARGET/ and named in the output. The summary
# lists executions and seconds per target (libFuzzer's own count). Targets are built without a
# sanitizer but with debug assertions and overflow checks: the crashes sought are panics
# (overflows, out-of-range indexing, unwraps), since the parsers are safe Rust.
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZ_NIGHTLY=nightly-2026-05-20
FUZZ_RUSTC="rustc 1.97.0-nightly (e50aa6fba 2026-05-19)"
CARGO_FUZZ_VERSION=0.13.2

die() {
  echo "fuzz.sh: $*" >&2
  exit 1
}

# The installed toolchain that is the pinned nightly (its name for `cargo +NAME`), or nothing.
# Only installed toolchains are asked: `rustc +NAME` of a missing one may start a download.
fuzz_toolchain() {
  local installed tc
  installed=$(rustup toolchain list 2>/dev/null) || return 1
  for tc in "$FUZZ_NIGHTLY" nightly; do
    grep -q "^$tc-" <<<"$installed" || continue
    if [ "$tc" = "$FUZZ_NIGHTLY" ] ||
      [ "$(RUSTUP_AUTO_INSTALL=0 rustc +"$tc" --version 2>/dev/null)" = "$FUZZ_RUSTC" ]; then
      echo "$tc"
      return 0
    fi
  done
  return 1
}

fuzz_version_ok() { # toolchain
  [ "$(cargo +"$1" fuzz --version 2>/dev/null)" = "cargo-fuzz $CARGO_FUZZ_VERSION" ]
}

if [ "${1:-}" = --install ]; then
  if ! tc=$(fuzz_toolchain); then
    echo "fuzz.sh: rustup toolchain install $FUZZ_NIGHTLY --profile minimal"
    rustup toolchain install "$FUZZ_NIGHTLY" --profile minimal >/dev/null ||
      die "could not install the pinned nightly: run \`rustup toolchain install $FUZZ_NIGHTLY --profile minimal\` where rustup can reach static.rust-lang.org"
    tc=$(fuzz_toolchain) || die "rustup installed $FUZZ_NIGHTLY but it is not listed as installed"
  fi
  if ! fuzz_version_ok "$tc"; then
    echo "fuzz.sh: cargo install cargo-fuzz --version $CARGO_FUZZ_VERSION --locked"
    cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked --force -q ||
      die "could not install cargo-fuzz $CARGO_FUZZ_VERSION"
    fuzz_version_ok "$tc" || die "cargo-fuzz $CARGO_FUZZ_VERSION installed, but \`cargo fuzz --version\` says: $(cargo +"$tc" fuzz --version 2>&1)"
  fi
  echo "fuzz.sh: $FUZZ_NIGHTLY ($tc) and cargo-fuzz $CARGO_FUZZ_VERSION"
  exit 0
fi

runs=1000000
seconds=""
dev=""
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --short) seconds=20; dev=1; shift ;;
    --runs) runs="$2"; seconds=""; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done

tc=$(fuzz_toolchain) ||
  die "the pinned nightly ($FUZZ_NIGHTLY: $FUZZ_RUSTC) is not installed: scripts/fuzz.sh --install (or scripts/install-deps.sh) installs it"
fuzz_version_ok "$tc" ||
  die "cargo-fuzz $CARGO_FUZZ_VERSION is needed, found: $(cargo +"$tc" fuzz --version 2>&1 | head -1); scripts/fuzz.sh --install installs it"
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo +"$tc" fuzz list)
fi

FLAGS=(-s none -a)
[ -n "$dev" ] && FLAGS=(-s none -D)
cargo +"$tc" fuzz build "${FLAGS[@]}"

work="$PWD/target/fuzz"
# The targets that parse a file write their input to a scratch file: in a directory of this
# run's own, in memory when /dev/shm is there, removed however the run ends.
METFS_FUZZ_SCRATCH=$(mktemp -d /dev/shm/metfs-fuzz.XXXXXX 2>/dev/null || mktemp -d)
export METFS_FUZZ_SCRATCH
trap 'rm -rf "$METFS_FUZZ_SCRATCH"' EXIT
summary=()
failed=0
for t in "${targets[@]}"; do
  mkdir -p "$work/corpus/$t" "$work/artifacts/$t" "$work/logs"
  limit=(-runs="$runs")
  [ -n "$seconds" ] && limit=(-max_total_time="$seconds")
  log="$work/logs/$t.log"
  echo "== fuzz $t (${limit[*]})"
  if (cargo +"$tc" fuzz run "${FLAGS[@]}" "$t" "$work/corpus/$t" "fuzz/corpus/$t" -- \
        "${limit[@]}" -artifact_prefix="$work/artifacts/$t/" -print_final_stats=1 -rss_limit_mb=2048 \
        -timeout=10) >"$log" 2>&1; then
    result=ok
  else
    result=CRASH
    failed=1
    grep -E "panicked|ERROR|SUMMARY|Test unit written|artifact" "$log" | head -10 >&2 || tail -20 "$log" >&2
  fi
  execs=$(grep -E "^stat::number_of_executed_units" "$log" | awk '{print $2}' | tail -1)
  secs=$(grep -E "^Done [0-9]+ runs in [0-9]+ second" "$log" | awk '{print $5}' | tail -1)
  summary+=("$(printf '%-10s %-6s %12s execs %6s s' "$t" "$result" "${execs:-?}" "${secs:-?}")")
done
echo "== fuzz summary"
printf '%s\n' "${summary[@]}"
exit $failed
