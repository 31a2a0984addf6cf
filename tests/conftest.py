"""Shared fixtures of the end-to-end tests: the metfs binary, datasets, and real mounts.

Every mount made through the ``mounts`` fixture is closed at teardown, also when the test
fails: ``metfs umount``, then a lazy ``umount -l`` and a kill of what is left (the ``Mount`` of
tests/mountlib.py, which this module re-exports with its ``rpc`` and ``is_mounted``).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest
from mountlib import ROOT, Mount, Setting, is_mounted, metfs_bin, rpc

__all__ = [
    "ROOT",
    "Mount",
    "metfs_bin",
    "is_mounted",
    "rpc",
    "make_tree",
    "footprint",
    "read_view",
    "wait_for",
    "shutil",
]


@pytest.fixture(scope="session")
def metfs() -> str:
    if not os.environ.get("METFS_BIN"):
        subprocess.run(["cargo", "build", "-q", "-p", "metfs"], cwd=ROOT, check=True)
    return metfs_bin()


def make_tree(
    root: Path, n: int = 300, seed: int = 7, max_size: int = 48 * 1024
) -> dict[str, bytes]:
    """A labelled dataset in nested class directories with varied sizes, empty files, and
    names with spaces and non-ASCII characters. Returns {relative path: bytes}."""
    rng = random.Random(seed)
    classes = ["cat", "dog", "bird house", "élan"]
    files: dict[str, bytes] = {}
    for i in range(n):
        cls = classes[i % len(classes)]
        sub = f"part {i % 3}" if i % 5 == 0 else ""
        name = f"sample {i:04d}" + ("-ü" if i % 7 == 0 else "") + ".bin"
        rel = "/".join(p for p in (cls, sub, name) if p)
        size = 0 if i % 50 == 0 else rng.randint(1, max_size)
        data = rng.randbytes(size)
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        files[rel] = data
    return files


def footprint(path: Path, each_file_once: bool = False) -> int:
    """Bytes a directory tree takes on disk: allocated blocks of every file and directory (with
    `each_file_once`, a file with several names, hard links, counts once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:
                continue
            if each_file_once:
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total


@pytest.fixture
def mounts(metfs: str, tmp_path: Path) -> Iterator[Callable[..., Mount]]:
    """Makes mounts (not mounted yet): `mounts(source, budget, *flags, name=, cache=,
    **settings)`, each with its own mountpoint and cache under the test's directory; a `Tier`
    as the source brings its flags and environment. Each is closed at teardown (`Mount.close`:
    unmounted, its daemon stopped), also when the test failed."""
    made: list[Mount] = []

    def make(
        source: "str | Path | Tier",
        budget: str,
        *extra: str,
        name: str = "m",
        cache: Path | None = None,
        **settings: Setting,
    ) -> Mount:
        cache = cache or tmp_path / f"cache-{name}"
        cache.mkdir(parents=True, exist_ok=True)
        env = None
        if isinstance(source, Tier):
            extra = (*source.args, *extra)
            env = source.env
            source = source.url
        m = Mount(
            source,
            cache,
            tmp_path / f"mnt-{name}",
            metfs=metfs,
            env=env,
            budget=budget,
            # A history file per test, so that no run's rf history steers another test's mount.
            history=tmp_path / "rf-history.json",
            args=extra,
            **settings,
        )
        made.append(m)
        return m

    yield make
    for m in made:
        m.close()


@dataclass
class Tier:
    """A capacity tier holding a dataset: its source URL, extra mount flags and environment."""

    kind: str
    url: str
    args: list[str]
    env: dict[str, str] | None


def free_ports(n: int) -> list[int]:
    """`n` distinct loopback ports that were free just now. All `n` sockets stay bound until
    every port is chosen: one let go of at once can be handed out again by the next bind, and
    a server given the same port twice (Garage's S3 and RPC, etcd's client and peer) fails."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def free_port_pair() -> int:
    """A loopback port `p` with `p + 1` free too, both just now: etcd started by the node
    service listens for clients on `p` and for peers on `p + 1`, and fails at start when the
    second is taken (a free port's neighbour often is: another test's server, an outgoing
    connection)."""
    for _ in range(100):
        first = socket.socket()
        second = socket.socket()
        try:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            if port >= 65535:
                continue
            try:
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
        finally:
            first.close()
            second.close()
    raise RuntimeError("no two neighbouring loopback ports free in 100 tries")


@dataclass
class Garage:
    dir: Path
    endpoint: str
    env: dict[str, str]

    def client(self):
        import boto3
        from botocore.config import Config

        from botocore import handlers

        c = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="garage",
            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"],
            # Checksum trailers on every PUT make each request wait ~3 s on Garage.
            config=Config(
                s3={"addressing_style": "path"}, request_checksum_calculation="when_required"
            ),
        )
        # Garage answers small PUTs only after botocore's `Expect: 100-continue` wait times out.
        c.meta.events.unregister("before-call.s3.PutObject", handlers.add_expect_header)
        return c

    def upload(self, local: Path, prefix: str) -> None:
        c = self.client()
        for p in sorted(local.rglob("*")):
            if p.is_file() and not p.is_symlink():
                body = p.read_bytes()
                # After an empty PUT, Garage stalls the next request on the same kept-alive
                # connection for seconds; empty objects go through a throwaway client.
                client = c if body else self.client()
                client.put_object(Bucket="metfs", Key=f"{prefix}/{p.relative_to(local)}", Body=body)
                if not body:
                    client.close()

    def stop(self) -> None:
        subprocess.run(
            [str(ROOT / "scripts" / "garage.sh"), "stop", str(self.dir)], capture_output=True
        )

    def start(self) -> None:
        port = self.endpoint.rsplit(":", 1)[1]
        r = subprocess.run(
            [str(ROOT / "scripts" / "garage.sh"), "start", str(self.dir), port],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr


@pytest.fixture(scope="session")
def garage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Garage]:
    """A real Garage S3 server on loopback for the whole session."""
    # A port `free_port` let go of can be taken before Garage binds it; garage.sh then fails
    # at once, and fresh ports (and a fresh directory) are tried, as the Rust tests do.
    failures = []
    for _ in range(3):
        d = tmp_path_factory.mktemp("garage")
        port, rpc_port = free_ports(2)
        r = subprocess.run(
            [str(ROOT / "scripts" / "garage.sh"), "start", str(d), str(port), str(rpc_port)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if r.returncode == 0:
            break
        failures.append(r.stderr)
        print(f"garage did not start on port {port}, trying fresh ports: {r.stderr}")
    else:
        raise AssertionError(f"garage did not start in 3 tries: {failures}")
    out = subprocess.run(
        [str(ROOT / "scripts" / "garage.sh"), "env", str(d)],
        capture_output=True,
        text=True,
        check=True,
    )
    env = dict(os.environ)
    for line in out.stdout.splitlines():
        if line.startswith("export "):
            k, v = line[len("export ") :].split("=", 1)
            env[k] = v.strip("'\"")
    g = Garage(d, f"http://127.0.0.1:{port}", env)
    yield g
    g.stop()


@pytest.fixture(params=["posix", "s3"])
def tier_kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def make_tier(
    request: pytest.FixtureRequest, tier_kind: str, tmp_path: Path
) -> Callable[[Path], Tier]:
    """Puts a local dataset directory on the tier under test and returns how to mount it."""

    def make(local: Path) -> Tier:
        if tier_kind == "posix":
            return Tier("posix", str(local), [], None)
        g: Garage = request.getfixturevalue("garage")
        prefix = f"t{abs(hash(str(tmp_path))) % 10**8}"
        g.upload(local, prefix)
        return Tier(
            "s3",
            f"s3://metfs/{prefix}",
            ["--endpoint", g.endpoint, "--region", "garage", "--allow-http"],
            g.env,
        )

    return make


@pytest.fixture
def dataset(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    src = tmp_path / "tier"
    files = make_tree(src)
    return src, files


def read_view(mnt: Path) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for dirpath, _, filenames in os.walk(mnt):
        for n in filenames:
            p = Path(dirpath) / n
            out[str(p.relative_to(mnt))] = p.read_bytes()
    return out


def wait_for(cond: Callable[[], bool], timeout: float = 30, what: str = "condition") -> None:
    t = time.time()
    while time.time() - t < timeout:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def wait_etcd_healthy(
    port: int, proc: "subprocess.Popen[bytes]", log: Path, timeout: float = 60
) -> None:
    """Waits for etcd's own health answer (`GET /health` says `"health":"true"`, which etcd
    gives once it has a leader and has served a read), not for an open port: etcd accepts TCP
    before it serves, and a client that connects then fails on a busy machine. Fails naming etcd
    with its log when the process exits or the answer does not come."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while True:
        if proc.poll() is not None:
            raise AssertionError(
                f"etcd on 127.0.0.1:{port} exited ({proc.returncode}) before it was "
                f"healthy; its log ({log}):\n{log.read_text(errors='replace')[-4000:]}"
            )
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                body = r.read().decode(errors="replace")
            if json.loads(body).get("health") == "true":
                return
            last = body
        except (OSError, ValueError) as e:
            last = repr(e)
        if time.monotonic() > deadline:
            raise AssertionError(
                f"etcd on 127.0.0.1:{port} not healthy after {timeout:.0f} s (last: {last}); "
                f"its log ({log}):\n{log.read_text(errors='replace')[-4000:]}"
            )
        time.sleep(0.1)


