"""The dynamic-sharding queue under faults: a real etcd, three reader processes
(`metfs/examples/dds_reader.rs`, each a node that claims shards, reads their samples from the
dataset directory, fsyncs a log of every read and marks the shards done), `kill -9` of readers
at random moments (restarted, or never) and `kill -9` of etcd (restarted on its data dir).

Each trial runs 2 epochs and checks, from etcd's own records and the readers' logs:
* every shard of every epoch is DONE exactly once, and nothing is TODO or DOING at the end;
* 0 samples lost: the incarnations that marked the shards DONE read every sample of the epoch
  exactly once between them;
* every sample read twice belongs to a shard a killed incarnation held (DOING) when it died;
* a killed node's DOING shards went back to TODO within the lease TTL and one second (measured
  when another node was alive to notice). A kill within TTL + 2 s after etcd came back is
  measured apart: etcd renews every lease when it becomes leader (to TTL plus its election
  timeout), so there the bound is the TTL plus that renewal and etcd's own start.

`python3 tests/stress/dds_faults.py --trials 20 --out FILE` runs the full version (its output is
recorded in docs/DYNAMIC_SHARDING.md); `tests/test_dds.py` runs one short trial.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))

from conftest import Etcd, free_ports, make_tree  # noqa: E402

LEASE_S = 2


def reader_bin() -> Path:
    target = Path(os.environ.get("METFS_BIN", ROOT / "target" / "debug" / "metfs")).parent
    exe = target / "examples" / "dds_reader"
    if not exe.exists():
        subprocess.run(
            ["cargo", "build", "-q", "-p", "metfs", "--example", "dds_reader"], cwd=ROOT, check=True
        )
        exe = ROOT / "target" / "debug" / "examples" / "dds_reader"
    return exe


def etcd_range(etcd: Etcd, prefix: str) -> list[tuple[str, bytes]]:
    """Keys and values under `prefix`, through etcd's JSON gateway."""
    p = prefix.encode()
    end = p[:-1] + bytes([p[-1] + 1])
    body = json.dumps(
        {"key": base64.b64encode(p).decode(), "range_end": base64.b64encode(end).decode()}
    ).encode()
    req = urllib.request.Request(f"http://{etcd.endpoint}/v3/kv/range", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=2) as r:
        kvs = json.load(r).get("kvs", [])
    return [
        (base64.b64decode(kv["key"]).decode(), base64.b64decode(kv.get("value", ""))) for kv in kvs
    ]


def doing_of(etcd: Etcd, prefix: str, node: str) -> int:
    return sum(1 for _, v in etcd_range(etcd, f"{prefix}/doing/") if json.loads(v)["node"] == node)


class Node:
    def __init__(self, name: str, exe: Path, src: Path, log: Path, url: str, args: list[str]):
        self.name, self.exe, self.src, self.log, self.url, self.args = (
            name,
            exe,
            src,
            log,
            url,
            args,
        )
        self.proc: subprocess.Popen[str] | None = None
        self.killed_incs: list[int] = []

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                str(self.exe),
                "--source",
                str(self.src),
                "--log",
                str(self.log),
                "--url",
                self.url,
                "--node",
                self.name,
                *self.args,
            ],
            stdout=subprocess.PIPE,
            stderr=open(str(self.log) + ".err", "a"),
            text=True,
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def current_inc(self) -> int | None:
        incs = [int(l.split()[2]) for l in read_lines(self.log) if l.startswith("start ")]
        return incs[-1] if incs else None

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        inc = self.current_inc()
        if inc is not None:
            self.killed_incs.append(inc)


def read_lines(p: Path) -> list[str]:
    try:
        return p.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return []


