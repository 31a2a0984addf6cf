#!/usr/bin/env python3
"""Core benchmarks of metfs, each side by side with its baseline in one run.

    python3 benches/core_bench.py read     # mount vs native reads of the slot's files, per read path,
                                           # and direct reads of the slot under a lease
    python3 benches/core_bench.py stage    # staging a mini-epoch vs `cp -r` and 8 parallel `cp`
    python3 benches/core_bench.py switch   # view switch latency, 20,000-file mini-epoch
    python3 benches/core_bench.py all
    python3 benches/core_bench.py --quick [WHAT]   # every row at a tiny size, once (seconds)

Runs are interleaved (baseline, metfs, baseline, metfs, ...) so that machine noise hits both
sides alike, and medians are reported with the ratio metfs / baseline. "Cold" runs drop the page
cache (`/proc/sys/vm/drop_caches`, root) before every run; "warm" runs read data just read, 10
times over in one process (a job re-reads its mini-epoch; one pass over 256 MiB in memory is
too short to time), every side warmed anew in each repetition. Native reads a copy of the
slot's files of its own.
Readers use 4 threads and 128 KiB buffers (`metfs/examples/readbench.rs`, the same binary on both
sides). Needs root (FUSE mount, drop_caches). Work directory: $METFS_BENCH_DIR or /tmp/metfs-bench.

    METFS_BENCH_USER=metfs-user python3 benches/core_bench.py read
    METFS_BENCH_TARGET=/old/target/release python3 benches/core_bench.py switch

`METFS_BIN` picks the binary (and `examples/readbench` beside it) without a build; else the
release build.

runs the daemons and both sides' readers as that ordinary user (`runuser`), as on a node where
users are not root: passthrough is refused, so its column shows the path the user gets. Only
the page cache drops stay with root. The user needs read and write access to /dev/fuse (see
scripts/test.sh) and to the work directory, which is then handed to them. With a user, `read`
also measures a mount the root node service makes for them (`metfs mount --run-as USER`, as
deploy/slurm/prolog.sh does): passthrough, which their own daemon is refused.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import random
import shutil
import socket
import subprocess
import time
from pathlib import Path

import benchlib
from benchlib import med, rpc

WORK = Path(os.environ.get("METFS_BENCH_DIR", "/tmp/metfs-bench"))
REPS = int(os.environ.get("METFS_BENCH_REPS", "5"))
# `--quick`: every row at a tiny size, once (set by `main`).
QUICK = False
# Another build's release directory (for example an older commit's, to compare before/after a
# change); the benchmark then uses its binaries as they are instead of building.
TARGET = Path(os.environ["METFS_BENCH_TARGET"]) if os.environ.get("METFS_BENCH_TARGET") else None
METFS = (TARGET or benchlib.bin_dir()) / "metfs"
READER = (TARGET or benchlib.bin_dir()) / "examples" / "readbench"
# Ordinary user the daemons and readers run as (empty: this process's user).
USER = os.environ.get("METFS_BENCH_USER", "")
AS_USER = ["runuser", "-u", USER, "--"] if USER else []


def hand_over(path: Path) -> None:
    """Gives `path` (recursively) to the benchmark's ordinary user, if any."""
    if USER:
        subprocess.run(["chown", "-R", USER, str(path)], check=True)


def sh(*cmd: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)


def make_files(root: Path, count: int, size: int, per_dir: int = 1000) -> None:
    if root.exists() and len(list(root.rglob("*.bin"))) == count:
        return
    shutil.rmtree(root, ignore_errors=True)
    rng = random.Random(1)
    block = rng.randbytes(1 << 20)
    for i in range(count):
        d = root / f"d{i // per_dir:03d}"
        d.mkdir(parents=True, exist_ok=True)
        with open(d / f"f{i:06d}.bin", "wb") as f:
            left = size
            off = (i * 4099) % (1 << 19)
            while left > 0:
                n = min(left, len(block) - off)
                f.write(block[off : off + n])
                left -= n
                off = 0


def bench_mount(
    name: str, source: Path, budget: str, *extra: str, service: bool = False
) -> benchlib.Mount:
    """A mount of `source` under WORK by the benchmark's user, from an empty cache when entered
    (`with`): returns once the first mini-epoch is staged and the mount is live. `service`:
    started by root with `--run-as` the user, as the node service's Prolog does
    (deploy/slurm/prolog.sh), instead of by the user."""
    cache = WORK / f"cache-{name}"
    return benchlib.Mount(
        source,
        cache,
        WORK / f"mnt-{name}",
        metfs=METFS,
        user="" if service else USER,
        owner=USER,
        fresh=True,
        run_as=USER if service else None,
        budget=budget,
        # The rf history goes beside the cache, not into the user's.
        history=cache.parent / f"{cache.name}-rf-history.json",
        args=extra,
    )


