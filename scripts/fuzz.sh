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
#
# Each target starts from its committed seed corpus (fuzz/corpus/TARGET, read only) and keeps
# what it finds in target/fuzz/corpus/TARGET, outside the repository. A crash fails the script;
# the input is saved under target/fuzz/artifacts/TARGET/ and named in the output. The summary
# lists executions and seconds per target (libFuzzer's own count). Targets are built without a
# sanitizer but with debug assertions and overflow checks: the crashes sought are panics
# (overflows, out-of-range indexing, unwraps), since the parsers are safe Rust.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=1000000
seconds=""
dev=""
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --short) seconds=20; dev=1; shift ;;
    --runs) runs="$2"; seconds=""; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done

if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzz.sh: the nightly toolchain is needed (rustup toolchain install nightly)" >&2
  exit 1
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "fuzz.sh: cargo-fuzz is needed (scripts/install-deps.sh installs it)" >&2
  exit 1
fi
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo +nightly fuzz list)
fi

FLAGS=(-s none -a)
[ -n "$dev" ] && FLAGS=(-s none -D)
cargo +nightly fuzz build "${FLAGS[@]}"

work="$PWD/target/fuzz"
summary=()
failed=0
for t in "${targets[@]}"; do
  mkdir -p "$work/corpus/$t" "$work/artifacts/$t" "$work/logs"
  limit=(-runs="$runs")
  [ -n "$seconds" ] && limit=(-max_total_time="$seconds")
  log="$work/logs/$t.log"
  echo "== fuzz $t (${limit[*]})"
  if (cargo +nightly fuzz run "${FLAGS[@]}" "$t" "$work/corpus/$t" "fuzz/corpus/$t" -- \
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
