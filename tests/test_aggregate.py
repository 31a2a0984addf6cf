"""Aggregate-cache mode (`metfs mount --aggregate`) with its exchange, `metfs-shuffle`, under a
real `mpirun -np 4`: four daemons with real mounts on this machine stand for four nodes. Each
node's trainer is a separate Python process using the real client and `metfs.passes`, reading
every file of its view and checking it against the source."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from conftest import Mount, wait_for
from test_dds_mount import make_dataset

ROOT = Path(__file__).resolve().parent.parent
NODES = 4
SAMPLES = 240

pytestmark = pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI (scripts/install-deps.sh installs it)")

# One node's trainer: `epochs` MET epochs at rf 1, every file of every view read through the
# mount and compared with the source's digest; the views, the status at the end.
TRAINER = r"""
import hashlib, json, sys, metfs
sock, digests, out, epochs = sys.argv[1:5]
digests = json.load(open(digests))
c = metfs.Client(sock)
res = {"views": [], "bad": []}
for p in metfs.passes(c, epochs=int(epochs)):
    if p.pass_in_mini_epoch == 0:
        res["views"].append([p.epoch, sorted(p.files)])
    for path, rel in zip(p.paths, p.files):
        with open(path, "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() != digests[rel]:
                res["bad"].append(rel)
    p.report(loss=1.0)
res["status"] = c.status().raw
json.dump(res, open(out, "w"))
"""


def shuffle_bin() -> str:
    """`metfs-shuffle` beside the metfs binary under test (built with the `mpi` feature)."""
    exe = Path(os.environ.get("METFS_BIN", ROOT / "target" / "debug" / "metfs")).with_name("metfs-shuffle")
    if not exe.exists():
        subprocess.run(["cargo", "build", "-q", "-p", "metfs", "--features", "mpi", "--bin", "metfs-shuffle"], cwd=ROOT, check=True)
    return str(exe)


def mpirun(tmp: Path, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    return subprocess.Popen(
        ["mpirun", "-np", str(NODES), shuffle_bin(), "--cache", str(tmp / "n%r" / "cache"), *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


# The coded exchange, with extras (α = 1/4 + 0.5 · 3/4 = 0.625): UberShuffle's side
# information.
CODED = ("--shuffle-code", "uberShuffle", "--shuffle-extra", "0.5")


class Cluster:
    def __init__(self, mounts: Callable[..., Mount], tmp: Path, src: Path, seeds: list[int] | None = None, timeout: int = 60,
                 args: tuple[str, ...] = ()) -> None:
        self.tmp = tmp
        self.nodes = [
            mounts(src, "5MiB", "--aggregate", "--nodes", str(NODES), "--node-rank", str(r),
                   "--seed", str((seeds or [7] * NODES)[r]), "--rf", "1", "--rf-policy", "fixed",
                   "--shuffle-timeout-secs", str(timeout), *args, name=f"n{r}", cache=tmp / f"n{r}" / "cache")
            for r in range(NODES)
        ]

    def mount(self) -> None:
        for m in self.nodes:
            m.mount()

    def epoch0_tier_bytes(self) -> list[int]:
        """Each node's tier bytes once its epoch-0 slot is staged: its staging of epoch 1 has
        opened the inbox and waits for the exchange, reading nothing (call before it runs)."""
        wait_for(lambda: all((m.cache / "slots" / "inbox-e000001").is_dir() for m in self.nodes), 60, "every node staging epoch 1")
        return [m.status()["tier_bytes_read"] for m in self.nodes]

    def train(self, digests: Path, epochs: int) -> list[dict[str, Any]]:
        env = dict(os.environ, PYTHONPATH=str(ROOT / "bindings" / "python" / "src"))
        procs = []
        for r, m in enumerate(self.nodes):
            out = self.tmp / f"trainer{r}.json"
            procs.append((subprocess.Popen([sys.executable, "-c", TRAINER, m.socket, str(digests), str(out), str(epochs)],
                                           env=env, stderr=subprocess.PIPE, text=True), out))
        res = []
        for p, out in procs:
            _, err = p.communicate(timeout=300)
            assert p.returncode == 0, err[-3000:]
            res.append(json.loads(out.read_text()))
        return res


@pytest.fixture
def dataset(tmp_path: Path) -> tuple[Path, dict[str, str], Path]:
    src = tmp_path / "tier"
    digests = make_dataset(src, SAMPLES)
    dpath = tmp_path / "digests.json"
    dpath.write_text(json.dumps(digests))
    return src, digests, dpath


def check_views(res: list[dict[str, Any]], digests: dict[str, str], epochs: int) -> None:
    """Every node read its view's bytes equal to the source; every epoch the nodes' views
    partition the dataset; the partition changes from epoch to epoch."""
    assert all(not r["bad"] for r in res), [r["bad"][:3] for r in res]
    parts = []
    for e in range(epochs):
        views = [set(f) for r in res for ep, f in r["views"] if ep == e]
        assert len(views) == NODES, f"epoch {e}: {len(views)} views"
        union = set().union(*views)
        assert union == set(digests) and sum(map(len, views)) == len(digests), f"epoch {e} is not the dataset once"
        parts.append(views)
    for a, b in zip(parts, parts[1:]):
        assert a != b, "the shares did not change between epochs"


def reports(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_four_nodes_reshuffle_from_each_other_not_the_tier(mounts: Callable[..., Mount], tmp_path: Path, dataset: Any) -> None:
    src, digests, dpath = dataset
    c = Cluster(mounts, tmp_path, src)
    c.mount()
    # Three exchanges: epochs 1 and 2, and epoch 3, which each node stages ahead.
    ex = mpirun(tmp_path, "--epochs", "3")
    res = c.train(dpath, 3)
    out, err = ex.communicate(timeout=120)
    assert ex.returncode == 0, err[-3000:]
    check_views(res, digests, 3)
    total = sum((src / f).stat().st_size for f in digests)
    st = [m.status() for m in c.nodes]
    # The tier is read once, in epoch 0; every later epoch came from the other nodes.
    assert sum(s["tier_bytes_read"] for s in st) == total, [s["tier_bytes_read"] for s in st]
    assert all(s["aggregate"]["last_exchange"]["complete"] for s in st), st[0]["aggregate"]
    rep = reports(out)
    assert len(rep) == 3 * NODES and all(r["rejected"] == 0 and r["missing"] == 0 for r in rep), rep
    # What the nodes sent is what they received.
    assert sum(r["sent_samples"] for r in rep) == sum(r["received_samples"] for r in rep) > 0


def test_coded_packets_reshuffle_the_nodes_byte_exact(mounts: Callable[..., Mount], tmp_path: Path, dataset: Any) -> None:
    src, digests, dpath = dataset
    c = Cluster(mounts, tmp_path, src, args=CODED)
    c.mount()
    first = c.epoch0_tier_bytes()
    total = sum((src / f).stat().st_size for f in digests)
    # Epoch 0 filled each node's whole cache, share and extras, from the tier.
    assert sum(first) > total, (first, total)
    ex = mpirun(tmp_path, "--epochs", "3")
    res = c.train(dpath, 3)
    out, err = ex.communicate(timeout=120)
    assert ex.returncode == 0, err[-3000:]
    check_views(res, digests, 3)
    # The tier was read in epoch 0 only; epochs 1-3 came from the other nodes' packets.
    assert [m.status()["tier_bytes_read"] for m in c.nodes] == first
    rep = reports(out)
    assert len(rep) == 3 * NODES and all(r["code"] == "uberShuffle" and r["rejected"] == 0 and r["missing"] == 0 for r in rep), rep
    packets = sum(r["packets"] for r in rep)
    blocks = sum(r["decoded_blocks"] for r in rep)
    # Coded: fewer packets than blocks delivered, each packet sent once to each receiver.
    assert 0 < packets < blocks, (packets, blocks)
    assert sum(r["received_samples"] for r in rep) > 0
    assert sum(r["sent_bytes"] for r in rep) > sum(r["packet_bytes"] for r in rep) > 0


@pytest.mark.parametrize("code", ["uncoded", "uberShuffle"])
def test_a_corrupted_sample_is_caught_and_fetched_from_the_tier(mounts: Callable[..., Mount], tmp_path: Path, dataset: Any, code: str) -> None:
    src, digests, dpath = dataset
    c = Cluster(mounts, tmp_path, src, args=CODED if code == "uberShuffle" else ())
    c.mount()
    first = sum(c.epoch0_tier_bytes())
    # Two exchanges: epoch 1, and epoch 2, which each node stages ahead.
    ex = mpirun(tmp_path, "--epochs", "2", "--inject-corruption")
    res = c.train(dpath, 2)
    out, err = ex.communicate(timeout=120)
    assert ex.returncode == 0, err[-3000:]
    check_views(res, digests, 2)
    rep = reports(out)
    rejected = sum(r["rejected"] for r in rep)
    if code == "uncoded":
        # Each rank corrupted the first sample it sent each peer, in each exchange.
        assert rejected == 2 * NODES * (NODES - 1), rep
    else:
        # Each rank corrupted the first packet it sent each peer: the sample that peer
        # decodes from it fails its CRC.
        assert 0 < rejected <= 2 * NODES * (NODES - 1), rep
    assert sum(r["missing"] for r in rep) == rejected, rep
    tier = sum(m.status()["tier_bytes_read"] for m in c.nodes)
    assert first < tier < first + rejected * (20 << 10), (tier, first, rejected)


def test_a_node_that_dies_leaves_the_others_to_the_tier_and_they_say_so(mounts: Callable[..., Mount], tmp_path: Path, dataset: Any) -> None:
    src, digests, dpath = dataset
    c = Cluster(mounts, tmp_path, src, timeout=3)
    c.mount()
    ex = mpirun(tmp_path)
    # The exchange for epoch 1 (staged while epoch 0 is read) completes on every node...
    wait_for(lambda: all((m.status()["aggregate"]["last_exchange"] or {}).get("epoch") == 1 for m in c.nodes), 60, "the first exchange")
    assert all(m.status()["aggregate"]["last_exchange"]["complete"] for m in c.nodes)
    # ...then one rank dies, and MPI ends the others.
    # The ranks (not mpirun, whose command line names them too).
    pids = subprocess.run(["pgrep", "-f", f"^{shuffle_bin()} --cache {tmp_path}"], capture_output=True, text=True, check=False).stdout.split()
    assert len(pids) == NODES, pids
    os.kill(int(pids[-1]), signal.SIGKILL)
    ex.communicate(timeout=60)
    assert ex.returncode != 0
    # The nodes go on: epoch 2 waits out the timeout, says so, and comes from the tier.
    res = c.train(dpath, 3)
    check_views(res, digests, 3)
    for m in c.nodes:
        st = m.status()
        assert st["aggregate"]["last_exchange"]["complete"] is False, st["aggregate"]
        assert "did not complete within 3 s" in (st["last_error"] or ""), st["last_error"]


def test_mismatched_seed_is_refused_by_every_rank(mounts: Callable[..., Mount], tmp_path: Path, dataset: Any) -> None:
    src, _, _ = dataset
    c = Cluster(mounts, tmp_path, src, seeds=[7, 7, 7, 8])
    c.mount()
    ex = mpirun(tmp_path)
    _, err = ex.communicate(timeout=60)
    assert ex.returncode != 0
    assert "seed differs" in err and "--seed" in err, err[-2000:]


def test_a_dataset_larger_than_the_nodes_together_is_refused_with_the_numbers(mounts: Callable[..., Mount], tmp_path: Path, dataset: Any) -> None:
    src, _, _ = dataset
    m = mounts(src, "2200KiB", "--aggregate", "--nodes", "2", "--node-rank", "0", name="small")
    r = m.mount(check=False)
    assert r.returncode != 0
    assert "aggregate mode (2 nodes" in r.stderr and "does not fit" in r.stderr, r.stderr
    assert not (tmp_path / "mnt-small").exists() or not os.listdir(tmp_path / "mnt-small")


def test_bad_aggregate_settings_name_the_setting(mounts: Callable[..., Mount], dataset: Any) -> None:
    src, _, _ = dataset
    for extra, key in ((["--shuffle-extra", "1.5"], "aggregate.extra"), (["--share"], "aggregate.enabled")):
        m = mounts(src, "5MiB", "--aggregate", *extra, name="bad")
        r = m.mount(check=False)
        assert r.returncode != 0 and key in r.stderr, r.stderr