def settle(m: benchlib.Mount) -> None:
    """Waits until the successor is staged, so that background staging does not compete with
    what is measured."""
    m.wait_next_ready(timeout=None)
    os.sync()


def read(path: Path, passes: int = 1) -> dict:
    return json.loads(
        sh(
            *AS_USER,
            str(READER),
            str(path),
            "--threads",
            "4",
            "--buf",
            "131072",
            "--passes",
            str(passes),
        ).stdout
    )


# Warm runs read the files this many times in one process (as a job re-reads a mini-epoch), so
# that a run lasts long enough to time: one pass over 256 MiB in the page cache takes ~16 ms.
WARM_PASSES = 10


READ_PATHS = ("cached", "passthrough", "pread")


@contextlib.contextmanager
def direct_lease(m: benchlib.Mount):
    """The slot directory of `m`'s view from `files` with `direct`, with the lease held (the
    connection kept open) until the block ends: what `MetDataset(..., direct=True)` reads."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(600)
        s.connect(m.socket)
        s.sendall(b'{"op": "files", "direct": true, "form": "packed"}\n')
        buf = b""
        while b"\n" not in buf:
            c = s.recv(1 << 20)
            if not c:
                raise ConnectionError("the daemon closed the connection")
            buf += c
        r = json.loads(buf.split(b"\n", 1)[0])
        assert r["ok"], r
        yield Path(r["direct_root"])


def bench_read() -> list[str]:
    """Every read path mounted at once over the same files, each settled (successor staged);
    each repetition reads natively and through every path, in a rotating order, so that
    machine noise hits all sides alike."""
    rows = []
    sets = [
        ("4 MiB files", WORK / "src-4m", 64, 4 << 20),
        ("128 KiB files", WORK / "src-128k", 2048, 128 << 10),
    ]
    if QUICK:
        sets = [
            ("1 MiB files", WORK / "src-1m", 8, 1 << 20),
            ("16 KiB files", WORK / "src-16k", 64, 16 << 10),
        ]
    for label, src, count, size in sets:
        make_files(src, count, size)
        budget = f"{(2 * count * size + (64 << 20)) >> 20}MiB"
        with bench_mount("read-auto", src, budget, "--mini-epochs", "1") as m:
            auto = m.status()["read_path"]
        with contextlib.ExitStack() as stack:
            mounts = {}
            for path in READ_PATHS:
                m = stack.enter_context(
                    bench_mount(
                        f"read-{path}", src, budget, "--mini-epochs", "1", "--read-path", path
                    )
                )
                settle(m)
                mounts[path] = m
            # Direct reads get a mount of their own, which nothing reads through, so that no
            # read path's page handling (the cached path drops its slot's pages) touches them.
            d = stack.enter_context(bench_mount("read-direct", src, budget, "--mini-epochs", "1"))
            settle(d)
            direct_root = stack.enter_context(direct_lease(d))
            # An ordinary user's mount by the root node service, with the default read path:
            # what `auto` picks with passthrough allowed (passthrough for large samples, the
            # cached path for small ones), which the user's own daemon cannot have.
            if USER:
                svc = stack.enter_context(
                    bench_mount(
                        "read-service",
                        src,
                        budget,
                        "--mini-epochs",
                        "1",
                        "--allow-other",
                        service=True,
                    )
                )
                settle(svc)
            # The native side reads a copy of the slot, not a mount's own slot files: the cached
            # path drops its slot files' pages after a pass, which would make native's warm
            # reads partly cold, and sharing pages with one mount would favour that mount.
            slot = WORK / f"native-{src.name}"
            shutil.rmtree(slot, ignore_errors=True)
            subprocess.run(["cp", "-a", str(mounts["cached"].slot_dir()), str(slot)], check=True)
            hand_over(slot)
            os.sync()
            used = {p: m.status()["read_path"] for p, m in mounts.items()}
            key = "bytes_per_s" if size >= (1 << 20) else "files_per_s"
            unit, scale = ("MiB/s", 1 << 20) if key == "bytes_per_s" else ("files/s", 1)
            for cache in ("cold", "warm"):
                res = {"native": [], "direct": [], "service": []} | {p: [] for p in READ_PATHS}
                sides = [("native", slot), ("direct", direct_root)] + [
                    (p, m.mountpoint) for p, m in mounts.items()
                ]
                if USER:
                    sides.append(("service", svc.mountpoint))
                for rep in range(REPS):
                    order = sides[rep % len(sides) :] + sides[: rep % len(sides)]
                    if cache == "warm":
                        # Each repetition warms every side anew, by a read after a drop. How
                        # fast the same files read from memory depends on how their pages came
                        # in (a copy's writes, staging, a read, and when): the same read path
                        # mounted twice read warm at 0.71x and 1.03x of native, each steady
                        # over 15 repetitions of one warming. Warming per repetition makes that
                        # a spread the median sees instead of a bias it keeps.
                        benchlib.drop_caches(strict=True)
                        for _, path in order:
                            read(path)
                    for side, path in order:
                        passes = 1
                        if cache == "cold":
                            benchlib.drop_caches(strict=True)
                        else:
                            passes = WARM_PASSES
                        r = read(path, passes)
                        assert r["files"] == count * passes, r
                        res[side].append(r[key])
                n = med(res["native"]) / scale
                x = med(res["direct"]) / scale
                rows.append(
                    f"| read {label}, {cache} | direct (slot files under a lease) | {n:,.0f} {unit} | {x:,.0f} {unit} | {x / n:.2f}x |"
                )
                print(rows[-1], flush=True)
                if USER:
                    x = med(res["service"]) / scale
                    rows.append(
                        f"| read {label}, {cache} | the root node service's mount (--run-as; auto: "
                        f"{svc.status()['read_path']}) | "
                        f"{n:,.0f} {unit} | {x:,.0f} {unit} | {x / n:.2f}x |"
                    )
                    print(rows[-1], flush=True)
                for p in READ_PATHS:
                    x = med(res[p]) / scale
                    # Asked again now: a path the kernel refused (passthrough for an ordinary
                    # user) has fallen back by the first read.
                    used[p] = mounts[p].status()["read_path"]
                    name = (used[p] if used[p] == p else f"{p} -> {used[p]}") + (
                        " (auto)" if p == auto else ""
                    )
                    rows.append(
                        f"| read {label}, {cache} | {name} | {n:,.0f} {unit} | {x:,.0f} {unit} | {x / n:.2f}x |"
                    )
                    print(rows[-1], flush=True)
            shutil.rmtree(slot, ignore_errors=True)
    return rows


def cold_data() -> None:
    """Drops the page cache, then loads every tool's binary again: staging a mini-epoch is what
    is measured, not paging in an 18 MB binary (the daemon stages every later mini-epoch
    in-process) or cp's 150 KB one, so only the data starts cold."""
    benchlib.drop_caches(strict=True)
    for cmd in (
        [str(METFS), "--version"],
        ["cp", "--version"],
        ["sh", "-c", "true"],
        ["xargs", "--version"],
    ):
        subprocess.run(cmd, capture_output=True)