def run_trial(
    seed: int,
    workdir: Path,
    src: Path,
    n_samples: int,
    epochs: int = 2,
    reader_kills: int = 3,
    etcd_kills: int = 1,
    rate: int = 1_500_000,
) -> dict[str, Any]:
    rng = random.Random(seed)
    d = workdir / f"trial{seed}"
    (d / "etcd").mkdir(parents=True)
    etcd = Etcd(d / "etcd", *free_ports(2))
    etcd.start()
    prefix = f"faults/{seed}"
    url = etcd.url(prefix)
    exe = reader_bin()
    args = [
        "--slot",
        str(256 * 1024),
        "--lease",
        str(LEASE_S),
        "--epochs",
        str(epochs),
        "--rate",
        str(rate),
        "--compose",
        "stratified",
        "--seed",
        str(seed),
    ]
    nodes = [Node(f"n{i}", exe, src, d / f"n{i}.log", url, args) for i in range(3)]
    for n in nodes:
        n.start()
    events = sorted(
        [(rng.uniform(0.3, 4.0), "reader") for _ in range(reader_kills)]
        + [(rng.uniform(0.3, 4.0), "etcd") for _ in range(etcd_kills)]
    )
    t0 = time.monotonic()
    requeue_s: list[float] = []
    # Kills soon after etcd came back: etcd renews every lease when it elects itself leader
    # (TTL plus its election timeout, 1 s), so these are measured apart.
    requeue_after_etcd_s: list[float] = []
    etcd_back = -1e9
    unmeasured = 0
    log: list[str] = []
    try:
        for at, what in events:
            time.sleep(max(0.0, at - (time.monotonic() - t0)))
            if what == "etcd":
                etcd.kill()
                log.append(f"{time.monotonic() - t0:.2f}s kill -9 etcd")
                time.sleep(rng.uniform(0.2, 1.5))
                etcd.start()
                etcd_back = time.monotonic()
                continue
            live = [n for n in nodes if n.alive()]
            if not live:
                continue
            victim = rng.choice(live)
            victim.kill()
            killed_at = time.monotonic()
            # Counted after the kill: what the dead node held and nobody has given back yet.
            held = doing_of(etcd, prefix, victim.name)
            log.append(
                f"{killed_at - t0:.2f}s kill -9 {victim.name} holding {held} shards"
                f" ({[n.name for n in nodes if n.alive()]} alive)"
            )
            others = [n for n in nodes if n.alive()]
            if held and others:
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
            elif held:
                unmeasured += 1
            if rng.random() < 2 / 3:
                victim.start()
                log.append(f"  restarted {victim.name}")
        # Whatever was killed for good, the survivors (or a rescue node) finish the epochs.
        if not any(n.alive() for n in nodes):
            rescue = Node("rescue", exe, src, d / "rescue.log", url, args)
            rescue.start()
            nodes.append(rescue)
        deadline = time.monotonic() + 120
        for n in nodes:
            if n.proc is not None:
                try:
                    n.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired as e:
                    raise AssertionError(f"trial {seed}: {n.name} did not finish: {log}") from e
        elapsed = time.monotonic() - t0
        r = check(seed, etcd, prefix, nodes, n_samples, epochs, requeue_s, unmeasured, elapsed, log)
        worst = max(requeue_after_etcd_s, default=0.0)
        assert worst <= LEASE_S + 4.0, (
            f"given back {worst:.2f} s after a kill soon after etcd's restart: {log}"
        )
        r["requeue_after_etcd_restart_s"] = [round(x, 2) for x in requeue_after_etcd_s]
        return r
    finally:
        for n in nodes:
            if n.alive():
                n.kill()
        etcd.kill()


