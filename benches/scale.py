#!/usr/bin/env python3
"""metfs at scale: a view of 500,000 small files, each row beside its native baseline.

    python3 benches/scale.py                      # 1,000,000 files of 1-4 KiB, two mini-epochs
    python3 benches/scale.py --files 200000 --size 112640   # ImageNet-like 110 KiB files
    python3 benches/scale.py --quick              # 20,000 files; checks, for the test command
    python3 benches/scale.py --files 10000000 --links 1000 --mini-epochs 4 --only memory
                                                  # a catalog of 10M (hard links), views of 2.5M

The tier is `--files` files in directories of 1,000 (ImageNet's layout) of random bytes, made
once under the work directory ($METFS_BENCH_DIR or /tmp/metfs-scale) and kept for later runs.
The mount has a budget for two mini-epochs of half the files each (`--mini-epochs N`: of a
N-th each), `--rf 100` (the benchmark
advances the view itself, so no pass ends a mini-epoch by surprise) and the default read path.

Rows (medians of `--reps`; "cold" drops the page cache first, which needs root):

- mount: the catalog of every file and the first mini-epoch's staging; the daemon's RSS then,
  and after a pass and a switch, per catalogued file;
- memory (`--only memory`, a few minutes at 1M files): the daemon's RSS per catalogued file
  after the mount, once the next mini-epoch is staged, and with both views live after a pass,
  a switch, a walk of the new view and the staging of the one after;
- staging the next mini-epoch against `cp -r` of as many files (the slot just staged, cold) and
  a `sync`, and the CPU each spent (the daemon's, all threads; `cp`'s), which a shared
  machine's steal hardly moves;
- `Client.files()`: the packed list against the JSON list the client asked for before; a pass
  of `metfs.passes()` over an unchanged view (the loop's own cost per pass, an empty body);
  `metfs files`;
- `os.walk` of the view against the same files in a directory (the slot), cold and warm, and
  the first walk after a switch against a cold native walk;
- reading every file of a 30,000-file sample once (`metfs/examples/readbench.rs --list`),
  4 and 16 threads, cold and warm, mount against the slot;
- a remount of the same cache (resume);
- the first pass over a new view right after a switch (16 threads, every file once, in a random
  order), the daemon listing the view for the kernel (`prime_entries`, the default) against not
  (`--prime-entries=false`);
- `--only prime-walk` (not in the default set: each of its remounts waits for a staging): the
  first walk after a switch, listed for the kernel against `--prime-entries=false`, each beside
  the cold native walks of its new views;
- a PyTorch `DataLoader` with 16 worker processes over the view (`metfs.torch`) against the
  same loader over a plain list of the slot's paths: samples/s, and the workers' total RSS and
  PSS at a tenth of the pass and at its end (growth is what the workers copied while reading).

`--quick` also checks what must hold at any size and exits non-zero when it does not: the
packed list is the JSON list, a pass over an unchanged view receives no list, a switch
receives exactly one, and the loaders read every sample.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import benchlib
from benchlib import ROOT, drop_caches, med, timed

sys.path.insert(0, str(ROOT / "bindings" / "python" / "src"))

import metfs  # noqa: E402
from metfs.client import Client, FilesView  # noqa: E402

WORK = Path(os.environ.get("METFS_BENCH_DIR", "/tmp/metfs-scale"))
# Binaries already built (the test command's debug build): no release build then.
METFS = benchlib.metfs_bin()
READER = Path(os.environ.get("METFS_READBENCH", benchlib.example_bin("readbench")))
FAILURES: list[str] = []


def check(ok: bool, what: str) -> None:
    if not ok:
        FAILURES.append(what)
        print(f"CHECK FAILED: {what}", flush=True)


def make_tier(
    root: Path, files: int, lo: int, hi: int, per_dir: int, links: int = 0, pairs: bool = False
) -> None:
    """`files` files of `lo`-`hi` random bytes under `root`; with `links`, the files are hard
    links to that many distinct files kept beside the tier (a catalog of 10M files on a disk that
    cannot hold 10M files' blocks twice: the stager still copies each one). With `pairs`, files
    `2k` and `2k + 1` share a stem (`f0000012.a.bin`, `f0000012.b.bin`): samples of two files
    for `--group-by stem`."""
    stamp = root / ".complete"
    want = (
        f"{files} {lo} {hi} {per_dir}"
        + (f" links {links}" if links else "")
        + (" pairs" if pairs else "")
        + "\n"
    )
    if stamp.exists() and stamp.read_text() == want:
        return
    shutil.rmtree(root, ignore_errors=True)
    rng = random.Random(7)
    blob = os.urandom(hi + 4096)
    t = time.perf_counter()
    base = root.with_name(root.name + "-base")
    if links:
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        for j in range(links):
            off = rng.randrange(4096)
            (base / f"b{j:07d}.bin").write_bytes(blob[off : off + rng.randint(lo, hi)])
    for i in range(files):
        d = root / f"d{i // per_dir:05d}"
        if i % per_dir == 0:
            d.mkdir(parents=True)
        name = f"f{i // 2:07d}.{'ab'[i % 2]}.bin" if pairs else f"f{i:07d}.bin"
        if links:
            os.link(base / f"b{i % links:07d}.bin", d / name)
            continue
        size = rng.randint(lo, hi)
        off = rng.randrange(4096)
        with open(d / name, "wb") as f:
            f.write(blob[off : off + size])
    os.sync()
    stamp.write_text(want)
    print(f"made the tier: {files:,} files in {time.perf_counter() - t:.0f} s", flush=True)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds of process `pid`, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    """User plus system CPU seconds of this process's waited-for children."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def pss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def scale_mount(tier: Path, files: int, footprint: int, mini_epochs: int) -> benchlib.Mount:
    """The benchmark's mount of `tier`: two mini-epochs (of half the files each by default), at
    their on-disk footprint, plus room for the catalog and journals."""
    view = files // mini_epochs
    return benchlib.Mount(
        tier,
        WORK / "cache",
        WORK / "mnt",
        metfs=METFS,
        budget=f"{(2 * view * footprint * 5 // 4 + (512 << 20)) >> 20}MiB",
        mini_epochs=mini_epochs,
        rf=100,
        history=WORK / "rf-history.json",
    )


def mount_timed(m: benchlib.Mount, reset: bool, extra: Sequence[str] = ()) -> float:
    """Mounts (`--reset`: a new run), with `extra` flags this time; returns the seconds taken."""
    m.settings["reset"] = reset
    m.args = list(extra)
    return timed(m.mount)


def slot_of(m: benchlib.Mount, c: Client) -> Path:
    st = c.status()
    return m.slot_dir(st.epoch, st.mini_epoch)


def wait_next(c: Client) -> float:
    t = time.perf_counter()
    while not c.status().next_ready:
        time.sleep(0.05)
    return time.perf_counter() - t


class CountingClient(Client):
    """A client that counts the packed-list bytes it receives (what a pass costs the wire)."""

    list_bytes = 0
    lists = 0

    def _exchange(self, request: Any, *, wait: bool = False) -> tuple[dict, bytearray | None]:
        # Every request goes through here, with the packed bytes after a `files` reply.
        resp, packed = super()._exchange(request, wait=wait)
        if packed is not None:
            self.list_bytes += len(packed)
            self.lists += 1
        return resp, packed


def walk(top: Path) -> int:
    n = 0
    for _, _, files in os.walk(top):
        n += len(files)
    return n


def first_walk(m: benchlib.Mount, c: CountingClient, known: FilesView) -> tuple[float, float]:
    """Switches the view (`advance(wait=True)`: once the next mini-epoch is staged), then times
    the first walk of the new view through the mount and a cold walk of its slot. Checks that
    the switch sent the list once to a client that held `known`."""
    drop_caches()
    before = c.lists
    d = c.advance(wait=True)
    check(d.advanced, "the benchmark's advance switched the view")
    t_first = timed(lambda: walk(m.mountpoint))
    after = c.files(known)
    check(
        after.generation == d.generation and c.lists == before + 1,
        "a switch sends the list once",
    )
    slot = slot_of(m, c)
    drop_caches()
    return t_first, timed(partial(walk, slot))


def readbench(top: Path, listing: Path, threads: int) -> float:
    out = subprocess.run(
        [str(READER), str(top), "--threads", str(threads), "--list", str(listing)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return float(json.loads(out)["files_per_s"])


def row(what: str, metfs_side: str, base: str, ratio: str) -> str:
    line = f"| {what} | {metfs_side} | {base} | {ratio} |"
    print(line, flush=True)
    return line


def pair(
    reps: int, cold: bool, native: Callable[[], float], mounted: Callable[[], float]
) -> tuple[float, float]:
    """Interleaves the two sides so that noise hits both alike; returns their medians."""
    a: list[float] = []
    b: list[float] = []
    for r in range(reps):
        order = [(a, native), (b, mounted)] if r % 2 == 0 else [(b, mounted), (a, native)]
        for acc, fn in order:
            if cold:
                drop_caches()
            acc.append(fn())
    return med(a), med(b)


def read_len(path: str) -> int:
    with open(path, "rb") as f:
        return len(f.read())


def total(batch: list[int]) -> int:
    return sum(batch)


class PathsDataset:
    """What a user writes over a directory: a list of path strings, one sample per path."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> int:
        return read_len(self.paths[i])


def loader_run(loader: Any, n: int) -> tuple[float, int, int, int, int, int]:
    """One pass of a DataLoader: samples/s, its workers' RSS and PSS (KiB) at a tenth of the
    pass and near its end, and the bytes it read."""
    it = iter(loader)
    batches = len(loader)

    def mem() -> tuple[int, int]:
        pids = [w.pid for w in it._workers]
        return sum(rss_kib(p) for p in pids), sum(pss_kib(p) for p in pids)

    early = late = (0, 0)
    read = total_bytes = 0
    t = time.perf_counter()
    for read, nbytes in enumerate(it, 1):
        total_bytes += nbytes
        if read == max(1, batches // 10):
            early = mem()
        if read == max(1, batches - 1):
            late = mem()
    dt = time.perf_counter() - t
    check(read == batches, f"the loader read {read} of {batches} batches")
    return n / dt, early[0], early[1], late[0], late[1], total_bytes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=1_000_000)
    ap.add_argument("--min-size", type=int, default=1024)
    ap.add_argument("--max-size", type=int, default=4096)
    ap.add_argument("--size", type=int, help="every file this many bytes (e.g. 112640)")
    ap.add_argument(
        "--mini-epochs",
        type=int,
        default=2,
        help="mini-epochs per epoch (default 2: views of half the files); more keeps the views "
        "small beside a large catalog, e.g. 10M files on a disk that cannot hold two views of 5M",
    )
    ap.add_argument(
        "--links",
        type=int,
        default=0,
        help="make the tier's files hard links to this many distinct files (a tier of 10M files "
        "in a few GB of directories; each is still staged as a copy of its own)",
    )
    ap.add_argument(
        "--pairs",
        action="store_true",
        help="samples of two files: a tier of name pairs (f0000012.a.bin, f0000012.b.bin) "
        "mounted with --group-by stem, to set beside the same run without it",
    )
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sample", type=int, default=30_000, help="files read in the read rows")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--quick", action="store_true", help="20,000 files, one repetition, checks")
    ap.add_argument(
        "--only",
        default="",
        help="comma-separated rows to run besides the mount: stage, memory, files, loop, cli, "
        "walk, read, loader, switch, resume, prime (default all), and prime-walk (only when "
        "named)",
    )
    a = ap.parse_args()
    if a.quick:
        a.files, a.reps, a.sample, a.workers = 20_000, 1, 3_000, 2
    only = {x.strip() for x in a.only.split(",") if x.strip()}

    def want(row: str) -> bool:
        return not only or row in only

    lo, hi = (a.size, a.size) if a.size else (a.min_size, a.max_size)
    footprint = (hi + 4095) // 4096 * 4096
    if "METFS_BIN" not in os.environ or "METFS_READBENCH" not in os.environ:
        benchlib.build(examples=["readbench"])
    WORK.mkdir(parents=True, exist_ok=True)
    tier = WORK / (
        f"tier-{a.files}-{lo}-{hi}"
        + (f"-links{a.links}" if a.links else "")
        + ("-pairs" if a.pairs else "")
    )
    make_tier(tier, a.files, lo, hi, 1000, a.links, a.pairs)
    m = scale_mount(tier, a.files, footprint, a.mini_epochs)
    if a.pairs:
        m.settings["group_by"] = "stem"
    m.close()
    if m.cache.exists():
        # Deleted before anything is timed: a million files deleted in the background (as this
        # script once did, to start sooner) competed with the staging row for the disk and
        # made it 40% slower.
        t = time.perf_counter()
        subprocess.run(["rm", "-rf", str(m.cache)], check=True)
        print(f"deleted the last run's cache in {time.perf_counter() - t:.0f} s", flush=True)
    root = os.geteuid() == 0
    print(
        f"\n{a.files:,} files of {lo}-{hi} B in directories of 1,000; {a.mini_epochs} mini-epochs "
        f"of {a.files // a.mini_epochs:,}; medians of {a.reps}; {os.cpu_count()} cores"
        + ("; samples of two files (--group-by stem)" if a.pairs else "")
        + ("" if root else "; not root: cold rows are not cold"),
        flush=True,
    )
    rows = [row("what", "metfs", "baseline", "ratio"), "|---|---|---|---|"]
    try:
        drop_caches()
        t_mount = mount_timed(m, reset=True)
        with CountingClient(m.socket) as c:
            pid = int(c.status().raw["pid"])
            rss0 = rss_kib(pid)
            cpu0 = cpu_s(pid)
            t_stage = wait_next(c)
            cpu_stage = cpu_s(pid) - cpu0
            half = c.status().view_files or a.files // a.mini_epochs
            rows.append(row("mount (catalog + first staging)", f"{t_mount:.1f} s", "", ""))
            slot = slot_of(m, c)
            cp_dst = WORK / "cp-dst"

            cp_cpu: list[float] = []

            def cp() -> float:
                shutil.rmtree(cp_dst, ignore_errors=True)
                drop_caches()
                t = time.perf_counter()
                cpu = children_cpu_s()
                subprocess.run(["cp", "-r", str(slot), str(cp_dst)], check=True)
                os.sync()
                cp_cpu.append(children_cpu_s() - cpu)
                return time.perf_counter() - t

            if want("stage"):
                t_cp = cp()
                shutil.rmtree(cp_dst, ignore_errors=True)
                rows.append(
                    row(
                        f"staging the next mini-epoch ({half:,} files)",
                        f"{t_stage:.1f} s ({half / t_stage:,.0f} files/s)",
                        f"cp -r + sync: {t_cp:.1f} s",
                        f"{t_cp / t_stage:.2f}x cp",
                    )
                )
                # CPU, unlike the wall time, hardly moves with what a shared machine's neighbours
                # do (their steal shows in the wall times above). Neither counts the kernel's
                # writeback threads.
                rows.append(
                    row(
                        "CPU while staging it (daemon, all threads)",
                        f"{cpu_stage:.1f} s ({cpu_stage * 1e6 / half:.0f} us/file)",
                        f"cp -r: {cp_cpu[-1]:.1f} s",
                        f"{cp_cpu[-1] / cpu_stage:.2f}x cp",
                    )
                )
            if want("memory"):
                # Both views live: the view read now and the next one, staged and switched to
                # after a pass, with the one after that staged too (the stager's bookkeeping of
                # a finished staging included).
                rss_staged = rss_kib(pid)
                for _ in metfs.passes(c, epochs=1000, max_passes=1):
                    pass
                c.advance(wait=True)
                walk(m.mountpoint)
                wait_next(c)
                rss_both = rss_kib(pid)
                rows.append(
                    row(
                        "daemon RSS: after mount / next staged / after a pass, a switch and the next staging",
                        f"{rss0 >> 10:,} / {rss_staged >> 10:,} / {rss_both >> 10:,} MiB",
                        "",
                        " / ".join(
                            f"{r * 1024 / a.files:.0f}" for r in (rss0, rss_staged, rss_both)
                        )
                        + " B per catalogued file",
                    )
                )

            view = c.files()
            rel = list(view.files)
            # The memory row switched the view: the rows below compare against its slot.
            slot = slot_of(m, c)
            if want("files"):
                # The file list: packed against the JSON list the client read before.
                def json_list() -> float:
                    t = time.perf_counter()
                    FilesView.from_response(c.request({"op": "files"}))
                    return time.perf_counter() - t

                json_t, packed_t = pair(a.reps, False, json_list, lambda: timed(c.files))
                rows.append(
                    row(
                        f"`Client.files()`, {half:,} paths",
                        f"packed {packed_t * 1e3:,.0f} ms",
                        f"JSON list {json_t * 1e3:,.0f} ms",
                        f"{json_t / packed_t:.1f}x faster",
                    )
                )
                listed = c.request({"op": "files"})["files"]
                check(view.files == listed, "the packed list is the JSON list")

            if want("loop"):
                # The pass loop over an unchanged view: its own cost per pass, and what crossed the
                # socket (one list, for the first pass).
                before = (c.list_bytes, c.lists)
                k = 10 if a.quick else 30
                stamps = []
                for _ in metfs.passes(c, epochs=1000, max_passes=k):
                    stamps.append(time.perf_counter())
                per_pass = med([y - x for x, y in zip(stamps, stamps[1:], strict=False)])
                lists = c.lists - before[1]
                check(lists == 1, f"{k} passes over one view read {lists} lists, not 1")
                rows.append(
                    row(
                        "a pass of `metfs.passes()` over an unchanged view (the loop's own cost)",
                        f"{per_pass * 1e3:.2f} ms; {lists} list of {(c.list_bytes - before[0]) >> 10:,} KiB in {k} passes",
                        "",
                        "",
                    )
                )
            if want("cli"):
                cli = med(
                    [
                        timed(
                            lambda: subprocess.run(
                                [str(METFS), "files", "--socket", m.socket],
                                check=True,
                                stdout=subprocess.DEVNULL,
                            )
                        )
                        for _ in range(a.reps)
                    ]
                )
                rows.append(row("`metfs files`", f"{cli:.2f} s", "", ""))

            if want("walk"):
                nat, mnt = pair(
                    a.reps,
                    True,
                    lambda: timed(lambda: walk(slot)),
                    lambda: timed(lambda: walk(m.mountpoint)),
                )
                rows.append(
                    row(
                        "`os.walk` of the view, cold",
                        f"{mnt:.2f} s",
                        f"the slot: {nat:.2f} s",
                        f"{nat / mnt:.2f}x",
                    )
                )
                walk(m.mountpoint)
                walk(slot)
                nat_w, mnt_w = pair(
                    a.reps,
                    False,
                    lambda: timed(lambda: walk(slot)),
                    lambda: timed(lambda: walk(m.mountpoint)),
                )
                rows.append(
                    row(
                        "`os.walk` of the view, warm",
                        f"{mnt_w:.2f} s",
                        f"the slot: {nat_w:.2f} s",
                        f"{nat_w / mnt_w:.2f}x",
                    )
                )

            if want("read"):
                # Reads of a sample of the view.
                random.Random(3).shuffle(rel)
                listing = WORK / "sample.txt"
                listing.write_text("\n".join(rel[: a.sample]) + "\n")
                for threads in (4, 16):
                    for cold in (True, False):
                        if not cold:
                            readbench(slot, listing, threads)
                            readbench(m.mountpoint, listing, threads)

                        def on(top: Path, t: int = threads) -> Callable[[], float]:
                            return lambda: readbench(top, listing, t)

                        nat_r, mnt_r = pair(a.reps, cold, on(slot), on(m.mountpoint))
                        rows.append(
                            row(
                                f"reading {min(a.sample, len(rel)):,} files once, {threads} threads, {'cold' if cold else 'warm'}",
                                f"{mnt_r:,.0f} files/s",
                                f"the slot: {nat_r:,.0f} files/s",
                                f"{mnt_r / nat_r:.2f}x",
                            )
                        )

            if want("loader"):
                # The loaders: metfs.torch over the view, and a list of paths over the slot.
                from torch.utils.data import DataLoader

                from metfs.torch import MetDataset, met_loader

                ds = MetDataset(c, read_len)
                check(len(ds) == len(rel), "the loader's dataset is the view")
                kw: dict[str, Any] = {"num_workers": a.workers, "collate_fn": total}
                native: Any = DataLoader(
                    PathsDataset([str(slot / r) for r in rel]), batch_size=256, shuffle=True, **kw
                )  # type: ignore[arg-type]
                nat_l = loader_run(native, len(rel))
                met_l = loader_run(met_loader(ds, batch_size=256, **kw), len(ds))
                check(met_l[5] == nat_l[5], f"the loaders read {met_l[5]} and {nat_l[5]} bytes")
                rows.append(
                    row(
                        f"`DataLoader`, {a.workers} workers, one pass ({len(ds):,} samples)",
                        f"{met_l[0]:,.0f} samples/s; workers' RSS {met_l[1] >> 10:,} -> {met_l[3] >> 10:,} MiB, PSS {met_l[2] >> 10:,} -> {met_l[4] >> 10:,} MiB",
                        f"list of paths: {nat_l[0]:,.0f} samples/s; RSS {nat_l[1] >> 10:,} -> {nat_l[3] >> 10:,} MiB, PSS {nat_l[2] >> 10:,} -> {nat_l[4] >> 10:,} MiB",
                        f"{met_l[0] / nat_l[0]:.2f}x",
                    )
                )
                # The same loader handed the copies' own paths (`direct=True`): reads bypass FUSE
                # under the connection's lease on the view, released before the rows below. The
                # slot's pages are now cached (the loaders above read them), so the list of paths
                # runs again beside it, warm too.
                ds_d = MetDataset(c, read_len, direct=True)
                check(len(ds_d) == len(rel), "the direct loader's dataset is the view")
                nat_lw = loader_run(native, len(rel))
                dir_l = loader_run(met_loader(ds_d, batch_size=256, **kw), len(ds_d))
                c.release()
                check(dir_l[5] == nat_lw[5], f"the loaders read {dir_l[5]} and {nat_lw[5]} bytes")
                rows.append(
                    row(
                        f"the same, `MetDataset(..., direct=True)`, both sides warm ({len(ds_d):,} samples)",
                        f"{dir_l[0]:,.0f} samples/s; workers' PSS {dir_l[2] >> 10:,} -> {dir_l[4] >> 10:,} MiB",
                        f"list of paths: {nat_lw[0]:,.0f} samples/s",
                        f"{dir_l[0] / nat_lw[0]:.2f}x",
                    )
                )

            if want("switch"):
                # `--reps` switches: the row spreads more than any other (the walker's own time
                # building an inode per entry, beside the listing the daemon does for the kernel
                # and the staging the switch starts), so one switch says little.
                walks = [first_walk(m, c, view) for _ in range(a.reps)]
                firsts, natives = [w[0] for w in walks], [w[1] for w in walks]
                t_first, t_native = med(firsts), med(natives)
                rows.append(
                    row(
                        "first walk after a switch",
                        f"{t_first:.2f} s ({', '.join(f'{t:.2f}' for t in firsts)})",
                        f"cold native walk: {t_native:.2f} s ({', '.join(f'{t:.2f}' for t in natives)})",
                        f"{t_native / t_first:.2f}x",
                    )
                )
                for _ in metfs.passes(c, epochs=1000, max_passes=2):
                    pass
                rss1 = rss_kib(pid)
                wait_next(c)
                rss2 = rss_kib(pid)
                rows.append(
                    row(
                        "daemon RSS after mount / after the rows above and a switch, the next staging under way / staged",
                        f"{rss0 >> 10:,} / {rss1 >> 10:,} / {rss2 >> 10:,} MiB",
                        "",
                        " / ".join(f"{r * 1024 / a.files:.0f}" for r in (rss0, rss1, rss2))
                        + " B per catalogued file",
                    )
                )
            wait_next(c)
        m.close()
        if want("resume"):
            drop_caches()
            t_resume = mount_timed(m, reset=False)
            rows.append(
                row(
                    "remount of the same cache (resume)",
                    f"{t_resume:.1f} s",
                    f"first mount: {t_mount:.1f} s",
                    f"{t_mount / t_resume:.2f}x",
                )
            )
        if want("prime"):
            # The first pass over a new view, of files the kernel has not seen yet: the daemon
            # lists the view for the kernel (the default) against `--prime-entries=false`, each
            # remounted (a resume), then a switch and at once 16 threads over every file of the
            # new view in a random order (its copies still in memory from staging, as on a node
            # that has the room). The order comes from numpy, so reading starts within ~0.1 s
            # of the switch, while the daemon is still listing.
            first: dict[bool, list[float]] = {True: [], False: []}
            for r in range(a.reps):
                for prime in (True, False) if r % 2 == 0 else (False, True):
                    m.close()
                    mount_timed(m, reset=False, extra=[f"--prime-entries={str(prime).lower()}"])
                    with Client(m.socket) as pc:
                        wait_next(pc)
                        pc.advance(wait=True)
                        new = pc.files()
                        import numpy as np

                        idx = np.random.default_rng(r).permutation(len(new.files)).tolist()
                        listing = WORK / "first-read.txt"
                        listing.write_text("".join(new.files[i] + "\n" for i in idx))
                        first[prime].append(readbench(m.mountpoint, listing, 16))
                        t_wait = time.perf_counter()
                        while prime and time.perf_counter() - t_wait < 60:
                            st = pc.status()
                            if st.raw["primed_generation"] == st.generation:
                                break
                            time.sleep(0.05)
                        st = pc.status()
                        want_gen = st.generation if prime else 0
                        check(
                            st.raw["primed_generation"] == want_gen,
                            f"the view listed for the kernel: {st.raw['primed_generation']}, not {want_gen}",
                        )
            listed, unlisted = med(first[True]), med(first[False])
            rows.append(
                row(
                    "the first pass over a new view right after a switch, 16 threads, random order",
                    f"view listed for the kernel: {listed:,.0f} files/s",
                    f"`--prime-entries=false`: {unlisted:,.0f} files/s",
                    f"{listed / unlisted:.2f}x",
                )
            )
        if "prime-walk" in only:
            # The first walk after a switch with the daemon listing the new view for the kernel
            # (the default) against `--prime-entries=false`, each remounted (a resume), in
            # alternating order; only on request, since every remount waits for a staging.
            fw: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
            for r in range(a.reps):
                for prime in (True, False) if r % 2 == 0 else (False, True):
                    m.close()
                    mount_timed(m, reset=False, extra=[f"--prime-entries={str(prime).lower()}"])
                    with CountingClient(m.socket) as pc:
                        fw[prime].append(first_walk(m, pc, pc.files()))

            def side(walks: list[tuple[float, float]]) -> tuple[float, str]:
                t, n = med([w[0] for w in walks]), med([w[1] for w in walks])
                runs = ", ".join(f"{w[0]:.2f}/{w[1]:.2f}" for w in walks)
                return t, f"{t:.2f} s, {t / n:.2f}x its cold native walks (walk/native: {runs})"

            (t_on, on_text), (t_off, off_text) = side(fw[True]), side(fw[False])
            rows.append(
                row(
                    "first walk after a switch, the view listed for the kernel against not",
                    on_text,
                    f"`--prime-entries=false`: {off_text}",
                    f"{t_off / t_on:.2f}x",
                )
            )
    finally:
        m.close()
    print("\n" + "\n".join(rows))
    if FAILURES:
        print("\nfailed checks:\n  " + "\n  ".join(FAILURES))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