def prep_cp(dst: Path) -> None:
    shutil.rmtree(dst, ignore_errors=True)


def prep_cp8(dst: Path, files: list[str]) -> None:
    shutil.rmtree(dst, ignore_errors=True)
    for d in {str(Path(f).parent) for f in files}:
        (dst / d).mkdir(parents=True, exist_ok=True)


def run_cp(src: Path, dst: Path) -> None:
    sh("cp", "-r", str(src), str(dst))
    os.sync()


def prep_fio(dst: Path) -> None:
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)


def run_fio(dst: Path, count: int, size: int) -> None:
    """What the cache's disk sustains for the same layout: fio writes `count` files of `size`
    bytes one after another in 1 MiB writes, and fsyncs at the end."""
    sh(
        "fio",
        "--name=seqwrite",
        f"--directory={dst}",
        "--rw=write",
        "--bs=1M",
        f"--nrfiles={count}",
        f"--filesize={size}",
        f"--size={count * size}",
        "--file_service_type=sequential",
        "--end_fsync=1",
        "--ioengine=psync",
        "--output=/dev/null",
    )


def run_cp8(src: Path, dst: Path, files: list[str]) -> None:
    # 8 parallel cp processes over the file list.
    script = 'cd %s && xargs -P8 -n%d sh -c \'for f; do cp "$f" "%s/$f"; done\' _' % (
        src,
        max(1, len(files) // 64),
        dst,
    )
    subprocess.run(["sh", "-c", script], input="\n".join(files), text=True, check=True)
    os.sync()


def bench_stage() -> list[str]:
    """Each tool copies the same files from a cold page cache and ends with them on disk; the
    order of the tools rotates between repetitions, and only the copy (and its sync) is timed,
    never the clean-up of the previous run."""
    rows = []
    sets = [
        ("2,048 x 128 KiB", WORK / "src-128k", 2048, 128 << 10),
        ("64 x 4 MiB", WORK / "src-4m", 64, 4 << 20),
        ("16 x 64 MiB", WORK / "src-64m", 16, 64 << 20),
    ]
    if QUICK:
        sets = [
            ("64 x 16 KiB", WORK / "src-16k", 64, 16 << 10),
            ("2 x 8 MiB", WORK / "src-8m", 2, 8 << 20),
        ]
    for label, src, count, size in sets:
        make_files(src, count, size)
        budget = f"{(2 * count * size + (64 << 20)) >> 20}MiB"
        dst = WORK / "cp-dst"
        files = [str(p.relative_to(src)) for p in src.rglob("*.bin")]
        m = bench_mount("stage", src, budget, "--mini-epochs", "1")

        tools = [
            ("cp -r", functools.partial(prep_cp, dst), functools.partial(run_cp, src, dst)),
            (
                "8x cp",
                functools.partial(prep_cp8, dst, files),
                functools.partial(run_cp8, src, dst, files),
            ),
            ("metfs", functools.partial(m.prepare, fresh=True), m.mount),
            ("fio", functools.partial(prep_fio, dst), functools.partial(run_fio, dst, count, size)),
        ]
        times: dict[str, list[float]] = {name: [] for name, _, _ in tools}
        for rep in range(REPS):
            for name, prep, run in tools[rep % len(tools) :] + tools[: rep % len(tools)]:
                prep()
                cold_data()
                t = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - t)
                m.close()
        shutil.rmtree(dst, ignore_errors=True)
        total = count * size / (1 << 20)
        cp1, cp8, met, fio = (med(times[n]) for n in ("cp -r", "8x cp", "metfs", "fio"))
        best = min(cp1, cp8)
        rows.append(
            f"| stage {label} | cp -r {total / cp1:,.0f} MiB/s; 8x cp {total / cp8:,.0f} MiB/s; "
            f"fio sequential write {total / fio:,.0f} MiB/s | {total / met:,.0f} MiB/s | "
            f"{best / met:.2f}x the faster cp; {fio / met:.2f}x fio |"
        )
        print(rows[-1], flush=True)
    return rows


