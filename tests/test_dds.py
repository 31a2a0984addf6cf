"""`metfs dds init|status|reset` against a real etcd: a queue made from a source directory,
kept for the same dataset and seed, refused for another seed or dataset (naming both), shown
with its epochs and nodes, reset; an unreachable etcd and a bad address are clear errors."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from conftest import Etcd, free_port, make_tree


def run(metfs: str, *args: str, ok: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([metfs, *args], capture_output=True, text=True, timeout=timeout)
    if ok:
        assert r.returncode == 0, r.stderr
    return r


def test_init_status_reset(metfs: str, etcd: Etcd, tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_tree(src, n=120)
    url = etcd.url("jobs/a")
    init = ["dds", "init", url, "--source", str(src), "--budget", "2MiB", "--compose", "stratified", "--seed", "3"]
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
    r = run(metfs, "dds", "status", "etcd://127.0.0.1:2379/q", "--etcd-cacert", str(tmp_path / "none.pem"), ok=False)
    assert str(tmp_path / "none.pem") in r.stderr, r.stderr
