"""Aggregate-cache mode against re-reading the tier: four nodes (four daemons with real mounts on
this machine, and `mpirun -np 4 metfs-shuffle`) train the same epochs two ways, side by side in
one run, the tier capped at the same bandwidth per node (`--prefetch-rate`, the staging cap, which
paces tier reads only):

* `tier`: `--nodes 4 --node-rank r --mini-epochs 1`: each node reads its share of every epoch
  from the tier (what a multi-node job does without aggregate mode);
* `aggregate`: `--aggregate`: the tier is read in epoch 0, later shares come from the other
  nodes by `metfs-shuffle` (uncoded, `--shuffle-extra` as given).

Each node's trainer is a separate process using the real client and `metfs.passes` at a fixed
rf of 1, reading every file of every pass through the mount. Printed per mode (medians over
`--runs`, the order of the modes rotating): the tier bytes per epoch after epoch 0 (all nodes,
`tier_bytes_read` from `status` less what the event log's `staged` records fetched for epochs
after the trained ones), the seconds to fill a node's next slot (the slowest node's staging
of each epoch after the first, the wait for the exchange included, from the same records), the
seconds per epoch after epoch 0 as the trainers see them, and their ratios to `tier`; for aggregate mode also the bytes
the exchange sent per epoch (`metfs-shuffle`'s reports).

usage: python3 benches/aggregate.py [--files 480] [--kib 64] [--epochs 4] [--cap 16MiB/s]
       [--runs 3] [--extra 0]
       python3 benches/aggregate.py --quick   # 48 files of 16 KiB, 2 epochs, 1 run (seconds)

`METFS_BIN` picks the binary (and `metfs-shuffle` beside it); else the release build.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import benchlib
from benchlib import Mount, med

NODES = 4

TRAINER = r"""
import json, sys, time, metfs
sock, out, epochs = sys.argv[1:4]
c = metfs.Client(sock)
starts = {}
for p in metfs.passes(c, epochs=int(epochs)):
    starts.setdefault(p.epoch, time.monotonic())
    for path in p.paths:
        with open(path, "rb") as f:
            f.read()
    p.report(loss=1.0)
end = time.monotonic()
json.dump({"starts": [starts[e] for e in sorted(starts)], "end": end}, open(out, "w"))
"""


def make_dataset(root: Path, files: int, kib: int) -> None:
    rng = random.Random(11)
    for i in range(files):
        p = root / f"c{i % 8}" / f"s{i:05d}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rng.randbytes(kib << 10))


def staged(m: Mount) -> list[dict[str, Any]]:
    """The `staged` records of a daemon's event log."""
    lines = (m.cache / "run" / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e.get("event") == "staged"]


