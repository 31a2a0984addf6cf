"""Aggregate-cache mode's exchange on the wire: uncoded against UberShuffle's coded packets
(`--shuffle-code uberShuffle`, peers mode: the holders send, each packet directly to each of
its receivers, `--broadcast direct`). Four daemons with real mounts on this machine and `mpirun -np 4 metfs-shuffle`,
one run per code and per cache size α, the fraction of the dataset a node holds:
α = 1/n + p(1 − 1/n), so each run mounts with `--shuffle-extra p = (α − 1/n)/(1 − 1/n)`, for
α = 1/4 (p = 0), 0.5 and 0.75. Each node's trainer is a separate process using the real client
and `metfs.passes` at rf 1, reading every file of its view; the exchanges fill epochs
1..`--epochs` (the last one staged ahead of the last trained epoch).

Printed per α, per exchange (mean over the exchanges, all nodes together; `metfs-shuffle`'s
reports):

* `α held`: the nodes' epoch-0 tier bytes (their whole caches) over the dataset's;
* `uncoded MiB`, `coded MiB`: bytes put on the wire, frames and headers (a coded packet once for
  each receiver it was sent to), and their ratio;
* `broadcast MiB`: the coded packets' payload bytes, each packet once: what a network that
  delivers one transmission to all of a packet's receivers would carry;
* `blocks`: 4 KiB blocks the coded exchange delivered (decoded by their receivers); `packets`:
  coded packets sent, each counted once; `packets/blocks`: the paper's measure, the coded transmissions
  per uncoded one (a block, the coding unit);
* `Theorem 1`: its predicted coded/uncoded ratio of transmissions for the paper's extra rank,
  which holds everything, `E[1/(K + 2)]` with `K ~ Bin(n − 2, p)` (`shuffle::theory::coded_ratio`;
  the script checks it against Theorem 1 as printed for p > 0).

Then (`--table modes`, or `both`, the default) who sends and how coded packets travel, side by
side at α = 0.5 and 0.75: the holders (`--sender peers`, `mpirun -np 4`) or the paper's extra
rank (`--sender extra`, `mpirun -np 5`: it reads what it sends from the tier), and coded
packets sent whole to each receiver (`--broadcast direct`) or by scatter-then-ring (`ring`,
Theorem 3). Per exchange (mean over the exchanges), all ranks together:

* `wire MiB`: bytes put on the wire, headers included; `payload MiB`: the frames' payload
  (what `shuffle::wire` counts; a unit test checks the ring's counts against its model);
* `messages`: MPI messages (one per pair and stage with something to send); `frames`: samples,
  whole packets to one receiver, or packet parts (forwarded ones included);
* `busiest port MiB`: the largest of any rank's bytes sent and received (an exchange takes at
  least that long at link bandwidth), and that rank (`x` for the extra rank);
* `tier MiB`: what the extra rank read from the tier; `stages`: ring stages;
* `secs`: the slowest rank's time per exchange (every rank on this one machine).

usage: python3 benches/aggregate_wire.py [--files 480] [--epochs 3] [--seed 7] [--table codes|modes|both]
       python3 benches/aggregate_wire.py --quick   # 48 files, 1 exchange, α = 0.5 only, the
                                                   # modes table without the holders' direct
                                                   # sends, which the codes table runs (seconds)

`METFS_BIN` picks the binary (and `metfs-shuffle` beside it); else the release build.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchlib
from benchlib import Mount

NODES = 4

TRAINER = r"""
import sys, metfs
sock, epochs = sys.argv[1:3]
c = metfs.Client(sock)
for p in metfs.passes(c, epochs=int(epochs)):
    for path in p.paths:
        with open(path, "rb") as f:
            f.read()
    p.report(loss=1.0)
"""


def make_dataset(root: Path, files: int) -> int:
    """`files` samples of 16-112 KiB (mean 64 KiB, not whole blocks); returns their bytes."""
    rng = random.Random(11)
    total = 0
    for i in range(files):
        p = root / f"c{i % 8}" / f"s{i:05d}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        data = rng.randbytes(rng.randrange(16 << 10, 112 << 10))
        p.write_bytes(data)
        total += len(data)
    return total


def theorem1(n: int, p: float) -> float:
    """`shuffle::theory::coded_ratio`: E[1/(K + 2)], K ~ Bin(n − 2, p)."""
    m = n - 2
    return sum(math.comb(m, k) * p**k * (1 - p) ** (m - k) / (k + 2) for k in range(m + 1))


def theorem1_as_printed(n: int, p: float) -> float:
    """Theorem 1's R_c over the uncoded q(1 − α), for q = 1 and p > 0."""
    r = 1 - p
    rc = 1 / (n * p) ** 2 * (r ** (n + 1) + (n - 1) * p * r - r * r)
    return rc / ((1 - 1 / n) * r)


