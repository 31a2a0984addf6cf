#!/usr/bin/env python3
"""metfs against the tools a user picks instead, on one throttled S3 tier.

    python3 benches/peers/run.py            # 0.5x, 2x and 8x the cache, 3 repetitions
    python3 benches/peers/run.py --quick    # a small dataset, 1 repetition (the smoke test)

Every side reads the same samples (files of SAMPLE_KIB, random bytes) from one Garage server
behind `proxy.py`, which caps what the tier delivers at RATE_MIB/s for all connections together
and counts every byte. Each side gets the same cache budget (CACHE_MIB), enforced as on a full
disk, and the same consumer: 4 reader threads, 128 KiB reads. Sides:

* `metfs`        `metfs mount` of the S3 prefix, `--budget CACHE --rf 4` (fixed rf, default
                 policy); the job reads the view each pass and sends one `pass_end` per pass (a
                 `wait` answer means the next mini-epoch is not staged yet: the job makes a bonus
                 pass over the current one, counted as consumed samples);
* `metfs-block`  the same with `pass_end(block=true)`: no bonus passes, the job waits instead;
* `rclone`       `rclone mount --vfs-cache-mode full --vfs-cache-max-size CACHE
                 --vfs-cache-poll-interval 1s` (the default 1 min lets the cache overshoot to the
                 whole dataset in a short run);
* `s3fs`         `s3fs -o use_cache=DIR,ensure_diskfree=8` with DIR on a tmpfs of CACHE bytes
                 (s3fs has no size cap of its own);
* `streaming`    MosaicML Streaming configured by its own documentation (`streaming_settings`:
                 the job's batch size of BATCH through its StreamingDataLoader, `py1e` with a
                 shuffle block of a mini-epoch's samples, predownload, one canonical node,
                 cache_limit CACHE) over the same samples written as MDS shards of SHARD_MIB;
* `direct`       boto3 GETs of every sample, every epoch, by worker processes with threads
                 (`DirectGets`: DIRECT_WORKERS x DIRECT_THREADS requests in flight).

The peers read the whole dataset each epoch in a new shuffled order (a job without mini-epochs);
metfs's job reads its mini-epochs. Each run consumes the same number of samples (CONSUME
dataset-equivalents; fewer for the large dataset, so one run stays within a minute at the tier's
rate) and is timed from the mount (or client start) to the last sample, cold: caches empty,
page cache dropped. Reported per case: samples/s, its ratio to metfs, tier bytes (through the
proxy: bodies, headers, listings) per consumed byte, and the peak bytes of the side's cache
directory on disk (files counted once per inode, sampled every 0.2 s), as medians over the
repetitions; the order of the sides rotates between repetitions.

JuiceFS is not a side: it serves only data written through itself (files cut into its own chunk
objects, with a metadata engine), so it cannot read the bucket of plain sample objects the others
share; see docs/BENCHMARKS.md.

Each side's configuration (how, and per whose documentation) is printed with the tables, and
each row gives the fraction of the tier's cap the side read at (tier bytes / time / cap).

Peers missing on the machine are installed (apt-get: rclone, s3fs; pip: mosaicml-streaming);
a side that still cannot run stops the run with its name and the reason, or with
--allow-missing is skipped and listed as skipped in the tables. Before the runs the tier is
checked: where Garage behind the proxy cannot deliver 90 % of the cap to many GETs in flight on
this machine, the run stops (--allow-slow-tier goes on and says so; --quick always does). Needs root (FUSE, tmpfs, dropping caches)
and Garage (scripts/garage.sh install). Environment: METFS_BIN (default target/release/metfs,
built when missing), PEERS_WORK (work directory, default a new /tmp/metfs-peers.*; removed
unless --keep).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import importlib
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benches"))

# The benchmarks' shared helpers, and the tests' one picker of distinct free ports and one
# mount check for every script.
import benchlib  # noqa: E402
from benchlib import drop_caches  # noqa: E402
from conftest import free_ports, is_mounted  # noqa: E402

MIB = 1 << 20
READ = 128 << 10
THREADS = 4
ALL_TOOLS = ["metfs", "metfs-block", "rclone", "s3fs", "streaming", "direct"]


def log(msg: str) -> None:
    print(f"# {msg}", file=sys.stderr, flush=True)


def sh(*cmd: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=check, **kw)


def disk_bytes(path: Path) -> int:
    """Bytes the files under `path` take on disk, each inode once (a hard link is one file)."""
    seen: set[int] = set()
    total = 0
    for dirpath, dirnames, filenames in os.walk(path):
        for name in filenames + dirnames:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if st.st_ino not in seen:
                seen.add(st.st_ino)
                total += st.st_blocks * 512
    return total


class Peak(threading.Thread):
    """Samples a cache directory's bytes on disk every 0.2 s and keeps the peak."""

    def __init__(self, path: Path | None) -> None:
        super().__init__(daemon=True)
        self.path, self.peak, self.halt = path, 0, threading.Event()

    def run(self) -> None:
        while self.path is not None and not self.halt.is_set():
            self.peak = max(self.peak, disk_bytes(self.path))
            self.halt.wait(0.2)

    def stop(self) -> int:
        self.halt.set()
        self.join()
        if self.path is not None:
            self.peak = max(self.peak, disk_bytes(self.path))
        return self.peak


# ---------------------------------------------------------------------------- the tier


def sample_bytes(case: str, i: int, size: int) -> bytes:
    return random.Random(f"{case}:{i}").randbytes(size)


def sample_key(i: int) -> str:
    return f"c{i % 16:02d}/s{i:06d}.bin"


