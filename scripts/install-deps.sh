#!/usr/bin/env bash
# Installs everything the tests, benchmarks and demo need on a Debian 12 machine (as root):
# Debian packages (etcd-server for the dynamic-sharding tests; protobuf-compiler to build the
# etcd client; Open MPI and libclang for metfs-shuffle, aggregate-cache mode's exchange), Python packages, the nightly toolchain with cargo-fuzz, and the Garage S3
# server. Each step is skipped when its result is already there, so a second run takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PKGS=(fuse3 libhdf5-dev pkg-config fio rsync python3-pytest
          slurm-wlm slurmctld slurmd slurm-client munge
          etcd-server protobuf-compiler
          libopenmpi-dev openmpi-bin libclang-dev)
missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

REQ=bindings/python/requirements-test.txt
stamp=/var/tmp/metfs-pip-$(sha256sum "$REQ" | cut -c1-16)
if [ ! -e "$stamp" ]; then
  echo "install-deps: pip install -r $REQ"
  python3 -m pip install -q --disable-pip-version-check -r "$REQ"
  touch "$stamp"
fi
python3 -m pip install -q --disable-pip-version-check --no-deps -e bindings/python >/dev/null

# cargo-fuzz for scripts/fuzz.sh (the fuzz targets build with the nightly toolchain).
if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "install-deps: rustup toolchain install nightly"
  rustup toolchain install nightly --profile minimal >/dev/null
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "install-deps: cargo install cargo-fuzz"
  cargo install cargo-fuzz --locked -q
fi

if [ -x scripts/garage.sh ]; then
  scripts/garage.sh install
fi
