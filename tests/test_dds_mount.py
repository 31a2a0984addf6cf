"""Dynamic sharding through real mounts (`metfs mount --dds`): several daemons on one etcd
queue, each with a real FUSE mount and a reader that records every (epoch, path, sha256) it
reads through it."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from conftest import Etcd, Mount

sys.path.insert(0, str(Path(__file__).parent / "stress"))
import dds_faults


def make_dataset(root: Path, n: int) -> dict[str, str]:
    """`n` files of 6-20 KiB in 4 class directories: {path: sha256}."""
    rng = random.Random(5)
    digests = {}
    for i in range(n):
        rel = f"c{i % 4}/s{i:04d}.bin"
        data = rng.randbytes(rng.randrange(6 << 10, 20 << 10))
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        digests[rel] = hashlib.sha256(data).hexdigest()
    return digests


class Reader(threading.Thread):
    """Reads every file of its node's view once per view (the first pass), checks nothing
    itself, records each view's files and every (epoch, path, sha256) read, and ends passes
    until told to stop."""

    def __init__(self, m: Mount) -> None:
        super().__init__(daemon=True)
        self.m = m
        self.views: list[list[str]] = []
        self.reads: list[tuple[int, str, str]] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            seen: set[int] = set()
            while not self.stop.is_set():
                v = self.m.files()
                if v["generation"] not in seen:
                    seen.add(v["generation"])
                    self.views.append(list(v["files"]))
                    for rel in v["files"]:
                        data = (self.m.mountpoint / rel).read_bytes()
                        self.reads.append((v["epoch"], rel, hashlib.sha256(data).hexdigest()))
                r = self.m.pass_end()
                if r["decision"] != "advance":
                    time.sleep(0.02)
        except (OSError, AssertionError, ConnectionError, json.JSONDecodeError) as e:
            if not self.stop.is_set():
                self.error = e


def done_shards(etcd: Etcd, prefix: str, epoch: int) -> list[dict[str, Any]]:
    return [json.loads(v) for _, v in dds_faults.etcd_range(etcd, f"{prefix}/done/{epoch:010}/")]


def shards(etcd: Etcd, prefix: str) -> int:
    return int(json.loads(dds_faults.etcd_range(etcd, f"{prefix}/meta")[0][1])["shards"])


def wait_epoch_done(etcd: Etcd, prefix: str, epoch: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(done_shards(etcd, prefix, epoch)) < shards(etcd, prefix):
        assert time.monotonic() < deadline, (
            f"epoch {epoch} not done: {len(done_shards(etcd, prefix, epoch))}/{shards(etcd, prefix)}"
        )
        time.sleep(0.1)


def dds_mounts(
    mounts: Any, src: Path, etcd: Etcd, prefix: str, n: int, *extra: str, **settings: Any
) -> list[Mount]:
    """`n` nodes `n0`... of the queue at `prefix`, stratified, rf 1, a lease of 2 s; `extra`
    flags and `settings` (the fixture's keyword settings) added."""
    return [
        mounts(
            src,
            "2MiB",
            "--dds",
            etcd.url(prefix),
            "--node-name",
            f"n{i}",
            "--rf",
            "1",
            "--compose",
            "stratified",
            "--dds-lease-ttl-secs",
            "2",
            *extra,
            name=f"n{i}",
            **settings,
        )
        for i in range(n)
    ]


def test_two_nodes_share_an_epoch_each_sample_once(
    mounts: Any, etcd: Etcd, tmp_path: Path, metfs: str
) -> None:
    src = tmp_path / "tier"
    digests = make_dataset(src, 120)
    ms = dds_mounts(mounts, src, etcd, "two", 2)
    for m in ms:
        m.mount()
    st = ms[0].status()
    assert st["dds"]["node"] == "n0" and st["dds"]["url"] == etcd.url("two"), st["dds"]
    readers = [Reader(m) for m in ms]
    for r in readers:
        r.start()
    wait_epoch_done(etcd, "two", 0, 90)
    for r in readers:
        r.stop.set()
    for r in readers:
        r.join(timeout=30)
        assert r.error is None, r.error
    epoch0 = [(p, h) for r in readers for (e, p, h) in r.reads if e == 0]
    paths = [p for p, _ in epoch0]
    # Every sample of the epoch was read, through one node or the other, exactly once, with
    # the tier's bytes; both nodes took part.
    assert sorted(paths) == sorted(digests), (len(paths), len(digests))
    assert all(digests[p] == h for p, h in epoch0)
    assert all(any(e == 0 for e, _, _ in r.reads) for r in readers)
    holders = {d["node"] for d in done_shards(etcd, "two", 0)}
    assert holders == {"n0", "n1"}, holders
    st = ms[1].status()["dds"]
    assert st["done_shards"] > 0 and st["last_error"] is None, st
    out = subprocess.run(
        [metfs, "status", "--socket", ms[1].socket], capture_output=True, text=True, check=True
    ).stdout
    assert f"queue: {etcd.url('two')} as node n1" in out, out


def test_a_killed_node_loses_no_sample(mounts: Any, etcd: Etcd, tmp_path: Path) -> None:
    """One of two daemons is `kill -9`ed with its reader mid-epoch: its DOING shards go back to
    the queue when its lease expires and the other node reads them; nothing is lost."""
    src = tmp_path / "tier"
    digests = make_dataset(src, 120)
    ms = dds_mounts(mounts, src, etcd, "kill", 2, "--shard-done", "after-rf")
    for m in ms:
        m.mount()
    readers = [Reader(m) for m in ms]
    for r in readers:
        r.start()
    # Kill node 1 once it has read something but before the epoch ends.
    deadline = time.monotonic() + 60
    while not readers[1].reads:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    pid = ms[1].pid()
    readers[1].stop.set()
    os.kill(pid, signal.SIGKILL)
    subprocess.run(["umount", "-l", str(ms[1].mountpoint)], capture_output=True, check=False)
    wait_epoch_done(etcd, "kill", 0, 90)
    readers[0].stop.set()
    readers[0].join(timeout=30)
    assert readers[0].error is None, readers[0].error
    read = {p for r in readers for (e, p, h) in r.reads if e == 0 and digests[p] == h}
    assert read == set(digests), sorted(set(digests) - read)
    # Every shard of the epoch is DONE exactly once, each sample once among them.
    done = done_shards(etcd, "kill", 0)
    assert len(done) == shards(etcd, "kill")
    st = ms[0].status()["dds"]
    assert st["done_shards"] >= 1 and st["last_error"] is None, st


def test_an_unreachable_etcd_is_a_clear_error(mounts: Any, tmp_path: Path) -> None:
    src = tmp_path / "tier"
    make_dataset(src, 8)
    m = mounts(src, "2MiB", "--dds", "etcd://127.0.0.1:9/q", "--dds-timeout-secs", "1")
    r = m.mount(check=False)
    assert r.returncode != 0
    assert "127.0.0.1:9" in r.stderr and "unreachable" in r.stderr, r.stderr


def test_a_queue_of_another_dataset_is_refused(mounts: Any, etcd: Etcd, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    make_dataset(a, 40)
    make_dataset(b, 50)
    first = mounts(a, "2MiB", "--dds", etcd.url("same"), "--node-name", "x", name="a")
    first.mount()
    other = mounts(b, "2MiB", "--dds", etcd.url("same"), "--node-name", "y", name="b")
    r = other.mount(check=False)
    assert r.returncode != 0
    assert "was made for" in r.stderr and etcd.url("same") in r.stderr, r.stderr


def test_etcd_lost_mid_run_the_view_keeps_serving(mounts: Any, etcd: Etcd, tmp_path: Path) -> None:
    """etcd is `kill -9`ed under a running node: reads of the view go on, `pass_end` keeps
    answering (repeat or wait: bonus passes), status names the error; once etcd is back on
    its data directory the node marks its shards done and moves on."""
    src = tmp_path / "tier"
    digests = make_dataset(src, 120)
    (m,) = dds_mounts(mounts, src, etcd, "outage", 1)
    m.mount()
    m.wait_next_ready()
    etcd.kill()
    seen = set()
    deadline = time.monotonic() + 60
    while True:
        v = m.files()
        for rel in v["files"]:
            assert hashlib.sha256((m.mountpoint / rel).read_bytes()).hexdigest() == digests[rel]
        seen.add(v["generation"])
        r = m.pass_end()
        assert r["decision"] in ("repeat", "wait", "advance"), r
        err = m.status()["dds"]["last_error"]
        if err and len(seen) >= 2:
            break
        assert time.monotonic() < deadline, m.status()
        time.sleep(0.05)
    assert "etcd" in err, err
    # Back on its data directory: the queue is as it was, the node goes on.
    etcd.start()
    before = m.status()["dds"]["done_shards"]
    deadline = time.monotonic() + 60
    while True:
        m.pass_end()
        st = m.status()["dds"]
        if st["last_error"] is None and st["done_shards"] > before and st["pending_done"] == 0:
            break
        assert time.monotonic() < deadline, st
        time.sleep(0.1)


def test_a_short_fault_trial_through_mounts(tmp_path: Path) -> None:
    """One trial of `tests/stress/dds_mount_faults.py` (three mounts, `kill -9` of two daemons and
    of etcd, two epochs): no sample lost, every shard DONE once, every double read in a killed
    node's views, shards of a dead node back within the lease and a second."""
    import dds_mount_faults

    r = dds_mount_faults.run_trial(3, tmp_path, n_samples=240, kills=2, etcd_kills=1)
    assert r["samples_lost"] == 0 and r["epochs"] == 2, r


def test_adjust_bs_takes_each_ranks_node_from_its_daemon(
    mounts: Any, etcd: Etcd, tmp_path: Path
) -> None:
    """ADJUST_BS through the real Python package: two ranks of a job, each on its own node's
    mount, take their node names from their daemons' queue (`--node-name`) at the start step
    and split the global batch between the nodes; a rank on a mount without `--dds` takes
    Slurm's node name instead."""
    pkg = str(Path(__file__).resolve().parents[1] / "bindings" / "python" / "src")
    sys.path.insert(0, pkg)
    from metfs import Client
    from metfs.coordinator import Coordinator
    from metfs.batchsize import AdjustBs

    class Threads(Coordinator):
        """The collective of ranks that are threads of this test."""

        def __init__(self, world: int) -> None:
            self.slots: list[Any] = [None] * world
            self.barrier = threading.Barrier(world, timeout=30)
            self.rank = threading.local()

        def pass_end(self, client: Any, metrics: Any, block: bool) -> Any:
            raise NotImplementedError

        def all_gather(self, obj: dict[str, Any]) -> list[dict[str, Any]]:
            self.slots[self.rank.value] = obj
            self.barrier.wait()
            out = list(self.slots)
            self.barrier.wait()
            return out

    src = tmp_path / "tier"
    make_dataset(src, 40)
    ms = dds_mounts(mounts, src, etcd, "bs", 2)
    plain = mounts(src, "2MiB", name="plain")
    for m in [*ms, plain]:
        m.mount()
    socks = [ms[0].socket, ms[1].socket, plain.socket]
    job = Threads(3)
    got: list[Any] = [None] * 3

    def rank(r: int) -> None:
        job.rank.value = r
        with Client(socks[r]) as c:
            bs = AdjustBs(63, env={"SLURMD_NODENAME": "slurm-node"})
            bs.start(job, c)
            got[r] = (bs.node, bs.batch_size, bs.sizes)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [g[:2] for g in got] == [("n0", 21), ("n1", 21), ("slurm-node", 21)], got
    assert all(g[2] == {"n0": [21], "n1": [21], "slurm-node": [21]} for g in got), got


def test_resume_on_fewer_nodes_through_mounts(etcd: Etcd, tmp_path: Path) -> None:
    """Three mounted nodes read about half an epoch and are all `kill -9`ed; two other nodes
    mount on the same queue and finish it: every shard DONE once, every sample of the epoch
    read with the tier's bytes, and the only samples read twice are in the killed nodes'
    views."""
    import dds_mount_faults as f

    src = tmp_path / "tier"
    digests = f.dataset(src, 480)
    url = etcd.url("resume")
    first = [f.Node(f"a{i}", tmp_path, src, url, 1) for i in range(3)]
    for n in first:
        n.start()
    deadline = time.monotonic() + 60
    while len(done_shards(etcd, "resume", 0)) < shards(etcd, "resume") // 2:
        assert time.monotonic() < deadline, "the first nodes made no progress"
        time.sleep(0.02)
    # Every daemon first: killed one by one, each waiting for its reader, the others went on and
    # once finished the epoch before the last was killed.
    for n in first:
        n.kill_daemon()
    for n in first:
        n.kill()
    assert len(done_shards(etcd, "resume", 0)) < shards(etcd, "resume"), (
        "the epoch ended before the kill"
    )
    second = [f.Node(f"b{i}", tmp_path, src, url, 1) for i in range(2)]
    try:
        for n in second:
            n.start()
        wait_epoch_done(etcd, "resume", 0, 90)
    finally:
        for n in second:
            n.close()
    nodes = first + second
    count: dict[str, int] = {}
    killed: set[str] = set()
    for n in nodes:
        for inc, e, p, h in n.reads:
            if e == 0:
                assert digests[p] == h, p
                count[p] = count.get(p, 0) + 1
                if inc in n.killed_incs:
                    killed.add(p)
    assert set(count) == set(digests), sorted(set(digests) - set(count))[:5]
    assert all(p in killed for p, c in count.items() if c > 1)
    holders = {d["node"] for d in done_shards(etcd, "resume", 0)}
    assert {"b0", "b1"} <= holders, holders


def test_files_a_lasting_fault_holds_are_deferred_by_their_node(
    mounts: Any, etcd: Etcd, tmp_path: Path
) -> None:
    """A fault that lasts under dynamic sharding (a Lustre OST down): four files of the source
    answer EIO through `faultfs`, a real FUSE file system under the source path. Past the defer
    bound each node's views keep advancing without the dead files of its claims, and `status`
    counts them; once the fault ends, each comes whole in a later mini-epoch of the node that
    carried it. Every other sample of epoch 0 is read exactly once, no read fails or differs,
    and the nodes count each dead file recovered once."""
    from stresslib import FaultFs

    src = tmp_path / "tier"
    digests = make_dataset(src, 120)
    dead = sorted(digests)[5::29][:4]
    assert len(dead) == 4, dead
    control = tmp_path / "dead-files"
    control.write_text("".join(f"{k}\n" for k in dead))
    totals = ("deferred_samples", "deferrals", "recovered_samples")

    def summed() -> dict[str, int]:
        sts = [m.status() for m in ms]
        return {k: sum(int(st[k]) for st in sts) for k in totals}

    with FaultFs(src, tmp_path / "ost", control, tmp_path / "faultfs.json") as ffs:
        ms = dds_mounts(
            mounts,
            ffs.mnt,
            etcd,
            "defer",
            2,
            *("--stager-retry-secs", "1", "--stager-defer-after-secs", "2"),
        )
        readers = [Reader(m) for m in ms]
        try:
            for m in ms:
                m.mount()
            for r in readers:
                r.start()
            deadline = time.monotonic() + 120
            while summed()["deferrals"] < len(dead):
                assert time.monotonic() < deadline, f"not every dead file deferred: {summed()}"
                assert all(r.error is None for r in readers), [r.error for r in readers]
                time.sleep(0.2)
            wait_epoch_done(etcd, "defer", 0, 90)
            carried = summed()
            control.write_text("")  # repaired
            deadline = time.monotonic() + 120
            while (now := summed())["recovered_samples"] < len(dead):
                assert time.monotonic() < deadline, f"the dead files never came back: {now}"
                time.sleep(0.2)
            # Recovered when staged: each is read once its node's view switches to it.
            while not all(any(p == q for r in readers for _, q, _ in r.reads) for p in dead):
                assert time.monotonic() < deadline, "a recovered file was never read"
                assert all(r.error is None for r in readers), [r.error for r in readers]
                time.sleep(0.2)
        finally:
            for r in readers:
                r.stop.set()
            for r in readers:
                r.join(timeout=30)
            for m in ms:
                m.close()
        counts = ffs.counts()
    for r in readers:
        assert r.error is None, r.error
    reads = [x for r in readers for x in r.reads]
    assert all(digests[p] == h for _, p, h in reads), "a read differs from the source"
    epoch0 = sorted(p for e, p, _ in reads if e == 0 and p not in dead)
    assert epoch0 == sorted(set(digests) - set(dead)), "each other sample once in epoch 0"
    for p in dead:
        assert any(q == p for _, q, _ in reads), f"{p} never came back"
    assert carried["deferred_samples"] == len(dead), carried
    assert now["deferred_samples"] == 0 and now["recovered_samples"] == len(dead), now
    assert counts.get("eio_opens", 0) + counts.get("eio_reads", 0) > 0, counts
    # Stratified batches: each deferral and recovery says which class it moved, and how far.
    events = [json.loads(line) for m in ms for line in (m.cache / "run" / "events.jsonl").open()]
    shifts = {
        kind: [e.get("class_shift") for e in events if e["event"] == kind]
        for kind in ("deferred", "recovered")
    }
    classes = {p.split("/")[0] for p in dead}
    assert any(c and c["class"] in classes and c["samples"] < 0 for c in shifts["deferred"]), shifts
    assert any(c and c["class"] in classes and c["samples"] > 0 for c in shifts["recovered"]), (
        shifts
    )