def check(
    seed: int,
    etcd: Etcd,
    prefix: str,
    nodes: list[Node],
    n_samples: int,
    epochs: int,
    requeue_s: list[float],
    unmeasured: int,
    elapsed: float,
    events: list[str],
) -> dict[str, Any]:
    meta = json.loads(etcd_range(etcd, f"{prefix}/meta")[0][1])
    shards = meta["shards"]
    assert not etcd_range(etcd, f"{prefix}/doing/"), "shards left DOING"
    assert not etcd_range(etcd, f"{prefix}/todo/"), "shards left TODO"
    done: dict[tuple[int, int], tuple[str, int]] = {}
    for k, v in etcd_range(etcd, f"{prefix}/done/"):
        _, e, s = k.rsplit("/", 2)
        h = json.loads(v)
        done[(int(e), int(s))] = (h["node"], h["inc"])
    for e in range(epochs):
        assert sum(1 for (de, _) in done if de == e) == shards, f"epoch {e}: not every shard DONE"
    # Reads by incarnation: (node, inc) -> (epoch, shard) -> sample ids.
    reads: dict[tuple[str, int], dict[tuple[int, int], list[int]]] = defaultdict(
        lambda: defaultdict(list)
    )
    killed = {(n.name, i) for n in nodes for i in n.killed_incs}
    for n in nodes:
        inc = None
        for line in read_lines(n.log):
            f = line.split()
            if len(f) == 3 and f[0] == "start":
                inc = int(f[2])
            elif len(f) == 5 and f[0] == "read" and inc is not None:
                reads[(n.name, inc)][(int(f[1]), int(f[2]))].append(int(f[3]))
    read_twice = 0
    doing_of_killed = 0
    for e in range(epochs):
        by_done = Counter()
        for (de, s), holder in done.items():
            if de == e:
                by_done.update(reads[holder][(e, s)])
        lost = [i for i in range(n_samples) if by_done[i] == 0]
        assert not lost, f"epoch {e}: {len(lost)} samples lost, e.g. {lost[:5]}"
        assert all(c == 1 for c in by_done.values()), f"epoch {e}: a sample twice among DONE shards"
        # Every other read of a sample is of a shard a killed incarnation held when it died.
        allowed: set[int] = set()
        for inc_key, shards_read in reads.items():
            for (se, s), ids in shards_read.items():
                if se == e and done.get((se, s)) != inc_key:
                    assert inc_key in killed, (
                        f"{inc_key} read shard {s} of epoch {e} without marking it DONE, and was not killed"
                    )
                    allowed.update(ids)
                    doing_of_killed += len(ids)
        all_reads = Counter()
        for shards_read in reads.values():
            for (se, _), ids in shards_read.items():
                if se == e:
                    all_reads.update(ids)
        twice = [i for i, c in all_reads.items() if c > 1]
        assert all(i in allowed for i in twice), (
            f"epoch {e}: a sample read twice outside a killed node's shards"
        )
        read_twice += len(twice)
    worst = max(requeue_s, default=0.0)
    assert worst <= LEASE_S + 1.0, (
        f"a dead node's shards went back after {worst:.2f} s (lease {LEASE_S} s): {events}"
    )
    return {
        "seed": seed,
        "shards": shards,
        "samples": n_samples,
        "epochs": epochs,
        "seconds": round(elapsed, 2),
        "samples_lost": 0,
        "read_twice": read_twice,
        "read_by_killed_not_done": doing_of_killed,
        "requeue_s": [round(x, 2) for x in requeue_s],
        "requeue_unmeasured": unmeasured,
        "events": events,
    }


def dataset(root: Path, n: int) -> Path:
    src = root / "src"
    make_tree(src, n=n, seed=11, max_size=24 * 1024)
    return src


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--samples", type=int, default=240)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as t:
        src = dataset(Path(t), a.samples)
        for seed in range(a.trials):
            r = run_trial(seed, Path(t), src, a.samples)
            print(json.dumps(r), flush=True)
            results.append(r)
    rq = [x for r in results for x in r["requeue_s"]]
    rqe = [x for r in results for x in r["requeue_after_etcd_restart_s"]]
    summary = {
        "trials": len(results),
        "passed": len(results),
        "samples_lost": 0,
        "read_twice_total": sum(r["read_twice"] for r in results),
        "read_by_killed_not_done_total": sum(r["read_by_killed_not_done"] for r in results),
        "requeues_measured": len(rq),
        "requeue_max_s": max(rq, default=0.0),
        "requeue_median_s": sorted(rq)[len(rq) // 2] if rq else 0.0,
        "lease_s": LEASE_S,
        "requeues_after_etcd_restart": len(rqe),
        "requeue_after_etcd_restart_max_s": max(rqe, default=0.0),
    }
    print(json.dumps(summary))
    if a.out:
        a.out.write_text(json.dumps({"summary": summary, "trials": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
