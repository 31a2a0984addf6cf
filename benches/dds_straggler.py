"""Straggler benchmark of dynamic sharding: three nodes read one epoch of a dataset, one of them
at a quarter of the others' speed. With static sharding (today's `--nodes/--node-rank`: each
node its fixed share of every mini-epoch) the epoch lasts as long as the slow node needs for a
third of the data; with the queue the fast nodes take more shards. Prints the epoch times, their
ratio (ideal 1/3 with speeds 1, 1, 1/4: 2.25 nodes' worth of speed instead of 3 x 1/4), each
node's share, and the time nodes spent in etcd round trips as a fraction of the epoch.

Each node is `metfs/examples/dds_reader.rs` reading real files from the dataset directory at a
capped rate (the straggler's cap is a quarter of the others'); etcd is a real one on loopback.

usage: python3 benches/dds_straggler.py [--samples 1200] [--rate 2000000] [--slot 2097152] [--runs 3]
       python3 benches/dds_straggler.py --quick   # 120 files, 4 MB/s, 256 KiB slots, 1 run

`METFS_BIN` picks the build whose `examples/dds_reader` runs; else the debug build.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib import ROOT, med

sys.path.insert(0, str(ROOT / "tests" / "stress"))

from conftest import Etcd, free_ports, make_tree  # noqa: E402
from dds_faults import reader_bin  # noqa: E402


def run_nodes(cmds: list[list[str]]) -> list[dict]:
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, text=True) for c in cmds]
    out = []
    for p in procs:
        o, _ = p.communicate(timeout=600)
        assert p.returncode == 0, o
        out.append(json.loads(o.strip().splitlines()[-1]))
    return out


def one_run(i: int, work: Path, src: Path, rate: int, slot: int) -> dict:
    exe = str(reader_bin())
    rates = [rate, rate, rate // 4]
    common = ["--source", str(src), "--slot", str(slot), "--epochs", "1", "--seed", "5"]
    static = run_nodes(
        [
            [
                exe,
                *common,
                "--log",
                str(work / f"s{i}-{r}.log"),
                "--static",
                f"{r}/3",
                "--rate",
                str(rates[r]),
            ]
            for r in range(3)
        ]
    )
    d = work / f"etcd{i}"
    d.mkdir()
    etcd = Etcd(d, *free_ports(2))
    etcd.start()
    try:
        dds = run_nodes(
            [
                [
                    exe,
                    *common,
                    "--log",
                    str(work / f"d{i}-{r}.log"),
                    "--url",
                    etcd.url("bench"),
                    "--node",
                    f"n{r}",
                    "--rate",
                    str(rates[r]),
                ]
                for r in range(3)
            ]
        )
    finally:
        etcd.kill()
    t_static = max(n["secs"] for n in static)
    t_dds = max(n["secs"] for n in dds)
    total = sum(n["samples"] for n in dds)
    return {
        "static_s": round(t_static, 3),
        "dds_s": round(t_dds, 3),
        "ratio": round(t_dds / t_static, 3),
        "dds_share": [round(n["samples"] / total, 3) for n in dds],
        "etcd_round_trips": [n["etcd_round_trips"] for n in dds],
        # All of a node's etcd round trips (polls while it waits for the others' last shards
        # included), and those of claims that gave work and of marking it done.
        "etcd_fraction": round(max(n["etcd_secs"] / t_dds for n in dds), 4),
        "etcd_busy_fraction": round(max(n["etcd_busy_secs"] / t_dds for n in dds), 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=1200)
    ap.add_argument("--rate", type=int, default=2_000_000, help="bytes/s of a fast node")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument(
        "--slot", type=int, default=2 << 20, help="bytes of a node's slot (shards are a quarter)"
    )
    ap.add_argument("--quick", action="store_true", help="120 files, 4 MB/s, 256 KiB slots, 1 run")
    a = ap.parse_args()
    if a.quick:
        a.samples, a.rate, a.slot, a.runs = 120, 4_000_000, 256 << 10, 1
    with tempfile.TemporaryDirectory() as t:
        work = Path(t)
        src = work / "src"
        files = make_tree(src, n=a.samples, seed=3, max_size=48 * 1024)
        size = sum(len(b) for b in files.values())
        print(
            f"dataset: {len(files)} files, {size} bytes; fast nodes {a.rate} B/s, slow node {a.rate // 4} B/s; "
            f"slot {a.slot} bytes"
        )
        runs = []
        for i in range(a.runs):
            r = one_run(i, work, src, a.rate, a.slot)
            print(json.dumps(r), flush=True)
            runs.append(r)
    medians = {
        k: med(r[k] for r in runs)
        for k in ("static_s", "dds_s", "ratio", "etcd_fraction", "etcd_busy_fraction")
    }
    print(json.dumps({"median": medians, "runs": len(runs)}))


if __name__ == "__main__":
    main()