@dataclass
class Etcd:
    """A real etcd (Debian's etcd-server) on free loopback ports with its data in `dir`."""

    dir: Path
    client_port: int
    peer_port: int
    proc: subprocess.Popen[bytes] | None = None
    #: etcd's `--metrics`: "extensive" adds its histograms of each request's handling time.
    metrics: str = "basic"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def url(self, prefix: str) -> str:
        return f"etcd://{self.endpoint}/{prefix}"

    def start(self) -> None:
        c, p = f"http://127.0.0.1:{self.client_port}", f"http://127.0.0.1:{self.peer_port}"
        log = open(self.dir / "etcd.log", "ab")
        self.proc = subprocess.Popen(
            [
                "etcd",
                "--name",
                "t",
                "--data-dir",
                str(self.dir / "data"),
                "--listen-client-urls",
                c,
                "--advertise-client-urls",
                c,
                "--listen-peer-urls",
                p,
                "--initial-advertise-peer-urls",
                p,
                "--initial-cluster",
                f"t={p}",
                "--metrics",
                self.metrics,
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        log.close()
        wait_etcd_healthy(self.client_port, self.proc, self.dir / "etcd.log")

    def kill(self) -> None:
        """`kill -9`."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[Etcd]:
    """A real etcd for one test, killed at its end."""
    d = tmp_path / "etcd"
    d.mkdir()
    e = Etcd(d, *free_ports(2))
    e.start()
    try:
        yield e
    finally:
        e.kill()
