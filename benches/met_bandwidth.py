#!/usr/bin/env python3
"""MET against a slow capacity tier: a consumer (a stand-in for GPUs) reads through the mount
at a target rate EB1 = 4 x B2, where B2 is the tier's bandwidth (emulated with metfs's staging
cap), side by side with a baseline consumer reading the same files directly from a tier capped
at B2. For rf = 1, 2, 4, 8 and `--prefetch-rate auto` it reports, in one run:

* samples per second delivered to the consumer, and as a fraction of its target rate;
* the fraction of time the consumer waited (blocked in pass_end for staging);
* capacity-tier bytes per sample consumed;
* for auto pacing, the peak staging bandwidth over 1 s windows against the average needed.

    python3 benches/met_bandwidth.py            # B2 = 8 MiB/s, 400 x 256 KiB, 4 mini-epochs
    python3 benches/met_bandwidth.py --quick    # B2 = 2 MiB/s, 40 x 32 KiB (seconds)

Needs root (FUSE). Work directory: $METFS_BENCH_DIR or /tmp/metfs-bench. `METFS_BIN` picks the
binary; else the release build.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import benchlib
from benchlib import rpc

WORK = Path(os.environ.get("METFS_BENCH_DIR", "/tmp/metfs-bench")) / "bw"
METFS = benchlib.metfs_bin()
B2 = 8 << 20
EB1 = 4 * B2
FILES, SIZE, NM = 400, 256 << 10, 4
MINI_EPOCHS_RUN = 8  # two epochs


class Paced:
    """Reads files at no more than `rate` bytes/s (sleeping when ahead); counts waits apart."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.t0 = time.perf_counter()
        self.bytes = 0
        self.samples = 0
        self.waited = 0.0

    def read(self, path: Path) -> None:
        with open(path, "rb", buffering=0) as f:
            while chunk := f.read(128 << 10):
                self.bytes += len(chunk)
        self.samples += 1
        ahead = self.bytes / self.rate - (time.perf_counter() - self.t0 - self.waited)
        if ahead > 0:
            time.sleep(ahead)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0


def make_dataset() -> Path:
    src = WORK / "src"
    first = src / "c0" / "s0000.bin"
    if not first.exists() or first.stat().st_size != SIZE or len(list(src.rglob("*.bin"))) != FILES:
        shutil.rmtree(src, ignore_errors=True)
        for i in range(FILES):
            d = src / f"c{i % 10}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"s{i:04d}.bin").write_bytes(os.urandom(SIZE))
    return src


def baseline(src: Path) -> dict:
    """Reads every file of one epoch directly from a tier that gives at most B2."""
    files = sorted(src.rglob("*.bin"))
    tier = Paced(B2)  # the tier's cap
    for p in files:
        tier.read(p)
    secs = tier.elapsed()
    return {
        "samples_per_s": len(files) / secs,
        "waited": 1 - min(1.0, (tier.bytes / EB1) / secs),
        "tier_bytes_per_sample": tier.bytes / len(files),
    }


def met(src: Path, rf: int | None) -> dict:
    mnt = WORK / "mnt"
    budget = f"{(2 * FILES * SIZE // NM + (8 << 20)) >> 20}MiB"
    m = benchlib.Mount(
        src,
        WORK / "cache",
        mnt,
        metfs=METFS,
        budget=budget,
        rf=rf or 8,
        mini_epochs=NM,
        prefetch_rate=f"{B2 >> 20}MiB/s" if rf else "auto",
        prefetch_rate_max=None if rf else f"{B2 >> 20}MiB/s",
        history=WORK / "h.json",
    )
    m.prepare(fresh=True)
    m.mount()
    sock = m.socket
    try:
        tier0 = rpc(sock, {"op": "status"})["tier_bytes_read"]
        consumer = Paced(EB1)
        windows: list[tuple[float, int]] = []
        seq = 0
        while seq < MINI_EPOCHS_RUN:
            files = rpc(sock, {"op": "files"})
            for rel in files["files"]:
                consumer.read(mnt / rel)
                if consumer.samples % 8 == 0:
                    windows.append(
                        (time.perf_counter(), rpc(sock, {"op": "status"})["tier_bytes_read"])
                    )
            t = time.perf_counter()
            r = rpc(sock, {"op": "pass_end", "block": True})
            consumer.waited += time.perf_counter() - t
            if r["decision"] == "advance":
                seq += 1
        secs = consumer.elapsed()
        st = rpc(sock, {"op": "status"})
        tier = st["tier_bytes_read"] - tier0
        out = {
            "samples_per_s": consumer.samples / secs,
            "waited": consumer.waited / secs,
            "tier_bytes_per_sample": tier / consumer.samples,
            "passes": consumer.samples / (FILES / NM),
        }
        if rf is None:
            peaks = []
            # Windows of at least 1 s: the tier counter moves a whole file at a time.
            for i, (t1, b1) in enumerate(windows):
                j = next((j for j in range(i + 1, len(windows)) if windows[j][0] - t1 > 1.0), None)
                if j is None:
                    break
                t2, b2 = windows[j]
                if t2 - t1 > 1.0:
                    peaks.append((b2 - b1) / (t2 - t1))
            needed = (FILES * SIZE / NM) / (8 * (FILES / NM) * SIZE / EB1)
            out["peak_bw"] = max(peaks, default=float("nan"))
            out["needed_bw"] = needed
        return out
    finally:
        m.close()


def main() -> None:
    global B2, EB1, FILES, SIZE
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="B2 = 2 MiB/s, 40 files of 32 KiB")
    if ap.parse_args().quick:
        B2, FILES, SIZE = 2 << 20, 40, 32 << 10
        EB1 = 4 * B2
    benchlib.build()
    src = make_dataset()
    target = EB1 / SIZE
    b = baseline(src)
    print(
        f"B2 = {B2 >> 20} MiB/s, EB1 = {EB1 >> 20} MiB/s, {FILES} x {SIZE >> 10} KiB, {NM} mini-epochs; target {target:.0f} samples/s\n"
    )
    print("| consumer | samples/s | of target | waited | tier bytes / sample |")
    print("|---|---|---|---|---|")
    print(
        f"| baseline (direct, tier capped at B2) | {b['samples_per_s']:.0f} | {b['samples_per_s'] / target:.2f} | "
        f"{b['waited']:.2f} | {b['tier_bytes_per_sample'] / 1024:.0f} KiB |"
    )
    only = os.environ.get("METFS_BW_ONLY")  # e.g. "auto" or "4"
    for rf in (1, 2, 4, 8, None):
        if only and only != (str(rf) if rf else "auto"):
            continue
        r = met(src, rf)
        name = f"metfs rf={rf}" if rf else "metfs rf=8, --prefetch-rate auto"
        extra = ""
        if rf is None:
            extra = f" (peak staging {r['peak_bw'] / 2**20:.1f} MiB/s = {r['peak_bw'] / r['needed_bw']:.2f}x the {r['needed_bw'] / 2**20:.1f} MiB/s needed)"
        print(
            f"| {name} | {r['samples_per_s']:.0f} | {r['samples_per_s'] / target:.2f} | {r['waited']:.2f} | "
            f"{r['tier_bytes_per_sample'] / 1024:.1f} KiB{extra} |",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