def run(
    code: str, p: float, src: Path, work: Path, a: argparse.Namespace, flags: tuple[str, ...] = ()
) -> dict[str, Any]:
    args = [
        "--budget",
        "96MiB",
        "--nodes",
        str(NODES),
        "--rf",
        "1",
        "--rf-policy",
        "fixed",
        "--seed",
        str(a.seed),
        "--history",
        str(work / "h.json"),
        "--aggregate",
        "--shuffle-extra",
        f"{p:.6f}",
        "--shuffle-code",
        code,
        "--shuffle-timeout-secs",
        "300",
    ]
    mounts = [
        Mount(
            src,
            work / f"n{r}" / "cache",
            work / f"n{r}" / "mnt",
            metfs=benchlib.metfs_bin(),
            args=[*args, "--node-rank", str(r)],
        )
        for r in range(NODES)
    ]
    ex = None
    try:
        for m in mounts:
            m.cache.mkdir(parents=True)
            m.mount()
        # Epoch 0 is staged once every node has opened epoch 1's inbox (its staging waits for
        # the exchange, reading nothing): the tier bytes then are the nodes' whole caches.
        deadline = time.monotonic() + 300
        while not all((m.cache / "slots" / "inbox-e000001").is_dir() for m in mounts):
            if time.monotonic() > deadline:
                raise SystemExit("the nodes did not stage epoch 0")
            time.sleep(0.05)
        first = [m.status()["tier_bytes_read"] for m in mounts]
        shuffle = str(benchlib.shuffle_bin())
        env = benchlib.mpi_env()
        ranks = NODES + ("extra" in flags)
        ex = subprocess.Popen(
            [
                "mpirun",
                "-np",
                str(ranks),
                shuffle,
                "--cache",
                str(work / "n%r" / "cache"),
                "--epochs",
                str(a.epochs),
                *flags,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        env = benchlib.python_env()
        procs = [
            subprocess.Popen([sys.executable, "-c", TRAINER, m.socket, str(a.epochs)], env=env)
            for m in mounts
        ]
        for pr in procs:
            if pr.wait(timeout=1800) != 0:
                raise SystemExit(f"a trainer failed ({code}, p {p})")
        out, err = ex.communicate(timeout=600)
        if ex.returncode != 0:
            raise SystemExit(f"metfs-shuffle failed: {err[-2000:]}")
        rep = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        if len(rep) != ranks * a.epochs or any(
            r["rejected"] or r["missing"] or r["code"] != code for r in rep
        ):
            raise SystemExit(f"an exchange did not bring everything: {rep}")
        # Each exchange's busiest port: the largest of any rank's bytes sent and received.
        ports = [
            max((max(r["sent_bytes"], r["recv_bytes"]), r["rank"]) for r in rep if r["epoch"] == e)
            for e in sorted({r["epoch"] for r in rep})
        ]
        later = sum(m.status()["tier_bytes_read"] for m in mounts) - sum(first)
        if later:
            raise SystemExit(f"{later} tier bytes after epoch 0 ({code}, p {p})")
        k = a.epochs
        return {
            "first": sum(first),
            "wire": sum(r["sent_bytes"] for r in rep) / k,
            "packets": sum(r["packets"] for r in rep) / k,
            "packet_bytes": sum(r["packet_bytes"] for r in rep) / k,
            "blocks": sum(r["decoded_blocks"] for r in rep) / k,
            "samples": sum(r["received_samples"] for r in rep) / k,
            "plan_secs": max(r["plan_secs"] for r in rep),
            "secs": max(r["secs"] for r in rep),
            "payload": sum(r["payload_bytes"] for r in rep) / k,
            "messages": sum(r["messages"] for r in rep) / k,
            "frames": sum(r["frames"] for r in rep) / k,
            "port": sum(b for b, _ in ports) / k,
            "port_rank": max(set(r for _, r in ports), key=[r for _, r in ports].count),
            "tier": sum(r["tier_bytes"] for r in rep) / k,
            "stages": sum(r["stages"] for r in rep) / k,
            "exchange_secs": sum(
                max(r["secs"] for r in rep if r["epoch"] == e) for e in {r["epoch"] for r in rep}
            )
            / k,
        }
    finally:
        if ex is not None and ex.poll() is None:
            ex.kill()
        for m in mounts:
            m.close()


# (code, --sender, --broadcast) side by side in the modes table.
MODES = [
    ("uncoded", "peers", "direct"),
    ("uncoded", "extra", "direct"),
    ("uberShuffle", "peers", "direct"),
    ("uberShuffle", "peers", "ring"),
    ("uberShuffle", "extra", "direct"),
    ("uberShuffle", "extra", "ring"),
]


def modes_table(src: Path, tmp: Path, a: argparse.Namespace) -> None:
    # A quick run: one cache size, without the holders' direct sends (the codes table runs
    # both codes that way).
    alphas = (0.5,) if a.quick else (0.5, 0.75)
    modes = [m for m in MODES if m[1:] != ("peers", "direct")] if a.quick else MODES
    mib = 2**20
    print(
        "| α | code | sender | broadcast | wire MiB | payload MiB | messages | frames | busiest port MiB (rank) | tier MiB | stages | secs |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for alpha in alphas:
        p = (alpha - 1 / NODES) / (1 - 1 / NODES)
        for code, sender, broadcast in modes:
            work = tmp / f"{code}-{sender}-{broadcast}-{alpha:.3f}"
            work.mkdir()
            r = run(code, p, src, work, a, ("--sender", sender, "--broadcast", broadcast))
            rank = "x" if r["port_rank"] == NODES else str(r["port_rank"])
            print(
                f"| {alpha:.3f} | {code} | {sender} | {broadcast} | {r['wire'] / mib:.2f} | {r['payload'] / mib:.2f} | {r['messages']:.0f} "
                f"| {r['frames']:.0f} | {r['port'] / mib:.2f} ({rank}) | {r['tier'] / mib:.2f} | {r['stages']:.0f} | {r['exchange_secs']:.3f} |",
                flush=True,
            )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=480)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--table", choices=("codes", "modes", "both"), default="both")
    ap.add_argument(
        "--quick", action="store_true", help="48 files, 1 exchange, α = 0.5, fewer modes"
    )
    a = ap.parse_args()
    if a.quick:
        a.files, a.epochs = 48, 1
    benchlib.build()
    benchlib.build("metfs-exchange", bins=["metfs-shuffle"], features=["mpi"])
    with tempfile.TemporaryDirectory(prefix="metfs-wire-") as t:
        tmp = Path(t)
        src = tmp / "tier"
        total = make_dataset(src, a.files)
        print(
            f"dataset {a.files} files of 16-112 KiB ({total / 2**20:.1f} MiB), {NODES} nodes, "
            f"{a.epochs} exchanges per run; per exchange, all ranks"
        )
        print()
        if a.table != "codes":
            modes_table(src, tmp, a)
            print()
        if a.table == "modes":
            return
        print(
            "| α | p | α held | uncoded MiB | coded MiB | coded/uncoded | broadcast MiB | blocks | packets | packets/blocks | Theorem 1 | plan s |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for alpha in (0.5,) if a.quick else (1 / NODES, 0.5, 0.75):
            p = (alpha - 1 / NODES) / (1 - 1 / NODES)
            if p > 0:
                assert abs(theorem1(NODES, p) - theorem1_as_printed(NODES, p)) < 1e-9
            got = {}
            for code in ("uncoded", "uberShuffle"):
                work = tmp / f"{code}-{alpha:.3f}"
                work.mkdir()
                got[code] = run(code, p, src, work, a, ("--broadcast", "direct"))
            u, c = got["uncoded"], got["uberShuffle"]
            held = c["first"] / NODES / total
            mib = 2**20
            print(
                f"| {alpha:.3f} | {p:.3f} | {held:.3f} | {u['wire'] / mib:.2f} | {c['wire'] / mib:.2f} | {c['wire'] / u['wire']:.3f} "
                f"| {c['packet_bytes'] / mib:.2f} | {c['blocks']:.0f} | {c['packets']:.0f} | {c['packets'] / c['blocks']:.3f} | {theorem1(NODES, p):.3f} "
                f"| {c['plan_secs']:.3f} |"
            )


if __name__ == "__main__":
    main()
