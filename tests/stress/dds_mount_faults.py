"""Dynamic sharding through real mounts under faults: a real etcd, three `metfs mount --dds`
daemons on this machine, each with a reader that reads every file of each view it is shown
through the mount (its first pass), records (epoch, path, sha256) and ends passes; `kill -9` of
daemons at random moments (their mount is detached and the node mounted again as a new
incarnation, or never) and `kill -9` of etcd (restarted on its data directory).

Each trial runs until two epochs are DONE and checks, from etcd's records and the readers':
* every shard of both epochs is DONE exactly once, none TODO or DOING;
* 0 samples lost: every sample of each epoch was read through some mount, and every digest read
  equals the tier's;
* every sample read twice in an epoch was in a view of an incarnation that was killed or lost its
  lease (etcd away longer than the lease): its shards went back to the queue and another node
  read them again;
* a killed node's DOING shards went back to TODO within the lease TTL and one second (measured
  when another node was alive to notice; kills soon after etcd's restart apart, since etcd
  renews every lease when it becomes leader).

`python3 tests/stress/dds_mount_faults.py --trials 20 --out FILE` runs the full version (its
output is recorded in docs/DYNAMIC_SHARDING.md); `tests/test_dds_mount.py` runs a short trial.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from conftest import Etcd, Mount, free_ports, is_mounted
from dds_faults import doing_of, etcd_range

LEASE_S = 2
# Seconds of "training" per sample read: 480 samples on three nodes make an epoch of ~2 s.
STEP_S = 0.01


def dataset(root: Path, n: int, seed: int = 11) -> dict[str, str]:
    rng = random.Random(seed)
    digests = {}
    for i in range(n):
        rel = f"c{i % 6}/s{i:05d}.bin"
        data = rng.randbytes(rng.randrange(4 << 10, 24 << 10))
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        digests[rel] = hashlib.sha256(data).hexdigest()
    return digests


class Node:
    """One node: a daemon with its mount, and a reader thread for the current incarnation."""

    def __init__(self, name: str, root: Path, src: Path, url: str, seed: int) -> None:
        self.name = name
        self.m = Mount(
            src,
            root / f"cache-{name}",
            root / f"mnt-{name}",
            budget="3MiB",
            dds=url,
            node_name=name,
            rf=2,
            compose="stratified",
            seed=seed,
            dds_lease_ttl_secs=LEASE_S,
            history=root / f"h-{name}.json",
        )
        self.m.cache.mkdir(parents=True, exist_ok=True)
        self.inc = 0
        self.killed_incs: list[int] = []
        # Every incarnation seen (a restart, or joining again after a lost lease).
        self.incs: set[int] = set()
        self.starts = 0
        # (inc, epoch, path, sha256) of every first-pass read.
        self.reads: list[tuple[int, int, str, str]] = []
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()
        self.alive = False

    def start(self) -> None:
        if is_mounted(self.m.mountpoint):
            subprocess.run(
                ["umount", "-l", str(self.m.mountpoint)], capture_output=True, check=False
            )
        self.m.mount()
        self.inc = int(self.m.status()["dds"]["incarnation"])
        self.incs.add(self.inc)
        self.starts += 1
        self.alive = True
        self.stop = threading.Event()
        self.thread = threading.Thread(
            target=self.read_loop, args=(self.inc, self.stop), daemon=True
        )
        self.thread.start()

    def read_loop(self, inc: int, stop: threading.Event) -> None:
        seen: set[int] = set()
        try:
            while not stop.is_set():
                v = self.m.files()
                if v["generation"] not in seen:
                    seen.add(v["generation"])
                    # The incarnation now: a node that lost its lease (etcd away longer than
                    # it) joined again as a new one, and its old claims went back to the queue.
                    inc = int(self.m.status()["dds"]["incarnation"])
                    self.incs.add(inc)
                    got = []
                    for rel in v["files"]:
                        data = (self.m.mountpoint / rel).read_bytes()
                        got.append((inc, int(v["epoch"]), rel, hashlib.sha256(data).hexdigest()))
                        # A training step per sample: the epochs last long enough for the
                        # faults to land inside them.
                        time.sleep(STEP_S)
                    if stop.is_set():
                        return
                    self.reads.extend(got)
                r = self.m.pass_end()
                if r["decision"] != "advance":
                    time.sleep(0.01)
        except (OSError, AssertionError, ConnectionError, ValueError):
            if not stop.is_set():
                raise

    def kill_daemon(self) -> None:
        """`kill -9` of the daemon alone, for killing several nodes at one moment; `kill` then
        waits for the reader and detaches the mount."""
        self.stop.set()
        try:
            os.kill(self.m.pid(), signal.SIGKILL)
        except (ProcessLookupError, ValueError, FileNotFoundError):
            pass

    def kill(self) -> None:
        self.kill_daemon()
        self.killed_incs.append(self.inc)
        self.alive = False
        if self.thread is not None:
            self.thread.join(timeout=10)
        subprocess.run(["umount", "-l", str(self.m.mountpoint)], capture_output=True, check=False)

    def close(self) -> None:
        if self.alive:
            self.stop.set()
            self.m.umount(check=False)
            if self.thread is not None:
                self.thread.join(timeout=10)
            self.alive = False


def epochs_done(etcd: Etcd, prefix: str, epochs: int) -> bool:
    try:
        meta = etcd_range(etcd, f"{prefix}/meta")
        if not meta:
            return False
        shards = json.loads(meta[0][1])["shards"]
        return all(
            len(etcd_range(etcd, f"{prefix}/done/{e:010}/")) == shards for e in range(epochs)
        )
    except OSError:
        return False


def run_trial(
    seed: int,
    workdir: Path,
    n_samples: int = 480,
    epochs: int = 2,
    kills: int = 3,
    etcd_kills: int = 1,
) -> dict[str, Any]:
    rng = random.Random(seed)
    d = workdir / f"trial{seed}"
    src = d / "tier"
    digests = dataset(src, n_samples, seed)
    (d / "etcd").mkdir(parents=True)
    etcd = Etcd(d / "etcd", *free_ports(2))
    etcd.start()
    prefix = f"mfaults/{seed}"
    url = etcd.url(prefix)
    nodes = [Node(f"n{i}", d, src, url, seed) for i in range(3)]
    # Within the two epochs (~4 s undisturbed).
    events = sorted(
        [(rng.uniform(0.3, 3.5), "node") for _ in range(kills)]
        + [(rng.uniform(0.3, 3.5), "etcd") for _ in range(etcd_kills)]
    )
    log: list[str] = []
    requeue_s: list[float] = []
    requeue_after_etcd_s: list[float] = []
    etcd_back = -1e9
    t0 = time.monotonic()
    try:
        for n in nodes:
            n.start()
        t0 = time.monotonic()
        for at, what in events:
            time.sleep(max(0.0, at - (time.monotonic() - t0)))
            if what == "etcd":
                etcd.kill()
                log.append(f"{time.monotonic() - t0:.2f}s kill -9 etcd")
                time.sleep(rng.uniform(0.2, 1.5))
                etcd.start()
                etcd_back = time.monotonic()
                continue
            live = [n for n in nodes if n.alive]
            if not live:
                continue
            victim = rng.choice(live)
            victim.kill()
            killed_at = time.monotonic()
            held = doing_of(etcd, prefix, victim.name)
            log.append(
                f"{killed_at - t0:.2f}s kill -9 {victim.name} (inc {victim.inc}) holding {held} shards"
            )
            if held and any(n.alive for n in nodes):
                while (
                    doing_of(etcd, prefix, victim.name)
                    and time.monotonic() - killed_at < LEASE_S + 10
                ):
                    time.sleep(0.05)
                took = time.monotonic() - killed_at
                (requeue_after_etcd_s if killed_at - etcd_back < LEASE_S + 2 else requeue_s).append(
                    took
                )
                log.append(f"  given back after {took:.2f} s")
            if rng.random() < 2 / 3:
                victim.start()
                log.append(f"  mounted {victim.name} again (inc {victim.inc})")
        if not any(n.alive for n in nodes):
            nodes[0].start()
            log.append(f"  rescue: mounted {nodes[0].name} again")
        deadline = time.monotonic() + 60
        while not epochs_done(etcd, prefix, epochs):
            if time.monotonic() > deadline:
                states = {
                    n.name: (n.m.status() if n.alive else None, n.m.log()[-1500:]) for n in nodes
                }
                raise AssertionError(f"trial {seed}: epochs not done: {log}\n{states}")
            time.sleep(0.1)
        elapsed = time.monotonic() - t0
    finally:
        for n in nodes:
            n.close()
    try:
        return check(
            seed,
            etcd,
            prefix,
            nodes,
            digests,
            epochs,
            requeue_s,
            requeue_after_etcd_s,
            elapsed,
            log,
        )
    finally:
        etcd.kill()


def check(
    seed: int,
    etcd: Etcd,
    prefix: str,
    nodes: list[Node],
    digests: dict[str, str],
    epochs: int,
    requeue_s: list[float],
    requeue_after_etcd_s: list[float],
    elapsed: float,
    log: list[str],
) -> dict[str, Any]:
    shards = json.loads(etcd_range(etcd, f"{prefix}/meta")[0][1])["shards"]
    done: Counter[tuple[int, int]] = Counter()
    for k, _ in etcd_range(etcd, f"{prefix}/done/"):
        _, e, s = k.rsplit("/", 2)
        done[(int(e), int(s))] += 1
    for e in range(epochs):
        assert sum(1 for (de, _) in done if de == e) == shards, f"epoch {e}: not every shard DONE"
        for kind in ("todo", "doing"):
            left = etcd_range(etcd, f"{prefix}/{kind}/{e:010}/")
            assert not left, f"epoch {e}: shards left {kind.upper()}: {left[:3]}"
    bad = [(n.name, p) for n in nodes for (_, _, p, h) in n.reads if digests[p] != h]
    assert not bad, f"digests differ from the tier's: {bad[:5]}"
    read_twice = 0
    by_killed = 0
    for e in range(epochs):
        count: Counter[str] = Counter()
        killed_paths: set[str] = set()
        for n in nodes:
            # Incarnations that died or were replaced (their DOING shards went back).
            ended = set(n.killed_incs) | {i for i in n.incs if i < max(n.incs)}
            for inc, re_, p, _ in n.reads:
                if re_ == e:
                    count[p] += 1
                    if inc in ended:
                        killed_paths.add(p)
        lost = sorted(set(digests) - set(count))
        assert not lost, f"epoch {e}: {len(lost)} samples lost, e.g. {lost[:5]}: {log}"
        twice = [p for p, c in count.items() if c > 1]
        outside = [p for p in twice if p not in killed_paths]
        assert not outside, (
            f"epoch {e}: read twice outside the views of ended incarnations: {outside[:5]}: {log}"
        )
        read_twice += len(twice)
        by_killed += len(killed_paths)
    worst = max(requeue_s, default=0.0)
    assert worst <= LEASE_S + 1.0, (
        f"a dead node's shards went back after {worst:.2f} s (lease {LEASE_S} s): {log}"
    )
    worst_after_etcd = max(requeue_after_etcd_s, default=0.0)
    assert worst_after_etcd <= LEASE_S + 4.0, (
        f"given back {worst_after_etcd:.2f} s after a kill soon after etcd's restart: {log}"
    )
    per_node: dict[str, int] = defaultdict(int)
    for n in nodes:
        per_node[n.name] += len(n.reads)
    return {
        "seed": seed,
        "shards": shards,
        "samples": len(digests),
        "epochs": epochs,
        "seconds": round(elapsed, 2),
        "samples_lost": 0,
        "read_twice": read_twice,
        "read_by_killed_incarnations": by_killed,
        "requeue_s": [round(x, 2) for x in requeue_s],
        "requeue_after_etcd_restart_s": [round(x, 2) for x in requeue_after_etcd_s],
        "reads_per_node": dict(per_node),
        "lease_rejoins": sum(len(n.incs) - n.starts for n in nodes),
        "events": log,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--samples", type=int, default=480)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--first", type=int, default=0, help="seed of the first trial")
    a = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as t:
        for seed in range(a.first, a.first + a.trials):
            r = run_trial(seed, Path(t), a.samples)
            results.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "events"}), flush=True)
    summary = {
        "trials": len(results),
        "samples_lost": sum(r["samples_lost"] for r in results),
        "read_twice": sum(r["read_twice"] for r in results),
        "read_by_killed_incarnations": sum(r["read_by_killed_incarnations"] for r in results),
        "requeue_s_max": max((x for r in results for x in r["requeue_s"]), default=None),
        "requeue_s_measured": sum(len(r["requeue_s"]) for r in results),
        "lease_rejoins": sum(r["lease_rejoins"] for r in results),
        "median_trial_s": sorted(r["seconds"] for r in results)[len(results) // 2],
    }
    print(json.dumps(summary))
    if a.out:
        a.out.write_text(json.dumps({"summary": summary, "trials": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