def run(mode: str, src: Path, work: Path, a: argparse.Namespace) -> dict[str, Any]:
    budget = "24MiB"
    common = [
        "--budget",
        budget,
        "--nodes",
        str(NODES),
        "--rf",
        "1",
        "--rf-policy",
        "fixed",
        "--seed",
        "7",
        "--prefetch-rate",
        a.cap,
        "--history",
        str(work / "h.json"),
    ]
    extra = (
        ["--aggregate", "--shuffle-extra", str(a.extra), "--shuffle-timeout-secs", "120"]
        if mode == "aggregate"
        else ["--mini-epochs", "1"]
    )
    mounts = [
        Mount(
            src,
            work / f"n{r}" / "cache",
            work / f"n{r}" / "mnt",
            metfs=benchlib.metfs_bin(),
            args=[*common, "--node-rank", str(r), *extra],
        )
        for r in range(NODES)
    ]
    ex = None
    try:
        for m in mounts:
            m.cache.mkdir(parents=True)
            m.mount()
        if mode == "aggregate":
            shuffle = str(benchlib.shuffle_bin())
            env = benchlib.mpi_env()
            # Epochs 1 to `epochs`: the trained ones and the one each node stages once done.
            ex = subprocess.Popen(
                [
                    "mpirun",
                    "-np",
                    str(NODES),
                    shuffle,
                    "--cache",
                    str(work / "n%r" / "cache"),
                    "--epochs",
                    str(a.epochs),
                ],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        env = benchlib.python_env()
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", TRAINER, m.socket, str(work / f"t{r}.json"), str(a.epochs)],
                env=env,
            )
            for r, m in enumerate(mounts)
        ]
        for p in procs:
            if p.wait(timeout=1800) != 0:
                raise SystemExit(f"a trainer failed in mode {mode}")
        res = [json.loads((work / f"t{r}.json").read_text()) for r in range(NODES)]
        sent = 0
        if ex is not None:
            out, err = ex.communicate(timeout=600)
            if ex.returncode != 0:
                raise SystemExit(f"metfs-shuffle failed: {err[-2000:]}")
            sent = sum(
                json.loads(line)["sent_bytes"] for line in out.splitlines() if line.startswith("{")
            )
        # Tier bytes of the epochs trained: what each daemon read, less what it fetched for
        # epochs after them (staged once its trainer was done).
        events = [staged(m) for m in mounts]
        tier = [
            m.status()["tier_bytes_read"]
            - sum(e["bytes_fetched"] for e in ev if e["epoch"] >= a.epochs)
            for m, ev in zip(mounts, events, strict=True)
        ]
        # The time to fill a node's next slot (the exchange's wait included): per epoch after
        # the first, the slowest node's staging.
        fill = [
            max(e["secs"] for ev in events for e in ev if e["epoch"] == k)
            for k in range(1, a.epochs)
        ]
        # Per epoch after the first: the slowest node's time from its start to the next's.
        starts = [r["starts"] + [r["end"]] for r in res]
        per_epoch = [max(s[e + 1] - s[e] for s in starts) for e in range(1, a.epochs)]
        return {
            "tier": sum(tier),
            "secs": med(per_epoch),
            "fill": med(fill),
            "sent": sent,
        }
    finally:
        if ex is not None and ex.poll() is None:
            ex.kill()
        for m in mounts:
            m.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=480)
    ap.add_argument("--kib", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--cap", default="16MiB/s")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--extra", type=float, default=0.0)
    ap.add_argument("--quick", action="store_true", help="48 files of 16 KiB, 2 epochs, 1 run")
    a = ap.parse_args()
    if a.quick:
        a.files, a.kib, a.epochs, a.runs = 48, 16, 2, 1
    benchlib.build()
    benchlib.build("metfs-exchange", bins=["metfs-shuffle"], features=["mpi"])
    with tempfile.TemporaryDirectory(prefix="metfs-aggregate-") as t:
        tmp = Path(t)
        src = tmp / "tier"
        make_dataset(src, a.files, a.kib)
        total = a.files * a.kib << 10
        print(
            f"dataset {a.files} files of {a.kib} KiB ({total / 2**20:.1f} MiB), {NODES} nodes, {a.epochs} epochs at rf 1, tier capped at {a.cap} per node, {a.runs} runs, medians"
        )
        got: dict[str, list[dict[str, Any]]] = {"tier": [], "aggregate": []}
        for r in range(a.runs):
            order = ["tier", "aggregate"] if r % 2 == 0 else ["aggregate", "tier"]
            for mode in order:
                work = tmp / f"{mode}-{r}"
                work.mkdir()
                got[mode].append(run(mode, src, work, a))
                shutil.rmtree(work, ignore_errors=True)
        print()
        print(
            "| mode | tier bytes per epoch after epoch 0 | seconds to fill the next slot | ratio to tier | seconds per epoch | ratio to tier | exchange bytes per epoch |"
        )
        print("|---|---|---|---|---|---|---|")
        base = med(g["secs"] for g in got["tier"])
        base_fill = med(g["fill"] for g in got["tier"])
        for mode, g in got.items():
            # Epoch 0 is read from the tier in every mode.
            later = med((x["tier"] - total) / (a.epochs - 1) for x in g)
            secs = med(x["secs"] for x in g)
            fill = med(x["fill"] for x in g)
            sent = med(x["sent"] / a.epochs for x in g)
            print(
                f"| {mode} | {later / 2**20:.2f} MiB | {fill:.2f} | {benchlib.ratio(fill, base_fill)} | {secs:.2f} | {benchlib.ratio(secs, base)} | {sent / 2**20:.2f} MiB |"
            )


if __name__ == "__main__":
    main()