class Tier:
    """Garage on loopback (scripts/garage.sh) and the rate-capping proxy in front of it."""

    def __init__(self, work: Path, rate: int) -> None:
        sh(str(ROOT / "scripts/garage.sh"), "install")
        # A free port can be taken by someone else before Garage binds it; garage.sh then fails
        # at once, and fresh ports and a fresh directory are tried (as the tests' Garage does).
        for attempt in range(3):
            self.dir = work / f"garage-{attempt}"
            port, rpc_port = free_ports(2)
            self.ports = (str(port), str(rpc_port))
            r = sh(
                str(ROOT / "scripts/garage.sh"), "start", str(self.dir), *self.ports, check=False
            )
            if r.returncode == 0:
                break
            log(f"# garage did not start on ports {port}/{rpc_port}, trying fresh ones: {r.stderr}")
        else:
            raise SystemExit(f"garage did not start in 3 tries; last: {r.stderr}")
        out = sh(str(ROOT / "scripts/garage.sh"), "env", str(self.dir)).stdout
        self.env = {}
        for line in out.splitlines():
            k, v = line.removeprefix("export ").split("=", 1)
            self.env[k] = v
        self.garage = f"127.0.0.1:{port}"
        self.bucket = self.env["METFS_S3_BUCKET"]
        self.stats = work / "proxy.json"
        self.proxy: subprocess.Popen | None = None
        self.start_proxy(rate)

    def start_proxy(self, rate: int) -> None:
        """Starts proxy.py in front of Garage, capped at `rate` bytes/s, and points `endpoint`
        (and AWS_ENDPOINT_URL) at it. A proxy already running is stopped first; the new one's
        count starts at zero and its port is new."""
        if self.proxy is not None:
            self.proxy.terminate()
            self.proxy.wait()
        self.proxy = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).with_name("proxy.py")),
                "--target",
                self.garage,
                "--rate",
                str(rate),
                "--stats",
                str(self.stats),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.proxy.stdout.readline()
        if not line.startswith("listening "):
            raise SystemExit("proxy.py did not start")
        self.rate = rate
        self.endpoint = f"http://127.0.0.1:{int(line.split()[1])}"
        # Clients that read AWS_ENDPOINT_URL go through the proxy too.
        self.env["AWS_ENDPOINT_URL"] = self.endpoint

    def down(self) -> int:
        for _ in range(20):
            try:
                return json.loads(self.stats.read_text())["down"]
            except (OSError, ValueError):
                time.sleep(0.01)
        raise RuntimeError(f"cannot read {self.stats}")

    def counted(self) -> int:
        """Bytes the tier delivered so far, once the proxy has written its latest count."""
        time.sleep(0.15)
        return self.down()

    def client(self, direct: bool = False, pool: int = THREADS * 2):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=f"http://{self.garage}" if direct else self.endpoint,
            region_name="garage",
            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"],
            config=Config(
                s3={"addressing_style": "path"},
                request_checksum_calculation="when_required",
                max_pool_connections=pool,
                retries={"max_attempts": 10},
            ),
        )

    def put_many(self, items) -> None:
        """Uploads (key, bytes) pairs straight to Garage (not through the proxy)."""
        local = threading.local()

        def put(kv):
            if not hasattr(local, "c"):
                local.c = self.client(direct=True)
            local.c.put_object(Bucket=self.bucket, Key=kv[0], Body=kv[1])

        with cf.ThreadPoolExecutor(8) as ex:
            for _ in ex.map(put, items):
                pass

    def reset(self) -> None:
        """Empties the server (the disk is small): restarted on its ports with its credentials,
        without its data; the default bucket is made again at start."""
        sh(str(ROOT / "scripts/garage.sh"), "stop", str(self.dir))
        shutil.rmtree(self.dir / "meta")
        shutil.rmtree(self.dir / "data")
        sh(str(ROOT / "scripts/garage.sh"), "start", str(self.dir), *self.ports)

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.terminate()
            self.proxy.wait()
        sh(str(ROOT / "scripts/garage.sh"), "stop", str(self.dir), check=False)


class Dataset:
    def __init__(self, name: str, n: int, size: int) -> None:
        self.name, self.n, self.size = name, n, size
        self.keys = [sample_key(i) for i in range(n)]

    @property
    def bytes(self) -> int:
        return self.n * self.size

    def upload(self, tier: Tier, shard_bytes: int, work: Path, with_mds: bool) -> None:
        t = time.time()
        tier.put_many(
            (f"{self.name}/files/{sample_key(i)}", sample_bytes(self.name, i, self.size))
            for i in range(self.n)
        )
        if with_mds:
            write_mds(
                tier,
                f"{self.name}/mds",
                {"data": "bytes"},
                ({"data": sample_bytes(self.name, i, self.size)} for i in range(self.n)),
                shard_bytes,
                work / f"mds-{self.name}",
            )
        log(
            f"dataset {self.name}: {self.n} x {self.size >> 10} KiB uploaded in {time.time() - t:.0f} s"
        )


def write_mds(
    tier: Tier,
    prefix: str,
    columns: dict[str, str],
    samples: Iterable[dict],
    shard_bytes: int,
    out: Path,
) -> None:
    """Writes `samples` as MosaicML Streaming's MDS shards of `shard_bytes` to
    s3://BUCKET/PREFIX. Shards go up straight to Garage (not through the proxy) as they are
    written, and are deleted locally (`out` is the local staging folder)."""
    from streaming import MDSWriter

    shutil.rmtree(out, ignore_errors=True)
    env = {k: v for k, v in tier.env.items() if k.startswith("AWS_")}
    env["S3_ENDPOINT_URL"] = f"http://{tier.garage}"
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with MDSWriter(
            out=(str(out), f"s3://{tier.bucket}/{prefix}"), columns=columns, size_limit=shard_bytes
        ) as w:
            for s in samples:
                w.write(s)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    shutil.rmtree(out, ignore_errors=True)


# ---------------------------------------------------------------------------- consumers


