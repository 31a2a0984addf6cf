#!/usr/bin/env bash
# Installs what metfs needs on a Debian 12 machine (as root), one group at a time. Every list
# of packages lives here and only here: scripts/demo.sh, scripts/wheel.sh and scripts/test.sh
# each ask for their group. Each step is skipped when its result is already there, so a second
# run takes seconds.
#
#   scripts/install-deps.sh [GROUP]     install GROUP (default: all)
#   scripts/install-deps.sh --list GROUP
#                                       print GROUP's Debian and Python packages, install nothing
#   scripts/install-deps.sh --check GROUP
#                                       exit 1, naming them, if any of GROUP's Debian packages
#                                       is missing; install nothing
#
# Groups (each includes the ones before it where it says so):
#   build   what `cargo build -p metfs` needs: libhdf5-dev and pkg-config (HDF5 labels and
#           container mode), protobuf-compiler (the etcd client's build runs protoc)
#   run     what running the demo with an installed metfs needs (`scripts/demo.sh --installed`):
#           fuse3 (fusermount3, for mounts by ordinary users and `metfs umount`) and the demo's
#           Python packages (numpy, scikit-learn)
#   demo    build and run: what `scripts/demo.sh` needs on a fresh machine
#   wheel   build, plus what scripts/wheel.sh needs: CMake >= 3.26, maturin and zig from PyPI
#           (HDF5 built statically; the binary linked against glibc 2.28), auditwheel
#   all     demo and wheel, plus the test tools: fio, rsync, Slurm and munge, etcd, Open MPI
#           and libclang (metfs-shuffle), the Python test requirements, the nightly toolchain
#           with cargo-fuzz, and the Garage S3 server
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_APT=(pkg-config libhdf5-dev protobuf-compiler)
DEMO_APT=(fuse3)
DEMO_PIP=(numpy scikit-learn)
# The wheel's tools, pinned: maturin builds it, ziglang links it for an older glibc, cmake
# builds the bundled HDF5 (Debian 12's CMake is 3.25; hdf5-metno's `static` needs 3.26).
WHEEL_PIP=(maturin==1.16.0 ziglang==0.15.2 cmake==3.31.10 auditwheel==6.8.2)
TEST_APT=(fio rsync python3-pytest curl
          slurm-wlm slurmctld slurmd slurm-client munge
          etcd-server etcd-client
          libopenmpi-dev openmpi-bin libclang-dev)
TEST_REQ=bindings/python/requirements-test.txt

die() {
  echo "install-deps: $*" >&2
  exit 2
}

apt_of() { # group
  case "$1" in
  build) echo "${BUILD_APT[*]}" ;;
  run) echo "${DEMO_APT[*]}" ;;
  demo) echo "${BUILD_APT[*]} ${DEMO_APT[*]}" ;;
  wheel) echo "${BUILD_APT[*]}" ;;
  all) echo "${BUILD_APT[*]} ${DEMO_APT[*]} ${TEST_APT[*]}" ;;
  *) die "unknown group '$1' (groups: build, run, demo, wheel, all)" ;;
  esac
}

pip_of() { # group
  case "$1" in
  build) echo "" ;;
  run | demo) echo "${DEMO_PIP[*]}" ;;
  wheel) echo "${WHEEL_PIP[*]}" ;;
  all) echo "${DEMO_PIP[*]} ${WHEEL_PIP[*]} -r $TEST_REQ" ;;
  *) die "unknown group '$1' (groups: build, run, demo, wheel, all)" ;;
  esac
}

missing_apt() { # packages...
  local p
  for p in "$@"; do
    dpkg -s "$p" >/dev/null 2>&1 || echo "$p"
  done
}

install_apt() { # packages...
  local missing
  mapfile -t missing < <(missing_apt "$@")
  if [ ${#missing[@]} -gt 0 ]; then
    echo "install-deps: apt-get install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

install_pip() { # pip arguments...
  [ $# -gt 0 ] || return 0
  # A stamp per package list: pip's own "already satisfied" check costs seconds per run.
  local stamp
  stamp=/var/tmp/metfs-pip-$(printf '%s\n' "$@" | cat - "$TEST_REQ" | sha256sum | cut -c1-16)
  [ -e "$stamp" ] && return 0
  echo "install-deps: pip install $*"
  python3 -m pip install -q --disable-pip-version-check "$@"
  touch "$stamp"
}

case "${1:-all}" in
--list)
  group=${2:?usage: install-deps.sh --list GROUP}
  echo "debian: $(apt_of "$group")"
  echo "python: $(pip_of "$group")"
  exit 0
  ;;
--check)
  group=${2:?usage: install-deps.sh --check GROUP}
  # shellcheck disable=SC2046
  mapfile -t missing < <(missing_apt $(apt_of "$group"))
  if [ ${#missing[@]} -gt 0 ]; then
    echo "install-deps: group $group lacks: ${missing[*]}" >&2
    exit 1
  fi
  echo "install-deps: group $group: every Debian package installed"
  exit 0
  ;;
esac

GROUP=${1:-all}
# shellcheck disable=SC2046
install_apt $(apt_of "$GROUP")
# shellcheck disable=SC2046
install_pip $(pip_of "$GROUP")

[ "$GROUP" = all ] || exit 0

# cargo-fuzz for scripts/fuzz.sh (the fuzz targets build with the nightly toolchain).
if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "install-deps: rustup toolchain install nightly"
  rustup toolchain install nightly --profile minimal >/dev/null
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "install-deps: cargo install cargo-fuzz"
  cargo install cargo-fuzz --locked -q
fi

scripts/garage.sh install
