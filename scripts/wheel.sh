#!/usr/bin/env bash
# Builds the metfs wheel: dist/metfs-VERSION-py3-none-manylinux_2_28_x86_64.whl, holding the
# `metfs` binary (installed on the environment's PATH) and the `metfs` Python package.
#
#   scripts/wheel.sh            # then: pip install dist/metfs-*.whl
#   scripts/wheel.sh --profile wheel-check
#                               # the same wheel from a faster, less optimised build (the test
#                               # command's: Cargo.toml, [profile.wheel-check])
#
# How, and why so:
# * maturin (`bindings = "bin"` in bindings/python/pyproject.toml) packs a Rust binary beside
#   pure Python in one wheel and takes its version from the workspace's Cargo.toml, so the
#   binary and the package share one version, declared once. (setuptools-rust can do the same
#   with more configuration of our own to keep.)
# * `--zig --compatibility manylinux_2_28`: zig links against glibc 2.28's symbols, so the
#   binary runs on RHEL 8 and later and on Debian 11 and later, though this machine has glibc
#   2.36. The bundled C code (HDF5, zlib, the TLS library) is compiled by zig's clang as well.
# * The `hdf5-static` feature builds HDF5 and zlib from source into the binary: nodes need no
#   libhdf5. Its build needs CMake 3.26 or newer (PyPI's; Debian 12 has 3.25) and takes about
#   four minutes; the etcd client's build needs protoc (Debian's protobuf-compiler).
# * `auditwheel show` must name a policy no newer than manylinux_2_28, and the wheel must stay
#   under 40 MB; both are checked here, so a wheel that breaks either is never left in dist/.
#
# `metfs-shuffle` (aggregate-cache mode's exchange) links the site's MPI and is not in the
# wheel: build it from source (docs/AGGREGATE.md).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

profile=release
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile=${2:?--profile needs a Cargo profile name}; shift 2 ;;
    -h|--help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "wheel.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

scripts/install-deps.sh wheel

# The tools are Python packages in install-deps.sh's environment or in its interpreter's own
# site-packages, which the environment sees (it is made with --system-site-packages); their
# commands are in the environment's bin or in the interpreter's, so both go first on PATH, the
# environment's python before any other python3 (maturin finds zig as `python3 -m ziglang`).
# CMake's binary is found through its package.
PY=$(scripts/install-deps.sh --venv)/bin/python
BASE_BIN=$("$PY" -c 'import sys, sysconfig; print(sysconfig.get_path("scripts", vars={"base": sys.base_prefix}))')
CMAKE=$("$PY" -c 'import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, "cmake"))')
PATH="$(dirname "$PY"):$BASE_BIN:$PATH"
export CMAKE PATH
"$CMAKE" --version | head -1

# Its own target directory: the wheel's feature set and target would otherwise rebuild the
# development build's artifacts and the other way round.
export CARGO_TARGET_DIR="$ROOT/target/wheel"
OUT="$ROOT/dist"
mkdir -p "$OUT"
rm -f "$OUT"/metfs-*.whl
(cd bindings/python && maturin build --profile "$profile" --zig --features hdf5-static \
  --compatibility manylinux_2_28 --out "$OUT")

shopt -s nullglob
wheels=("$OUT"/metfs-*-py3-none-manylinux_*_x86_64.whl)
[ ${#wheels[@]} -eq 1 ] || { echo "wheel.sh: expected one manylinux wheel in $OUT, found: $(ls "$OUT")" >&2; exit 1; }
whl=${wheels[0]}

show=$("$PY" -m auditwheel show "$whl")
echo "$show"
policy=$(grep -oE 'manylinux_2_[0-9]+_x86_64' <<<"$show" | head -1)
minor=$(sed -E 's/manylinux_2_([0-9]+)_x86_64/\1/' <<<"$policy")
if [ -z "$policy" ] || [ "$minor" -gt 28 ]; then
  mv "$whl" "$whl.rejected"
  echo "wheel.sh: auditwheel names '${policy:-no manylinux policy}', newer than manylinux_2_28" >&2
  exit 1
fi
size=$(stat -c %s "$whl")
if [ "$size" -ge $((40 * 1000 * 1000)) ]; then
  mv "$whl" "$whl.rejected"
  echo "wheel.sh: the wheel is $size bytes, over 40 MB" >&2
  exit 1
fi
echo "wheel.sh: $whl ($((size / 1000)) kB, $policy)"
