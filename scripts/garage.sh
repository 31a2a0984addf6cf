#!/usr/bin/env bash
# A single-node Garage S3 server on loopback, for metfs tests and benchmarks.
#
#   scripts/garage.sh install              install Garage 2.5.0 once per machine (~16 min on 2 cores)
#                                          unless a `garage` of that version is on PATH or in
#                                          ~/.cargo/bin; another version is never used
#   scripts/garage.sh start DIR [PORT [RPC_PORT]]
#                                          start a server with its state in DIR; S3 on
#                                          127.0.0.1:PORT (default 3900), RPC on RPC_PORT
#                                          (default: the one DIR's server last had, else
#                                          PORT+1, else a free one); prints the S3 endpoint
#                                          once the server answers a signed S3 request
#   scripts/garage.sh env DIR              print `export AWS_...` lines for the server in DIR
#   scripts/garage.sh stop DIR             stop the server started in DIR
#
# `start` makes a random access key, secret and rpc secret, writes DIR/garage.toml and
# DIR/credentials (mode 0600), and starts `garage server --single-node --default-bucket`, which
# creates the key and the bucket (`metfs` unless GARAGE_BUCKET is set) on first start. Starting
# again on the same DIR reuses its data and credentials, so a test can kill and restart a server
# without losing objects. Everything binds to 127.0.0.1 only.
set -euo pipefail

GARAGE_VERSION=2.5.0
EMPTY_SHA256=e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855
BUILD_LOG=/tmp/setup/garage.log

die() {
    echo "garage.sh: $*" >&2
    exit 1
}

garage_version() { # binary: its x.y.z (`garage --version` says e.g. "garage cargo:2.5.0 [...]")
    "$1" --version 2>/dev/null | grep -oE '[0-9]+\.[0-9]+\.[0-9]+' | head -1
}

garage_bin() { # the first garage, on PATH or in ~/.cargo/bin, that is GARAGE_VERSION
    local b
    for b in "$(command -v garage 2>/dev/null)" "$HOME/.cargo/bin/garage"; do
        if [ -n "$b" ] && [ -x "$b" ] && [ "$(garage_version "$b")" = "$GARAGE_VERSION" ]; then
            echo "$b"
            return 0
        fi
    done
    return 1
}

have_garage() {
    garage_bin >/dev/null
}

other_garages() { # each garage found that is not GARAGE_VERSION, with its version
    local b
    for b in "$(command -v garage 2>/dev/null)" "$HOME/.cargo/bin/garage"; do
        if [ -n "$b" ] && [ -x "$b" ] && [ "$(garage_version "$b")" != "$GARAGE_VERSION" ]; then
            echo "$b ($(garage_version "$b" || true))"
        fi
    done | sort -u | paste -sd ' '
}

cmd_install() {
    if have_garage; then
        echo "garage: $(garage_bin)"
        return 0
    fi
    # A machine image may already be building Garage in the background; a second build would
    # double the 16 minutes on 2 cores, so wait for that one instead.
    if pgrep -f "cargo install garage" >/dev/null 2>&1; then
        echo "garage.sh: a Garage build is already running; waiting for it (log: $BUILD_LOG)" >&2
        local waited=0
        while pgrep -f "cargo install garage" >/dev/null 2>&1; do
            sleep 10
            waited=$((waited + 10))
            [ "$waited" -lt 3600 ] || die "the running Garage build did not finish within an hour"
        done
        have_garage && {
            echo "garage: $(garage_bin)"
            return 0
        }
        echo "garage.sh: the background build ended without a garage binary; building it" >&2
    fi
    command -v cargo >/dev/null 2>&1 || die "cargo is needed to install Garage (https://rustup.rs)"
    local other
    other=$(other_garages)
    [ -z "$other" ] || echo "garage.sh: not Garage $GARAGE_VERSION, so not used: $other" >&2
    # --force: replaces a ~/.cargo/bin/garage of another version.
    cargo install garage --version "$GARAGE_VERSION" --locked --force
    have_garage || die "cargo install finished but ~/.cargo/bin/garage is not Garage $GARAGE_VERSION"
    echo "garage: $(garage_bin)"
}

