"""Straggler benchmark of dynamic sharding through real mounts: three `metfs mount` daemons on
this machine, each with a reader that trains on what its mount shows (a fixed time per sample:
a fast node's step, or four times it for the straggler), one epoch, two ways in one run:

* static: `--nodes 3 --node-rank R`, each node its planner share of every mini-epoch;
* queue: `--dds etcd://...` on a real etcd, each node claiming batches as it goes.

The epoch ends when every sample has been read through some mount (its last read); the ratio
queue / static is the issue's measure (goal <= 0.45; ideal 1/3 with speeds 1, 1, 1/4). Also
printed: each node's share of the epoch and the most any node spent in etcd round trips, as a
fraction of the epoch (from `status`).

usage: python3 benches/dds_straggler_mounts.py [--samples 600] [--step-ms 4] [--runs 3] [--budget 3MiB]
       python3 benches/dds_straggler_mounts.py --quick   # 240 files, 2 ms steps, 1 run (seconds)

`METFS_BIN` picks the binary; else the release build.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import benchlib
from benchlib import Mount, med
from conftest import Etcd, free_ports  # tests/, on sys.path from benchlib


def dataset(root: Path, n: int) -> list[str]:
    rng = random.Random(3)
    paths = []
    for i in range(n):
        rel = f"c{i % 6}/s{i:05d}.bin"
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rng.randbytes(rng.randrange(4 << 10, 12 << 10)))
        paths.append(rel)
    return paths


class Reader(threading.Thread):
    """Reads each view of epoch 0 once, `step` seconds per sample, then asks for the next
    mini-epoch (blocking until it is staged: this job never takes a bonus pass)."""

    def __init__(
        self, m: Mount, step: float, done: dict[str, float], lock: threading.Lock, t0: list[float]
    ) -> None:
        super().__init__(daemon=True)
        self.m, self.step, self.done, self.lock, self.t0 = m, step, done, lock, t0
        self.read = 0
        self.stop = threading.Event()

    def run(self) -> None:
        seen: set[int] = set()
        while not self.stop.is_set():
            v = self.m.files()
            if v["epoch"] > 0:
                return
            if v["generation"] not in seen:
                seen.add(v["generation"])
                for rel in v["files"]:
                    (self.m.mountpoint / rel).read_bytes()
                    time.sleep(self.step)
                    self.read += 1
                    with self.lock:
                        self.done.setdefault(rel, time.monotonic() - self.t0[0])
            self.m.rpc({"op": "pass_end", "block": True}, timeout=600)


def one_epoch(
    kind: str,
    work: Path,
    src: Path,
    paths: list[str],
    step: float,
    etcd: Etcd | None,
    run: int,
    budget: str,
) -> dict[str, Any]:
    mounts = []
    for i in range(3):
        extra = (
            ["--dds", etcd.url(f"straggler/{run}"), "--node-name", f"n{i}"]
            if etcd
            else ["--nodes", "3", "--node-rank", str(i)]
        )
        m = Mount(
            src,
            work / f"{kind}-cache{i}",
            work / f"{kind}-mnt{i}",
            metfs=benchlib.metfs_bin(),
            budget=budget,
            rf=1,
            compose="stratified",
            seed=run,
            history=work / "h.json",
            args=extra,
        )
        m.cache.mkdir(parents=True, exist_ok=True)
        mounts.append(m)
    try:
        for m in mounts:
            m.mount()
        done: dict[str, float] = {}
        lock = threading.Lock()
        t0 = [time.monotonic()]
        readers = [
            Reader(m, step * (4 if i == 2 else 1), done, lock, t0) for i, m in enumerate(mounts)
        ]
        for r in readers:
            r.start()
        deadline = time.monotonic() + 600
        while len(done) < len(paths):
            assert time.monotonic() < deadline, f"{kind}: {len(done)}/{len(paths)} read"
            time.sleep(0.02)
        epoch = max(done.values())
        for r in readers:
            r.stop.set()
        shares = [round(r.read / len(paths), 3) for r in readers]
        etcd_frac = 0.0
        if etcd:
            etcd_frac = max(m.status()["dds"]["etcd_secs"] for m in mounts) / epoch
        return {"kind": kind, "epoch_s": epoch, "shares": shares, "etcd_fraction": etcd_frac}
    finally:
        for m in mounts:
            m.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=600)
    ap.add_argument("--step-ms", type=float, default=4.0, help="a fast node's time per sample")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument(
        "--budget", default="3MiB", help="each node's budget (about 1.7 MiB of it is metadata)"
    )
    ap.add_argument("--quick", action="store_true", help="240 files, 2 ms steps, 1 run")
    a = ap.parse_args()
    if a.quick:
        a.samples, a.step_ms, a.runs = 240, 2.0, 1
    benchlib.build()
    rows = []
    with tempfile.TemporaryDirectory() as t:
        work = Path(t)
        src = work / "tier"
        paths = dataset(src, a.samples)
        (work / "etcd").mkdir()
        etcd = Etcd(work / "etcd", *free_ports(2))
        etcd.start()
        try:
            for run in range(a.runs):
                # The order alternates, so that the machine's noise hits both sides alike.
                order = [("static", None), ("queue", etcd)]
                if run % 2:
                    order.reverse()
                got = {
                    k: one_epoch(
                        k, work / f"r{run}", src, paths, a.step_ms / 1000, e, run, a.budget
                    )
                    for k, e in order
                }
                row = {
                    "run": run,
                    "static_s": got["static"]["epoch_s"],
                    "queue_s": got["queue"]["epoch_s"],
                    "ratio": got["queue"]["epoch_s"] / got["static"]["epoch_s"],
                    "static_shares": got["static"]["shares"],
                    "queue_shares": got["queue"]["shares"],
                    "etcd_fraction": got["queue"]["etcd_fraction"],
                }
                print(json.dumps(row), flush=True)
                rows.append(row)
        finally:
            etcd.kill()
    m = {k: med(r[k] for r in rows) for k in ("static_s", "queue_s", "ratio", "etcd_fraction")}
    print(
        f"| {a.samples} files, budget {a.budget} per node, fast step {a.step_ms} ms (slow 4x) "
        f"| static {m['static_s']:.2f} s | queue {m['queue_s']:.2f} s | ratio {m['ratio']:.3f} "
        f"| queue shares {rows[len(rows) // 2]['queue_shares']} | etcd {100 * m['etcd_fraction']:.2f}% |"
    )


if __name__ == "__main__":
    main()
