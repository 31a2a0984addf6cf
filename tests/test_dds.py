"""`metfs dds init|status|reset` against a real etcd: a queue made from a source directory,
kept for the same dataset and seed, refused for another seed or dataset (naming both), shown
with its epochs and nodes, reset; an unreachable etcd and a bad address are clear errors."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from conftest import Etcd, free_port, make_tree


def run(
    metfs: str, *args: str, ok: bool = True, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([metfs, *args], capture_output=True, text=True, timeout=timeout)
    if ok:
        assert r.returncode == 0, r.stderr
    return r


def test_init_status_reset(metfs: str, etcd: Etcd, tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_tree(src, n=120)
    url = etcd.url("jobs/a")
    init = [
        "dds",
        "init",
        url,
        "--source",
        str(src),
        "--budget",
        "2MiB",
        "--compose",
        "stratified",
        "--seed",
        "3",
    ]
    out = run(metfs, *init).stdout
    assert out.startswith(f"made {url}: dataset 120:"), out
    st = json.loads(run(metfs, "dds", "status", url, "--json").stdout)
    meta = st["meta"]
    assert (meta["samples"], meta["seed"], meta["strategy"]) == (120, 3, "stratified")
    assert meta["shards"] >= 1 and st["epochs"] == [] and st["nodes"] == []
    # Again with the same dataset and seed: the queue is kept as it is.
    assert run(metfs, *init).stdout.startswith(f"kept {url}"), out
    # Another seed is refused, naming both.
    r = run(metfs, *init[:-1], "4", ok=False)
    assert r.returncode == 1
    assert "seed 3" in r.stderr and "seed 4" in r.stderr and url in r.stderr, r.stderr
    # Another dataset is refused, naming both fingerprints.
    (src / "cat" / "new.bin").write_bytes(b"x" * 10)
    r = run(metfs, *init, ok=False)
    assert "dataset 120:" in r.stderr and "dataset 121:" in r.stderr, r.stderr
    text = run(metfs, "dds", "status", url).stdout
    assert "seed 3, stratified" in text and "no epoch started" in text, text
    assert "keys deleted" in run(metfs, "dds", "reset", url).stdout
    r = run(metfs, "dds", "status", url, ok=False)
    assert f"no queue at {url}" in r.stderr, r.stderr
    # Another prefix on the same etcd is another queue.
    assert run(metfs, *init[:2], etcd.url("jobs/b"), *init[3:]).stdout.startswith("made")


def test_unreachable_etcd_and_bad_address_are_clear_errors(metfs: str, tmp_path: Path) -> None:
    port = free_port()
    t = time.monotonic()
    r = run(metfs, "dds", "status", f"etcd://127.0.0.1:{port}/q", "--etcd-timeout", "1", ok=False)
    assert time.monotonic() - t < 10
    assert r.returncode == 1
    assert f"etcd at etcd://127.0.0.1:{port}/q is unreachable" in r.stderr, r.stderr
    r = run(metfs, "dds", "reset", "etcd://127.0.0.1/q", ok=False)
    assert 'bad queue address "etcd://127.0.0.1/q"' in r.stderr, r.stderr
    r = run(
        metfs,
        "dds",
        "status",
        "etcd://127.0.0.1:2379/q",
        "--etcd-cacert",
        str(tmp_path / "none.pem"),
        ok=False,
    )
    assert str(tmp_path / "none.pem") in r.stderr, r.stderr


def test_queue_under_kill_9_of_readers_and_etcd(metfs: str, tmp_path: Path) -> None:
    """One short trial of tests/stress/dds_faults.py (the full 20 run from that script): three
    reader processes on a real etcd, three `kill -9`s of readers and one of etcd."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent / "stress"))
    import dds_faults

    src = dds_faults.dataset(tmp_path, 120)
    r = dds_faults.run_trial(7, tmp_path, src, 120, epochs=2)
    assert r["samples_lost"] == 0
    assert r["read_twice"] <= r["read_by_killed_not_done"]


