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
#   scripts/install-deps.sh --venv      print the Python environment's directory (below)
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
#           and libclang (metfs-shuffle), the Python test requirements, the pinned nightly
#           toolchain with cargo-fuzz (scripts/fuzz.sh --install), and the Garage S3 server
#
# Python packages go into a virtual environment, never into the system's Python (Debian 12's
# own python3 refuses `pip install`, PEP 668, and has no pip), and every Python step of the
# scripts runs that environment's python. Which one:
# * $METFS_VENV when set; else the active virtual environment ($VIRTUAL_ENV), so a user who
#   installed the wheel into one runs the demo there;
# * else /var/tmp/metfs-venv-pyX.Y-HASH, made with `python3 -m venv` ($METFS_PYTHON picks
#   another interpreter; HASH names its installation, so two Pythons 3.11 on one machine get
#   an environment each). It lies outside the clone because CI tests a fresh clone each time on
#   the same machine: inside it, torch (~3 GB) would be installed again on every run. It is
#   world-readable (umask 022), and made with --system-site-packages: packages the interpreter
#   already has at the pinned version are not downloaded again; pip installs only what differs.
# Whether pip runs is decided by what is installed, not by a stamp: each pinned
# `name==version` is compared with the version the environment imports (under a second).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_APT=(pkg-config libhdf5-dev protobuf-compiler)
DEMO_APT=(fuse3)
# `python3 -m venv` (the environment above) needs ensurepip, which Debian packages apart.
VENV_APT=(python3-venv)
# Any recent numpy and scikit-learn run the demo; `run` installs into the user's own
# environment, so it does not move their versions (the tests' pins are in TEST_REQ).
DEMO_PIP=(numpy scikit-learn)
# The wheel's tools, pinned: maturin builds it, ziglang links it for an older glibc, cmake
# builds the bundled HDF5 (Debian 12's CMake is 3.25; hdf5-metno's `static` needs 3.26).
WHEEL_PIP=(maturin==1.16.0 ziglang==0.15.2 cmake==3.31.10 auditwheel==6.8.2)
TEST_APT=(fio rsync python3-pytest curl time
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
  run) echo "${DEMO_APT[*]} ${VENV_APT[*]}" ;;
  demo) echo "${BUILD_APT[*]} ${DEMO_APT[*]} ${VENV_APT[*]}" ;;
  wheel) echo "${BUILD_APT[*]} ${VENV_APT[*]}" ;;
  all) echo "${BUILD_APT[*]} ${DEMO_APT[*]} ${VENV_APT[*]} ${TEST_APT[*]}" ;;
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

venv_dir() {
  if [ -n "${METFS_VENV:-}" ]; then
    echo "$METFS_VENV"
  elif [ -n "${VIRTUAL_ENV:-}" ]; then
    echo "$VIRTUAL_ENV"
  else
    local base=${METFS_PYTHON:-python3} key
    key=$("$base" -c 'import hashlib, sys
v = sys.version_info
print(f"py{v[0]}.{v[1]}-" + hashlib.sha256(sys.base_prefix.encode()).hexdigest()[:8])') ||
      die "no Python interpreter '$base' (Debian: apt-get install python3 python3-venv)"
    echo "/var/tmp/metfs-venv-$key"
  fi
}

make_venv() { # dir
  "$1/bin/python" -c '' 2>/dev/null && return 0
  local base=${METFS_PYTHON:-python3} clear=()
  if [ -n "$(ls -A "$1" 2>/dev/null)" ]; then
    # An environment whose python no longer runs (its interpreter removed or moved) is made
    # again in place; a directory that is not an environment is left alone.
    [ -f "$1/pyvenv.cfg" ] || die "$1 is not empty and not a virtual environment: set METFS_VENV"
    clear=(--clear)
  fi
  echo "install-deps: $base -m venv --system-site-packages ${clear[*]:+--clear }$1"
  (umask 022 && "$base" -m venv --system-site-packages "${clear[@]}" "$1") ||
    die "could not make a virtual environment in $1 (Debian: apt-get install python3-venv)"
}

unmet() { # python, pip arguments...: prints each requirement the environment does not meet
  local py=$1
  shift
  "$py" - "$@" <<'PY'
import importlib.metadata as md
import re
import sys

args, reqs = sys.argv[1:], []
while args:
    a = args.pop(0)
    if a == "-r":
        with open(args.pop(0)) as f:
            reqs += [ln.split("#", 1)[0].strip() for ln in f]
    elif not a.startswith("-"):
        reqs.append(a)
for r in filter(None, reqs):
    m = re.fullmatch(r"([A-Za-z0-9._-]+)(\[[A-Za-z0-9,._-]*\])?(?:==([^\s;]+))?", r)
    if not m:
        sys.exit(f"install-deps: cannot check requirement {r!r}: write it as name==version")
    name, _, want = m.groups()
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        print(r)
        continue
    # pip's `==X` accepts X+local (e.g. a CPU build's "+cpu"); so does this check.
    if want is not None and have.split("+")[0] != want:
        print(r)
PY
}

install_pip() { # pip arguments...
  [ $# -gt 0 ] || return 0
  local venv py todo
  venv=$(venv_dir)
  make_venv "$venv"
  py=$venv/bin/python
  todo=$(unmet "$py" "$@") || exit 2
  [ -n "$todo" ] || return 0
  echo "install-deps: pip install into $venv: ${todo//$'\n'/ }"
  "$py" -m pip install -q --disable-pip-version-check "$@"
  todo=$(unmet "$py" "$@") || exit 2
  [ -z "$todo" ] || die "pip finished, but $venv still lacks: ${todo//$'\n'/ }"
}

case "${1:-all}" in
--venv)
  venv_dir
  exit 0
  ;;
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

# The pinned nightly toolchain and cargo-fuzz for scripts/fuzz.sh (the pins live there).
scripts/fuzz.sh --install

scripts/garage.sh install