DEADLINE = [float("inf")]


def late() -> bool:
    """Whether the run's time box (--max-secs) is over: no new sample is started."""
    return time.perf_counter() > DEADLINE[0]


def read_files(paths: list[Path]) -> tuple[int, int]:
    """Reads `paths` with THREADS threads in READ-byte reads until done or late; returns the
    samples and bytes read."""
    it = iter(paths)
    lock = threading.Lock()
    total = [0, 0]

    def worker() -> None:
        n = k = 0
        while True:
            with lock:
                p = None if late() else next(it, None)
            if p is None:
                break
            k += 1
            fd = os.open(p, os.O_RDONLY)
            try:
                while True:
                    b = os.read(fd, READ)
                    if not b:
                        break
                    n += len(b)
            finally:
                os.close(fd)
        with lock:
            total[0] += k
            total[1] += n

    ts = [threading.Thread(target=worker) for _ in range(THREADS)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return total[0], total[1]


def epochs_of(ds: Dataset, count: int, seed: int):
    """The first `count` samples of a job reading every sample each epoch in a new order."""
    out: list[int] = []
    epoch = 0
    while len(out) < count:
        order = list(range(ds.n))
        random.Random(f"{seed}:{epoch}").shuffle(order)
        out.extend(order[: count - len(out)])
        epoch += 1
    return out


# ---------------------------------------------------------------------------- sides


class Run:
    def __init__(self) -> None:
        self.samples = 0
        self.bytes = 0
        self.note = ""


def side_metfs(
    cfg, tier: Tier, ds: Dataset, count: int, cache: Path, mnt: Path, block: bool
) -> Run:
    m = benchlib.Mount(
        f"s3://{tier.bucket}/{ds.name}/files",
        cache,
        mnt,
        metfs=cfg.metfs,
        env=dict(os.environ, **{k: v for k, v in tier.env.items() if k.startswith("AWS_")}),
        endpoint=tier.endpoint,
        region="garage",
        allow_http=True,
        budget=f"{cfg.cache_mib}MiB",
        rf=4,
        history=cache.parent / "rf-history.json",
    )
    r = m.mount(check=False, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"metfs mount failed: {r.stderr[-2000:]}")
    sock = m.socket
    run = Run()
    waits = passes = 0
    try:
        rng = random.Random(cfg.seed)
        while run.samples < count:
            files = benchlib.rpc_ok(sock, {"op": "files"})["files"]
            rng.shuffle(files)
            files = files[: count - run.samples]
            k, b = read_files([mnt / f for f in files])
            run.samples, run.bytes = run.samples + k, run.bytes + b
            if late():
                break
            passes += 1
            d = benchlib.rpc_ok(sock, {"op": "pass_end", "block": block})
            waits += d.get("decision") == "wait"
        st = benchlib.rpc_ok(sock, {"op": "status"})
        run.note = (
            f"{passes} passes, {waits} bonus, reused {st.get('reused_bytes', 0) / MIB:.0f} MiB"
        )
    finally:
        m.close()
    return run


def wait_mounted(mnt: Path, proc: subprocess.Popen | None, what: str) -> None:
    for _ in range(300):
        if is_mounted(mnt):
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(
                f"{what} exited: {proc.stderr.read()[-2000:] if proc.stderr else ''}"
            )
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not mount in 15 s")


def fuse_umount(mnt: Path) -> None:
    for cmd in (
        ["fusermount3", "-u", str(mnt)],
        ["fusermount", "-u", str(mnt)],
        ["umount", "-l", str(mnt)],
    ):
        if not is_mounted(mnt):
            return
        sh(*cmd, check=False)
        time.sleep(0.2)


def read_order(ds: Dataset, mnt: Path, count: int, seed: int) -> Run:
    run = Run()
    order = epochs_of(ds, count, seed)
    # One epoch at a time, so that a reader thread never runs far ahead of the others.
    for k in range(0, len(order), ds.n):
        part = order[k : k + ds.n]
        n, b = read_files([mnt / ds.keys[i] for i in part])
        run.samples, run.bytes = run.samples + n, run.bytes + b
        if late():
            break
    return run


@contextmanager
def rclone_mounted(
    tier: Tier, prefix: str, cache: Path, mnt: Path, cache_mib: int
) -> Iterator[None]:
    """s3://BUCKET/PREFIX mounted on `mnt` by rclone's VFS cache in `cache`, capped at
    `cache_mib`, for the body of the `with`."""
    # The tier is plain HTTP; a machine-wide AWS_CA_BUNDLE makes rclone's S3 client refuse to
    # start ("LoadCustomCABundleError"), so it is left out of rclone's environment.
    env = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}
    env.update(
        RCLONE_CONFIG_TIER_TYPE="s3",
        RCLONE_CONFIG_TIER_PROVIDER="Other",
        RCLONE_CONFIG_TIER_ENDPOINT=tier.endpoint,
        RCLONE_CONFIG_TIER_REGION="garage",
        RCLONE_CONFIG_TIER_ACCESS_KEY_ID=tier.env["AWS_ACCESS_KEY_ID"],
        RCLONE_CONFIG_TIER_SECRET_ACCESS_KEY=tier.env["AWS_SECRET_ACCESS_KEY"],
    )
    proc = subprocess.Popen(
        [
            "rclone",
            "mount",
            f"tier:{tier.bucket}/{prefix}",
            str(mnt),
            "--read-only",
            "--vfs-cache-mode",
            "full",
            "--vfs-cache-max-size",
            f"{cache_mib}M",
            "--vfs-cache-poll-interval",
            "1s",
            "--cache-dir",
            str(cache),
            "--dir-cache-time",
            "1h",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_mounted(mnt, proc, "rclone mount")
        yield
    finally:
        fuse_umount(mnt)
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def side_rclone(cfg, tier: Tier, ds: Dataset, count: int, cache: Path, mnt: Path) -> Run:
    with rclone_mounted(tier, f"{ds.name}/files", cache, mnt, cfg.cache_mib):
        return read_order(ds, mnt, count, cfg.seed)


@contextmanager
def s3fs_mounted(tier: Tier, prefix: str, cache: Path, mnt: Path, cache_mib: int) -> Iterator[None]:
    """s3://BUCKET/PREFIX mounted on `mnt` by s3fs with its cache on a tmpfs of `cache_mib`
    mounted on `cache`, for the body of the `with`."""
    # s3fs has no cap on its cache: it gets a file system of the budget's size, and keeps
    # ensure_diskfree MB free on it (evicting files not open).
    sh("mount", "-t", "tmpfs", "-o", f"size={cache_mib}m,mode=0700", "tmpfs", str(cache))
    pw = cache.parent / "s3fs.passwd"
    pw.write_text(f"{tier.env['AWS_ACCESS_KEY_ID']}:{tier.env['AWS_SECRET_ACCESS_KEY']}\n")
    pw.chmod(0o600)
    try:
        r = sh(
            "s3fs",
            f"{tier.bucket}:/{prefix}",
            str(mnt),
            "-o",
            f"url={tier.endpoint},use_path_request_style,endpoint=garage,passwd_file={pw},"
            f"use_cache={cache},ensure_diskfree=8,ro,stat_cache_expire=3600",
            check=False,
        )
        if r.returncode != 0:
            raise RuntimeError(f"s3fs failed: {r.stderr[-2000:]}")
        try:
            wait_mounted(mnt, None, "s3fs")
            yield
        finally:
            fuse_umount(mnt)
    finally:
        for _ in range(50):
            if sh("umount", str(cache), check=False).returncode == 0:
                break
            time.sleep(0.2)


def side_s3fs(cfg, tier: Tier, ds: Dataset, count: int, cache: Path, mnt: Path) -> Run:
    with s3fs_mounted(tier, f"{ds.name}/files", cache, mnt, cfg.cache_mib):
        return read_order(ds, mnt, count, cfg.seed)


#: The job's batch size where a peer's documentation asks for it (Streaming's `batch_size`,
#: its DataLoader's, the direct loader's batches).
BATCH = 64
#: Streaming's `predownload`, in samples per DataLoader worker: its docs (shard_retrieval.md,
#: "Downloading ahead"; performance_tuning.md: "increase the predownload parameter") leave the
#: default of 8 x batch_size unless more samples should be ready ahead; here, where the tier
#: is the bottleneck, 2,000 where their shards fit in the cache beside a shuffle block's.
STREAMING_PREDOWNLOAD = 2_000
#: Streaming's DataLoader workers: its docs' other knob against a slow download
#: (performance_tuning.md: "increase the number of workers for your dataloader"); one worker
#: process keeps the downloads and the sample decoding off the trainer's interpreter lock on a
#: 2-core machine.
STREAMING_WORKERS = 1


def streaming_settings(
    cache_mib: int, sample_bytes: int, shard_mib: int, n_samples: int, batch: int = BATCH
) -> dict:
    """MosaicML Streaming configured by its own documentation (docs/source in
    github.com/mosaicml/streaming: getting_started/faqs_and_tips.md, dataset_configuration/
    shuffling.md and shard_retrieval.md, distributed_training/performance_tuning.md):

    * `batch_size` the job's device batch size, the same as its DataLoader's (FAQ: "for
      optimal performance ... you must pass batch_size to StreamingDataset");
    * `shuffle_algo="py1e"` (the recommended default) with `shuffle_block_size` about a
      mini-epoch's samples (half the cache budget, as metfs sizes a slot): the default,
      max(4,000,000 / canonical nodes, 2^18) samples, makes a dataset of tens of thousands of
      samples one block whose every shard must stay resident;
    * `num_canonical_nodes=1` (one physical node), `predownload` STREAMING_PREDOWNLOAD,
      `cache_limit` the run's cache budget;
    * shards of `shard_mib` (4-8 MiB: many shards per block).

    Returns the StreamingDataset keyword arguments (`kwargs`), the DataLoader's (`loader`), the
    minimum cache the performance-tuning guide's formula gives for py1e (L = k S ceil(B/Q)
    ceil(C/P), k = 1, plus the predownloaded shards) and a one-line description."""
    shard = shard_mib * MIB
    per_shard = max(1, shard // sample_bytes)  # Q
    block = max(per_shard, min(n_samples, (cache_mib * MIB // 2) // sample_bytes))  # B
    shards_block = math.ceil(block / per_shard)
    # Ahead: STREAMING_PREDOWNLOAD where the shards it needs fit beside a block's, never fewer
    # than its default (8 x batch_size).
    room = (cache_mib * MIB - shard * shards_block) // shard * per_shard
    predownload = max(8 * batch, min(STREAMING_PREDOWNLOAD, n_samples, room))
    shards_ahead = math.ceil(predownload / per_shard)
    need = shard * shards_block  # L for py1e, one canonical node, one physical node
    need_ahead = shard * (shards_block + shards_ahead)
    kwargs = {
        "cache_limit": f"{cache_mib}mb",
        "shuffle": True,
        "shuffle_algo": "py1e",
        "shuffle_block_size": block,
        "batch_size": batch,
        "predownload": predownload,
        "num_canonical_nodes": 1,
    }
    loader = {"batch_size": batch, "num_workers": STREAMING_WORKERS}
    desc = (
        "MosaicML Streaming by its docs (FAQ, shuffling, shard retrieval, performance tuning): "
        f"StreamingDataset(remote=s3://..., local=DIR, cache_limit={cache_mib}mb, shuffle=True, "
        f"shuffle_algo=py1e, shuffle_block_size={block} (a mini-epoch: half the cache), "
        f"batch_size={batch}, predownload={predownload}, num_canonical_nodes=1) over MDS shards "
        f"of {shard_mib} MiB ({per_shard} samples each), iterated by "
        f"StreamingDataLoader(batch_size={batch}, num_workers={STREAMING_WORKERS}, "
        f"persistent_workers=True); cache its tuning guide's py1e formula needs: "
        f"S ceil(B/Q) = {shard_mib} MiB x {shards_block} = {need / MIB:.0f} MiB, "
        f"{need_ahead / MIB:.0f} MiB with the predownloaded shards, against cache_limit "
        f"{cache_mib} MiB ({'fits' if need_ahead <= cache_mib * MIB else 'DOES NOT FIT'})"
    )
    return {
        "kwargs": kwargs,
        "loader": loader,
        "need": need,
        "need_ahead": need_ahead,
        "fits": need_ahead <= cache_mib * MIB,
        "desc": desc,
    }


def streaming_dataset(remote: str, cache: str, settings: dict, seed: int):
    """Streaming's side as its documentation configures it (`streaming_settings`): a shuffled
    StreamingDataset over the MDS shards at `remote`, its cache in `cache` (the S3 endpoint,
    credentials and S3_ENDPOINT_URL come from the environment)."""
    from streaming import StreamingDataset

    return StreamingDataset(remote=remote, local=cache, shuffle_seed=seed, **settings["kwargs"])


def streaming_loader(sds, settings: dict):
    """The StreamingDataLoader its docs pair with the dataset (the same batch size; workers
    persistent between epochs, as its FAQ asks)."""
    from streaming import StreamingDataLoader

    w = settings["loader"]["num_workers"]
    return StreamingDataLoader(
        sds,
        batch_size=settings["loader"]["batch_size"],
        num_workers=w,
        persistent_workers=w > 0,
        prefetch_factor=4 if w > 0 else None,
        # Linux's default, which a job started as a program gets (the benchmarks run it in
        # processes started by spawn or a forkserver, whose children would start workers so).
        multiprocessing_context="fork" if w > 0 else None,
    )


def streaming_child(
    q, env: dict, remote: str, cache: str, settings: dict, seed: int, count: int, budget_s: float
) -> None:
    """Streaming's side, in a process of its own: its download threads outlive the iterator and
    would keep reading the tier during the next side's run; ending the process ends them. Its
    own process group, so that its DataLoader's worker processes end with it."""
    os.setpgrp()
    os.environ.update(env)
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    t0 = time.perf_counter()
    loader = streaming_loader(streaming_dataset(remote, cache, settings, seed), settings)
    samples = nbytes = 0
    while samples < count and time.perf_counter() - t0 < budget_s:
        for b in loader:
            nbytes += sum(len(x) for x in b["data"])
            samples += len(b["data"])
            if samples >= count or time.perf_counter() - t0 >= budget_s:
                break
    q.put((samples, nbytes))
    # The queue's feeder thread writes the result; it must be through before the exit, which
    # does not wait for Streaming's own threads.
    q.close()
    q.join_thread()
    sys.stdout.flush()
    os._exit(0)


def side_streaming(cfg, tier: Tier, ds: Dataset, count: int, cache: Path, mnt: Path) -> Run:
    import multiprocessing as mp

    env = {k: v for k, v in tier.env.items() if k.startswith("AWS_")}
    env["S3_ENDPOINT_URL"] = tier.endpoint
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    left = DEADLINE[0] - time.perf_counter()
    settings = streaming_settings(cfg.cache_mib, ds.size, cfg.shard_mib, ds.n)
    p = ctx.Process(
        target=streaming_child,
        args=(
            q,
            env,
            f"s3://{tier.bucket}/{ds.name}/mds",
            str(cache),
            settings,
            cfg.seed,
            count,
            left,
        ),
    )
    p.start()
    try:
        samples, nbytes = q.get(timeout=left + 120)
    finally:
        # The child and its DataLoader's workers (its process group, which it made first).
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
            p.join(10)
            if not p.is_alive():
                break
        p.terminate()
        p.join(10)
        if p.is_alive():
            p.kill()
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
    run = Run()
    run.samples, run.bytes = samples, nbytes
    return run


#: The direct peer's loader: worker processes, each with threads sharing one boto3 client.
#: boto3's own guidance for many requests is threads over one client; a PyTorch job's is
#: DataLoader worker processes, so that the requests' Python work does not take turns with the
#: trainer under one interpreter lock (16 threads in the trainer's process read about 45 % of
#: the cap on the 2-core machine, and slowed its steps 5x).
DIRECT_WORKERS = 4
DIRECT_THREADS = 8


class DirectGets:
    """The direct peer's dataset as boto3 and PyTorch users write it: a map-style dataset
    whose sample i is one GET of `keys[i]` under `prefix`; `__getitems__` (what a PyTorch
    DataLoader's worker calls for a batch) fetches a batch's samples with DIRECT_THREADS threads
    over one client. The client and threads are made in the process that uses them (after a
    DataLoader's or a pool's fork)."""

    def __init__(self, tier, prefix: str, keys: list[str]) -> None:
        self.tier, self.prefix, self.keys = tier, prefix, keys
        self._pid: int | None = None
        # boto3 imported and its S3 model loaded here, once: the worker processes forked
        # after this inherit both instead of each spending a second of CPU on them.
        Tier.client(tier)

    def __len__(self) -> int:
        return len(self.keys)

    def _setup(self) -> None:
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._client = Tier.client(self.tier, pool=DIRECT_THREADS * 2)
            self._threads = cf.ThreadPoolExecutor(DIRECT_THREADS)

    def get(self, i: int) -> bytes:
        key = f"{self.prefix}/{self.keys[i]}"
        return self._client.get_object(Bucket=self.tier.bucket, Key=key)["Body"].read()

    def __getitem__(self, i: int) -> bytes:
        self._setup()
        return self.get(i)

    def __getitems__(self, idx: list[int]) -> list[bytes]:
        self._setup()
        return list(self._threads.map(self.get, idx))


DIRECT_DESC = (
    f"boto3 get_object of every sample every epoch (one client per process, "
    f"max_pool_connections {DIRECT_THREADS * 2}), a batch's samples fetched by {DIRECT_THREADS} "
    f"threads in each of {DIRECT_WORKERS} loader worker processes ({DIRECT_WORKERS * DIRECT_THREADS}"
    f" requests in flight at most), as boto3's guide (threads sharing a client) and PyTorch's "
    f"(DataLoader worker processes) have it"
)

_DIRECT: list[DirectGets] = []


def direct_batch(idx: list[int]) -> tuple[int, int]:
    """One batch of the direct side in a pool worker; nothing once the time box is over."""
    if late():
        return 0, 0
    bodies = _DIRECT[0].__getitems__(idx)
    return len(bodies), sum(len(b) for b in bodies)


def side_direct(cfg, tier: Tier, ds: Dataset, count: int, cache: Path, mnt: Path) -> Run:
    import multiprocessing as mp

    run = Run()
    order = epochs_of(ds, count, cfg.seed)
    _DIRECT[:] = [DirectGets(tier, f"{ds.name}/files", ds.keys)]
    batches = [order[k : k + BATCH] for k in range(0, len(order), BATCH)]
    with mp.get_context("fork").Pool(DIRECT_WORKERS) as pool:
        for k, n in pool.imap(direct_batch, batches):
            run.samples, run.bytes = run.samples + k, run.bytes + n
    return run


def tier_holds(tier: Tier, prefix: str, keys: list[str], size: int, secs: float = 4.0) -> float:
    """The fraction of its cap the tier (Garage behind proxy.py) delivers on this machine to
    DIRECT_WORKERS x DIRECT_THREADS GETs in flight of the objects `keys` under `prefix` (each
    `size` bytes), over `secs`: below about 0.9 the machine, not the cap, limits every side."""
    import multiprocessing as mp

    n = max(1, int(2 * tier.rate * secs / size))
    rng = random.Random(0)
    order = [rng.randrange(len(keys)) for _ in range(n)]
    _DIRECT[:] = [DirectGets(tier, prefix, keys)]
    with mp.get_context("fork").Pool(DIRECT_WORKERS) as pool:
        # Each worker's client and threads are made before the clock starts.
        pool.map(direct_batch, [[0]] * DIRECT_WORKERS, chunksize=1)
        before = tier.counted()
        t0 = time.perf_counter()
        # The workers were forked before the clock started, so the time box is kept here: past
        # it, what was delivered is counted and the pool (leaving the block) stops the rest.
        for _ in pool.imap(direct_batch, [order[k : k + BATCH] for k in range(0, n, BATCH)]):
            if time.perf_counter() - t0 > secs:
                break
        t = time.perf_counter() - t0
        delivered = tier.counted() - before
    return delivered / t / tier.rate


def check_cap(
    tier: Tier, prefix: str, keys: list[str], size: int, allow: bool, secs: float = 4.0
) -> tuple[str, float]:
    """Stops (SystemExit) when the tier cannot hold its cap on this machine, unless `allow`;
    returns the line that says what it delivered, and the fraction of the cap."""
    f = tier_holds(tier, prefix, keys, size, secs)
    line = (
        f"tier check: Garage behind proxy.py delivered {f * tier.rate / MIB:.1f} MiB/s of the "
        f"{tier.rate / MIB:.1f} MiB/s cap ({100 * f:.0f} %) to {DIRECT_WORKERS * DIRECT_THREADS} "
        f"GETs in flight"
    )
    log(line)
    if f < 0.9:
        line += ": the cap cannot be held on this machine (every side is limited below it)"
        if not allow:
            raise SystemExit(
                f"{line}. Lower the cap (--rate-mib), free the machine, or pass --allow-slow-tier"
            )
    return line, f


def describe(tool: str, cfg, ds: Dataset | None = None) -> str:
    """How `tool` is configured, and per whose documentation."""
    if tool in ("metfs", "metfs-block"):
        return (
            f"metfs mount --source s3://BUCKET/PREFIX --budget {cfg.cache_mib}MiB --rf 4 "
            f"(fixed rf, default policy); pass_end "
            + ("block=true: the job waits for staging" if tool == "metfs-block" else "non-blocking")
        )
    if tool == "rclone":
        return (
            f"rclone mount --read-only --vfs-cache-mode full --vfs-cache-max-size "
            f"{cfg.cache_mib}M --vfs-cache-poll-interval 1s --dir-cache-time 1h (rclone mount's "
            "docs: full VFS caching for random reads; a poll interval of 1 s instead of 1 min "
            "keeps the cache within its size in a short run)"
        )
    if tool == "s3fs":
        return (
            f"s3fs -o use_cache=DIR,ensure_diskfree=8,ro,stat_cache_expire=3600, DIR a tmpfs of "
            f"{cfg.cache_mib} MiB (s3fs's man page: use_cache is its local cache; it has no size "
            "cap, only ensure_diskfree)"
        )
    if tool == "streaming":
        n = ds.n if ds else 0
        size = ds.size if ds else cfg.sample_kib << 10
        return streaming_settings(cfg.cache_mib, size, cfg.shard_mib, n)["desc"]
    if tool == "direct":
        return DIRECT_DESC
    return tool


SIDES = {
    "metfs": lambda *a: side_metfs(*a, block=False),
    "metfs-block": lambda *a: side_metfs(*a, block=True),
    "rclone": side_rclone,
    "s3fs": side_s3fs,
    "streaming": side_streaming,
    "direct": side_direct,
}


def available(tool: str, cfg) -> str | None:
    """None when `tool` can run, else why not (after trying to install it)."""

    def apt(pkg: str) -> None:
        if shutil.which(pkg) is None and not cfg.no_install:
            log(f"installing {pkg} (apt-get)")
            sh(
                "apt-get",
                "install",
                "-y",
                "-q",
                pkg,
                check=False,
                env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"),
                timeout=900,
            )

    if tool in ("rclone", "s3fs"):
        apt(tool)
        if shutil.which(tool):
            return None
        return f"{tool} is not installed" + (
            " (--no-install)" if cfg.no_install else " (apt-get install failed)"
        )
    if tool == "streaming":
        try:
            import streaming  # noqa: F401
        except ImportError:
            if not cfg.no_install:
                log("installing mosaicml-streaming (pip)")
                sh(
                    sys.executable,
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "mosaicml-streaming",
                    check=False,
                    timeout=900,
                )
            # A package pip installed while this interpreter runs is found only once the
            # import system's cached directory listings are dropped.
            importlib.invalidate_caches()
            try:
                import streaming  # noqa: F401,F811
            except ImportError:
                return "mosaicml-streaming is not installed" + (
                    " (--no-install)" if cfg.no_install else " (pip install failed)"
                )
    if tool.startswith("metfs") and not os.access(cfg.metfs, os.X_OK):
        return f"no metfs binary at {cfg.metfs}"
    return None


def one(cfg, tier: Tier, ds: Dataset, tool: str, count: int, rep: int) -> dict:
    base = cfg.work / f"run-{tool}"
    shutil.rmtree(base, ignore_errors=True)
    cache, mnt = base / "cache", base / "mnt"
    cache.mkdir(parents=True)
    mnt.mkdir()
    drop_caches()
    peak = Peak(None if tool == "direct" else cache)
    peak.start()
    before = tier.counted()
    t0 = time.perf_counter()
    DEADLINE[0] = t0 + cfg.max_secs
    try:
        run = SIDES[tool](cfg, tier, ds, count, cache, mnt)
        secs = time.perf_counter() - t0
        error = None
    except Exception as e:  # a side that fails is reported, not fatal to the others
        # (queue.Empty and others say nothing in str(): the type names them.)
        run, secs, error = Run(), time.perf_counter() - t0, (str(e) or repr(e))[-300:]
    tier_bytes = tier.counted() - before
    cache_peak = peak.stop()
    shutil.rmtree(base, ignore_errors=True)
    row = {
        "case": ds.name,
        "tool": tool,
        "rep": rep,
        "secs": secs,
        "samples": run.samples,
        "bytes": run.bytes,
        "tier_bytes": tier_bytes,
        "peak_cache": cache_peak,
        "note": run.note,
        "dataset_bytes": ds.bytes,
        "error": error,
    }
    if error is None and run.samples < count:
        if secs >= cfg.max_secs and run.samples > 0:
            row["note"] = (row["note"] + "; " if row["note"] else "") + (
                f"time box: {run.samples} of {count} samples in {cfg.max_secs:g} s"
            )
        else:
            row["error"] = f"only {run.samples} of {count} samples"
    if error is None and run.bytes != run.samples * ds.size:
        row["error"] = f"read {run.bytes} bytes for {run.samples} samples of {ds.size}"
    log(
        f"{ds.name} {tool} rep {rep}: {run.samples / secs if secs else 0:.0f} samples/s, "
        f"tier/consumed {tier_bytes / max(run.bytes, 1):.3f}, peak cache {cache_peak / MIB:.0f} MiB"
        f"{' ' + run.note if run.note else ''}{' ERROR ' + row['error'] if row['error'] else ''}"
    )
    return row


def table(rows: list[dict], ds: Dataset, cfg, consume: float) -> str:
    ok = [r for r in rows if r["case"] == ds.name and not r["error"]]
    med = {}
    for tool in cfg.tools:
        rs = [r for r in ok if r["tool"] == tool]
        if rs:
            med[tool] = {
                "sps": statistics.median(r["samples"] / r["secs"] for r in rs),
                "tier": statistics.median(r["tier_bytes"] / r["bytes"] for r in rs),
                "cap": statistics.median(r["tier_bytes"] / r["secs"] / cfg.rate for r in rs),
                "peak": statistics.median(r["peak_cache"] for r in rs),
                "n": len(rs),
                "runs": " ".join(f"{r['samples'] / r['secs']:.0f}" for r in rs),
                "note": rs[-1]["note"],
            }
    ratio = ds.bytes / (cfg.cache_mib * MIB)
    out = [
        f"\n### dataset {ds.bytes / MIB:.0f} MiB ({ratio:g}x the {cfg.cache_mib} MiB cache), "
        f"{ds.n} samples of {ds.size >> 10} KiB, {consume:g} dataset-equivalents consumed per run\n",
        "| side | samples/s (median) | vs metfs | tier bytes / consumed byte | tier read / cap | peak cache on disk | runs (samples/s) |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    m = med.get("metfs", {}).get("sps")
    for tool in cfg.tools:
        if tool not in med:
            errs = [
                r["error"]
                for r in rows
                if r["case"] == ds.name and r["tool"] == tool and r["error"]
            ]
            out.append(f"| {tool} | n/a | | | | | {errs[0] if errs else 'not run'} |")
            continue
        x = med[tool]
        vs = f"{x['sps'] / m:.2f}x" if m else "n/a"
        out.append(
            f"| {tool} | {x['sps']:,.0f} | {vs} | {x['tier']:.3f} | {100 * x['cap']:.0f} % | "
            f"{x['peak'] / MIB:.0f} MiB | {x['runs']} |"
        )
    for tool, why in cfg.skipped.items():
        out.append(f"| {tool} | skipped | | | | | {why} (--allow-missing) |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help="small datasets (64 MiB cache, tier at 200 MiB/s), 1 repetition: proves the harness works",
    )
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cases", default="0.5,2,8", help="dataset sizes as multiples of the cache")
    ap.add_argument("--tools", default=",".join(ALL_TOOLS))
    ap.add_argument("--cache-mib", type=int, default=256)
    ap.add_argument("--rate-mib", type=float, default=40)
    ap.add_argument("--sample-kib", type=int, default=256)
    ap.add_argument(
        "--shard-mib",
        type=int,
        default=4,
        help="MDS shard size for Streaming (4-8 MiB: many shards per shuffle block)",
    )
    ap.add_argument(
        "--consume",
        default="0.5:8,2:4,8:1",
        help="dataset-equivalents consumed per run, per case (CASE:N,...)",
    )
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--max-secs",
        type=float,
        default=60,
        help="time box of one run: a side still reading then stops, and its rates count what it read",
    )
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--no-install", action="store_true", help="do not install missing peers")
    ap.add_argument(
        "--allow-missing",
        action="store_true",
        help="a peer that cannot run is skipped and said so in the table (default: stop)",
    )
    ap.add_argument(
        "--allow-slow-tier",
        action="store_true",
        help="go on when the tier cannot hold its cap on this machine (default: stop)",
    )
    ap.add_argument("--json", type=Path, help="write every run's numbers here")
    cfg = ap.parse_args()
    if cfg.quick:
        # s3fs needs its cache file system to hold ensure_diskfree plus 5 parallel 10 MB parts.
        cfg.reps, cfg.cache_mib, cfg.sample_kib, cfg.shard_mib = 1, 64, 128, 4
        cfg.cases, cfg.consume, cfg.rate_mib = "0.5,2", "0.5:1,2:0.5", 200
        cfg.allow_slow_tier = True
    if os.geteuid() != 0:
        raise SystemExit("run.py: needs root (FUSE mounts, a tmpfs for s3fs, dropping caches)")
    cfg.tools = [t for t in cfg.tools.split(",") if t]
    for t in cfg.tools:
        if t not in SIDES:
            raise SystemExit(f"run.py: --tools: unknown side `{t}` (known: {', '.join(ALL_TOOLS)})")
    benchlib.build()
    cfg.metfs = str(benchlib.metfs_bin())
    skipped = {}
    for t in list(cfg.tools):
        why = available(t, cfg)
        if why:
            if not cfg.allow_missing:
                raise SystemExit(f"run.py: side {t} cannot run: {why} (--allow-missing skips it)")
            skipped[t] = why
            cfg.tools.remove(t)
            log(f"skipping {t}: {why}")
    cfg.skipped = skipped
    cfg.rate = cfg.rate_mib * MIB
    consume = {float(k): float(v) for k, v in (p.split(":") for p in cfg.consume.split(","))}
    cases = [float(c) for c in cfg.cases.split(",")]
    cfg.work = Path(os.environ.get("PEERS_WORK") or tempfile.mkdtemp(prefix="metfs-peers."))
    cfg.work.mkdir(parents=True, exist_ok=True)
    tier = Tier(cfg.work, int(cfg.rate_mib * MIB))
    rows: list[dict] = []
    out = []
    checked = ""
    try:
        for ci, c in enumerate(cases):
            if ci:
                tier.reset()
            n = int(c * cfg.cache_mib * MIB) // (cfg.sample_kib << 10)
            ds = Dataset(f"x{c:g}", n, cfg.sample_kib << 10)
            ds.upload(tier, cfg.shard_mib * MIB, cfg.work, "streaming" in cfg.tools)
            if ci == 0:
                checked, _ = check_cap(
                    tier,
                    f"{ds.name}/files",
                    ds.keys,
                    ds.size,
                    cfg.allow_slow_tier,
                    secs=1.5 if cfg.quick else 4.0,
                )
            count = int(consume.get(c, 2) * n)
            for rep in range(cfg.reps):
                k = rep % len(cfg.tools)
                for tool in cfg.tools[k:] + cfg.tools[:k]:
                    rows.append(one(cfg, tier, ds, tool, count, rep))
            out.append(table(rows, ds, cfg, consume.get(c, 2)))
            if "streaming" in cfg.tools:
                out.append(f"\nstreaming at {ds.name}: {describe('streaming', cfg, ds)}")
            print(out[-1] if "streaming" not in cfg.tools else "\n".join(out[-2:]), flush=True)
    finally:
        tier.stop()
        if cfg.json:
            cfg.json.write_text(json.dumps({"rows": rows, "skipped": skipped}, indent=1))
        if not cfg.keep:
            shutil.rmtree(cfg.work, ignore_errors=True)
    print(
        f"\nTier: Garage behind proxy.py at {cfg.rate_mib:g} MiB/s; cache {cfg.cache_mib} MiB for every side; "
        f"{cfg.reps} repetition(s), medians; consumer {THREADS} threads x {READ >> 10} KiB reads."
    )
    print(checked)
    print("Configuration of each side (streaming's per case above):")
    for t in cfg.tools:
        if t != "streaming":
            print(f"* {t}: {describe(t, cfg)}")
    for t, why in skipped.items():
        print(f"Skipped {t}: {why}")
    notes = sorted({(r["case"], r["tool"], r["note"]) for r in rows if "time box" in r["note"]})
    for case, tool, note in notes:
        print(f"{case} {tool}: {note}")
    sys.stdout.flush()
    # Streaming leaves worker threads behind that would keep the interpreter alive.
    os._exit(0)


if __name__ == "__main__":
    main()