running() { # pid: alive and not a zombie
    kill -0 "$1" 2>/dev/null || return 1
    [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]
}

stop_pid() { # pid: SIGTERM, up to 10 s to exit, then SIGKILL
    running "$1" || return 0
    kill "$1" 2>/dev/null || true
    local i
    for i in $(seq 1 100); do
        running "$1" || return 0
        sleep 0.1
    done
    kill -9 "$1" 2>/dev/null || true
}

rand_hex() { # bytes
    od -An -tx1 -N"$1" /dev/urandom | tr -d ' \n'
}

port_free() { # port: nothing listens on 127.0.0.1:PORT
    ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

s3_ready() { # port key secret bucket
    # Garage's own answer to a signed ListObjectsV2 of the default bucket: it comes only once
    # the server has made the key and the bucket and serves S3, not when the port first opens.
    # (curl signs the x-amz-* headers it is given; S3 wants the payload's hash, here of nothing.)
    curl -sf -o /dev/null --max-time 2 --aws-sigv4 "aws:amz:garage:s3" --user "$2:$3" \
        -H "x-amz-content-sha256: $EMPTY_SHA256" \
        "http://127.0.0.1:$1/$4?list-type=2&max-keys=1" 2>/dev/null
}

cmd_start() {
    local dir=${1:?usage: garage.sh start DIR [PORT [RPC_PORT]]}
    local port=${2:-3900}
    local rpc_port=${3:-}
    if ! have_garage; then
        local other
        other=$(other_garages)
        die "Garage $GARAGE_VERSION is not installed${other:+ (found, not used: $other)}: run scripts/garage.sh install (about 16 minutes on 2 cores)"
    fi
    mkdir -p "$dir/meta" "$dir/data"
    dir=$(cd "$dir" && pwd)
    if [ -f "$dir/garage.pid" ] && running "$(cat "$dir/garage.pid")"; then
        die "a server is already running from $dir (pid $(cat "$dir/garage.pid")); stop it first"
    fi
    if [ ! -f "$dir/credentials" ]; then
        # Garage access key ids look like GK + 24 hex digits; the secret is 64 hex digits.
        umask 077
        {
            echo "GARAGE_DEFAULT_ACCESS_KEY=GK$(rand_hex 12)"
            echo "GARAGE_DEFAULT_SECRET_KEY=$(rand_hex 32)"
            echo "GARAGE_DEFAULT_BUCKET=${GARAGE_BUCKET:-metfs}"
            echo "RPC_SECRET=$(rand_hex 32)"
        } >"$dir/credentials"
        umask 022
    fi
    # shellcheck disable=SC1091
    . "$dir/credentials"
    # A restart without RPC_PORT reuses the one the server last had: PORT+1 may belong to
    # another server by now, and Garage panics when it cannot bind its RPC port.
    if [ -z "$rpc_port" ]; then
        if [ -f "$dir/rpc_port" ]; then rpc_port=$(cat "$dir/rpc_port"); else rpc_port=$((port + 1)); fi
    fi
    if ! port_free "$rpc_port"; then
        # Garage's RPC address can change between starts of a single node, so when the port was
        # not asked for by name, any free one will do.
        [ -z "${3:-}" ] || die "RPC port $rpc_port is in use by another process: pass a free one"
        local tries=0
        while ! port_free "$rpc_port" || [ "$rpc_port" = "$port" ]; do
            rpc_port=$((20000 + RANDOM % 40000))
            tries=$((tries + 1))
            [ "$tries" -lt 100 ] || die "found no free RPC port in 100 tries"
        done
    fi
    # The ports may change between starts (a test may restart on the same ones or not).
    cat >"$dir/garage.toml" <<EOF
metadata_dir = "$dir/meta"
data_dir = "$dir/data"
db_engine = "sqlite"
replication_factor = 1
rpc_bind_addr = "127.0.0.1:$rpc_port"
rpc_public_addr = "127.0.0.1:$rpc_port"
rpc_secret = "$RPC_SECRET"

[s3_api]
s3_region = "garage"
api_bind_addr = "127.0.0.1:$port"
root_domain = ".s3.garage.localhost"
EOF
    echo "$port" >"$dir/port"
    echo "$rpc_port" >"$dir/rpc_port"
    # Any listener, not only an HTTP one: Garage does not exit when it cannot bind its S3 port
    # (it logs the error and serves RPC only), so a port taken by, say, another server's RPC
    # side would otherwise cost the whole wait below.
    if ! port_free "$port"; then
        die "port $port is in use by another process: pass a free one"
    fi
    [ "$port" != "$rpc_port" ] || die "the S3 and RPC ports are the same ($port)"
    # The log is kept across restarts; only this start's part of it is searched below.
    local log_from
    log_from=$(stat -c %s "$dir/garage.log" 2>/dev/null || echo 0)
    GARAGE_DEFAULT_ACCESS_KEY=$GARAGE_DEFAULT_ACCESS_KEY \
        GARAGE_DEFAULT_SECRET_KEY=$GARAGE_DEFAULT_SECRET_KEY \
        GARAGE_DEFAULT_BUCKET=$GARAGE_DEFAULT_BUCKET \
        RUST_LOG=${RUST_LOG:-garage=warn} \
        "$(garage_bin)" -c "$dir/garage.toml" server --single-node --default-bucket \
        >>"$dir/garage.log" 2>&1 </dev/null &
    local pid=$!
    echo "$pid" >"$dir/garage.pid"
    local i
    for i in $(seq 1 600); do
        if ! running "$pid"; then
            tail -n 20 "$dir/garage.log" >&2
            rm -f "$dir/garage.pid"
            die "garage exited during start (log: $dir/garage.log)"
        fi
        # The port was taken between the check above and the bind: Garage goes on without S3.
        if tail -c +"$((log_from + 1))" "$dir/garage.log" 2>/dev/null |
            grep -q "S3 API server exited with error"; then
            stop_pid "$pid"
            rm -f "$dir/garage.pid"
            tail -n 20 "$dir/garage.log" >&2
            die "garage could not serve S3 on 127.0.0.1:$port (log: $dir/garage.log)"
        fi
        if s3_ready "$port" "$GARAGE_DEFAULT_ACCESS_KEY" "$GARAGE_DEFAULT_SECRET_KEY" \
            "$GARAGE_DEFAULT_BUCKET"; then
            echo "http://127.0.0.1:$port"
            return 0
        fi
        sleep 0.1
    done
    stop_pid "$pid"
    rm -f "$dir/garage.pid"
    tail -n 20 "$dir/garage.log" >&2
    die "garage on 127.0.0.1:$port did not answer a signed S3 request within 60 s (log: $dir/garage.log)"
}

cmd_env() {
    local dir=${1:?usage: garage.sh env DIR}
    [ -f "$dir/credentials" ] || die "no server state in $dir: run garage.sh start $dir first"
    # shellcheck disable=SC1091
    . "$dir/credentials"
    local port
    port=$(cat "$dir/port")
    cat <<EOF
export AWS_ENDPOINT_URL=http://127.0.0.1:$port
export AWS_REGION=garage
export AWS_DEFAULT_REGION=garage
export AWS_ALLOW_HTTP=true
export AWS_ACCESS_KEY_ID=$GARAGE_DEFAULT_ACCESS_KEY
export AWS_SECRET_ACCESS_KEY=$GARAGE_DEFAULT_SECRET_KEY
export METFS_S3_BUCKET=$GARAGE_DEFAULT_BUCKET
EOF
}

cmd_stop() {
    local dir=${1:?usage: garage.sh stop DIR}
    [ -f "$dir/garage.pid" ] || return 0
    stop_pid "$(cat "$dir/garage.pid")"
    rm -f "$dir/garage.pid"
}

case "${1:-}" in
install) cmd_install ;;
start)
    shift
    cmd_start "$@"
    ;;
env)
    shift
    cmd_env "$@"
    ;;
stop)
    shift
    cmd_stop "$@"
    ;;
*)
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