def test_throughputs_for_adjust_bs_come_from_the_queue(
    metfs: str, etcd: Etcd, tmp_path: Path
) -> None:
    """Two reader nodes finish an epoch on a real queue; `metfs.batchsize.queue_throughputs` (the
    Python package of this checkout) reads each node's throughput from `metfs dds status --json` and
    `rank_batch_sizes` splits a global batch over their ranks (Eq. 3)."""
    import os
    import sys

    sys.path.insert(0, str(Path(__file__).parent / "stress"))
    import dds_faults

    from conftest import ROOT

    src = dds_faults.dataset(tmp_path, 120)
    exe = str(dds_faults.reader_bin())
    url = etcd.url("adjust")
    procs = [
        subprocess.Popen(
            [
                exe,
                "--source",
                str(src),
                "--log",
                str(tmp_path / f"{n}.log"),
                "--url",
                url,
                "--node",
                n,
                "--slot",
                str(128 * 1024),
                "--rate",
                str(r),
            ],
            stdout=subprocess.PIPE,
        )
        for n, r in (("fast", 4_000_000), ("slow", 1_000_000))
    ]
    for p in procs:
        assert p.wait(timeout=120) == 0
    code = (
        "import json, sys\n"
        "from metfs.batchsize import rank_batch_sizes, queue_throughputs\n"
        "v = queue_throughputs(sys.argv[1], metfs=sys.argv[2])\n"
        "print(json.dumps({'v': v, 'sizes': rank_batch_sizes(64, v, {'fast': 2, 'slow': 2})}))\n"
        "try:\n"
        "    queue_throughputs(sys.argv[3], metfs=sys.argv[2])\n"
        "except RuntimeError as e:\n"
        "    print(e)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT / "bindings" / "python" / "src"))
    r = subprocess.run(
        [sys.executable, "-c", code, url, metfs, f"etcd://127.0.0.1:{free_port()}/q"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    out, err_line = r.stdout.splitlines()
    got = json.loads(out)
    assert sorted(got["v"]) == ["fast", "slow"] and all(x > 0 for x in got["v"].values()), got
    sizes = got["sizes"]
    assert sum(map(sum, sizes.values())) == 64 and len(sizes["fast"]) == len(sizes["slow"]) == 2
    # The faster node by the queue's numbers takes the larger share, every rank at least one.
    faster, slower = sorted(got["v"], key=lambda n: -got["v"][n])
    assert sum(sizes[faster]) >= sum(sizes[slower]) and min(sizes[slower]) >= 1, got
    assert "is unreachable" in err_line, err_line


def test_resume_on_fewer_nodes_completes_the_epoch_exactly_once(
    metfs: str, etcd: Etcd, tmp_path: Path
) -> None:
    """Three reader processes for about half an epoch, all `kill -9`ed, then two other nodes on
    the same queue: the epoch completes, every sample exactly once among the DONE shards, and the
    only samples read twice are in shards the killed nodes held."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent / "stress"))
    import dds_faults

    n = 160
    src = dds_faults.dataset(tmp_path, n)
    exe = dds_faults.reader_bin()
    prefix = "resume"
    url = etcd.url(prefix)
    args = [
        "--slot",
        str(128 * 1024),
        "--lease",
        "2",
        "--epochs",
        "1",
        "--rate",
        "1000000",
        "--compose",
        "stratified",
    ]
    first = [
        dds_faults.Node(f"a{i}", exe, src, tmp_path / f"a{i}.log", url, args) for i in range(3)
    ]
    for node in first:
        node.start()
    deadline = time.monotonic() + 60
    while True:
        meta = dds_faults.etcd_range(etcd, f"{prefix}/meta")
        done = len(dds_faults.etcd_range(etcd, f"{prefix}/done/"))
        if meta and done >= json.loads(meta[0][1])["shards"] // 2:
            break
        assert time.monotonic() < deadline, "the first nodes made no progress"
        time.sleep(0.05)
    for node in first:
        node.kill()
    shards = json.loads(dds_faults.etcd_range(etcd, f"{prefix}/meta")[0][1])["shards"]
    assert len(dds_faults.etcd_range(etcd, f"{prefix}/done/")) < shards, (
        "the epoch ended before the kill"
    )
    second = [
        dds_faults.Node(f"b{i}", exe, src, tmp_path / f"b{i}.log", url, args) for i in range(2)
    ]
    for node in second:
        node.start()
    for node in second:
        assert node.proc is not None and node.proc.wait(timeout=120) == 0
    r = dds_faults.check(0, etcd, prefix, first + second, n, 1, [], 0, 0.0, [])
    assert r["samples_lost"] == 0 and r["read_twice"] <= r["read_by_killed_not_done"]
    # Both new nodes took part, and nothing DONE before the resume was done again.
    holders = {json.loads(v)["node"] for _, v in dds_faults.etcd_range(etcd, f"{prefix}/done/")}
    assert {"b0", "b1"} <= holders, holders


def test_a_restarted_reader_after_a_torn_log_line_keeps_its_reads(
    metfs: str, etcd: Etcd, tmp_path: Path
) -> None:
    """A `kill -9` can land inside a log write; the loaded test command's fault trial then
    reported samples lost that were read, because the next incarnation's `start` line was glued
    to the torn line and its reads were counted as the dead incarnation's. A reader whose log ends
    in half a line starts its own line, and the check finds every sample under the DONE holders."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent / "stress"))
    import dds_faults

    n = 60
    src = dds_faults.dataset(tmp_path, n)
    log = tmp_path / "n0.log"
    log.write_text("start n0 99\nread 0 3 1")  # a killed incarnation's last, half-written line
    prefix = "torn"
    args = ["--slot", str(128 * 1024), "--lease", "2", "--epochs", "1"]
    node = dds_faults.Node("n0", dds_faults.reader_bin(), src, log, etcd.url(prefix), args)
    node.start()
    assert node.proc is not None and node.proc.wait(timeout=120) == 0
    node.killed_incs.append(99)
    lines = dds_faults.read_lines(log)
    assert lines[1] == "read 0 3 1" and lines[2].startswith("start n0 "), lines[:3]
    r = dds_faults.check(0, etcd, prefix, [node], n, 1, [], 0, 0.0, [])
    assert r["samples_lost"] == 0