def bench_switch() -> list[str]:
    files = 1000 if QUICK else 40000
    src = WORK / f"src-{files // 1000}k"
    make_files(src, files, 1024, per_dir=files // 20)
    # Two mini-epochs of half the files each: footprint 4 KiB per file.
    budget = f"{(files * 4096 + (24 << 20)) >> 20}MiB"
    every = {str(p.relative_to(src)) for p in src.rglob("*") if p.is_file()}
    lat = []
    # Sequential mini-epochs: the two halves of the dataset take turns, so a file of the next
    # view (any file not in the current one) is known before the clock starts, and the timed
    # interval holds only the `pass_end` and the lookups.
    with bench_mount(
        "switch", src, budget, "--mini-epochs", "2", "--rf", "1", "--compose", "sequential"
    ) as m:
        for _ in range(2 if QUICK else max(REPS, 5)):
            while not m.status()["next_ready"]:
                time.sleep(0.05)
            old = set(rpc(m.socket, {"op": "files"})["files"])
            probe = min(every - old)
            t = time.perf_counter()
            r = rpc(m.socket, {"op": "pass_end"})
            assert r["decision"] == "advance", r
            while True:
                try:
                    os.stat(m.mountpoint / probe)
                    break
                except FileNotFoundError:
                    pass
            lat.append((time.perf_counter() - t) * 1000)
    row = f"| view switch, {files // 2:,}-file mini-epoch | - | median {med(lat):.1f} ms, max {max(lat):.1f} ms | - |"
    print(row, flush=True)
    return [row]


def main() -> None:
    global QUICK, REPS
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("what", nargs="?", default="all", choices=("read", "stage", "switch", "all"))
    ap.add_argument("--quick", action="store_true", help="every row at a tiny size, one repetition")
    a = ap.parse_args()
    what = a.what
    if a.quick:
        QUICK, REPS = True, 1
    WORK.mkdir(parents=True, exist_ok=True)
    if USER:
        # The user's rf history files go beside the caches.
        subprocess.run(["chown", USER, str(WORK)], check=True)
        WORK.chmod(0o755)
    if not TARGET:  # another build is used as it is
        benchlib.build(examples=["readbench"])
    print("| benchmark | baseline | metfs | ratio |\n|---|---|---|---|", flush=True)
    rows = []
    if what in ("read", "all"):
        rows += bench_read()
    if what in ("stage", "all"):
        rows += bench_stage()
    if what in ("switch", "all"):
        rows += bench_switch()


if __name__ == "__main__":
    main()
