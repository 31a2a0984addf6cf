"""Aggregate-cache mode (`metfs mount --aggregate`) with its exchange, `metfs-shuffle`, under a
real `mpirun -np 4`: four daemons with real mounts on this machine stand for four nodes. Each
node's trainer is a separate Python process using the real client and `metfs.passes`, reading
every file of its view and checking it against the source."""

from __future__ import annotations

import itertools
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

pytestmark = pytest.mark.skipif(
    shutil.which("mpirun") is None, reason="needs Open MPI (scripts/install-deps.sh installs it)"
)

# One node's trainer: `epochs` MET epochs at rf 1, every file of every view read through the
# mount and compared with the source's digest; the views, the status at the end. A view of a
# Hugging Face dataset (`test_aggregate_groups`) also gives the rows `load_from_disk` reads, and
# its `state.json` is its own (rewritten to the view's shards), so its bytes are not compared.
TRAINER = r"""
import hashlib, json, sys, metfs
sock, digests, out, epochs = sys.argv[1:5]
digests = json.load(open(digests))
c = metfs.Client(sock)
res = {"views": [], "bad": [], "rows": []}
for p in metfs.passes(c, epochs=int(epochs)):
    if p.pass_in_mini_epoch == 0:
        res["views"].append([p.epoch, sorted(p.files)])
        if "state.json" in p.files:
            import datasets
            res["rows"].append([p.epoch, sorted(datasets.load_from_disk(p.mountpoint)["id"])])
    for path, rel in zip(p.paths, p.files):
        if rel == "state.json":
            continue
        with open(path, "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() != digests[rel]:
                res["bad"].append(rel)
    p.report(loss=1.0)
res["status"] = c.status().raw
json.dump(res, open(out, "w"))
"""


def shuffle_bin() -> str:
    """`metfs-shuffle` beside the metfs binary under test (metfs-exchange built with its `mpi` feature)."""
    exe = Path(os.environ.get("METFS_BIN", ROOT / "target" / "debug" / "metfs")).with_name(
        "metfs-shuffle"
    )
    if not exe.exists():
        subprocess.run(
            [
                "cargo",
                "build",
                "-q",
                "-p",
                "metfs-exchange",
                "--features",
                "mpi",
                "--bin",
                "metfs-shuffle",
            ],
            cwd=ROOT,
            check=True,
        )
    return str(exe)


def as_user(user: str, home: Path, **env: str) -> list[str]:
    """The prefix that runs a command as `user` with a clean environment."""
    return [
        "runuser",
        "-u",
        user,
        "--",
        "env",
        "-i",
        "PATH=/usr/bin:/bin",
        f"HOME={home}",
        f"TMPDIR={home}",
        *(f"{k}={v}" for k, v in env.items()),
    ]


def mpirun(tmp: Path, *args: str, user: str | None = None) -> subprocess.Popen[str]:
    """`metfs-shuffle` on one rank per node, and one more with `--sender extra`."""
    np = NODES + (1 if "extra" in args else 0)
    cmd = ["mpirun", "-np", str(np), shuffle_bin(), "--cache", str(tmp / "n%r" / "cache"), *args]
    if user:
        return subprocess.Popen(
            [*as_user(user, tmp, OMPI_MCA_rmaps_base_oversubscribe="1"), *cmd],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    env = dict(
        os.environ,
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMPI_MCA_rmaps_base_oversubscribe="1",
    )
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# The coded exchange, with extras (α = 1/4 + 0.5 · 3/4 = 0.625): UberShuffle's side
# information.
CODED = ("--shuffle-code", "uberShuffle", "--shuffle-extra", "0.5")


class Cluster:
    def __init__(
        self,
        mounts: Callable[..., Mount],
        tmp: Path,
        src: Path,
        seeds: list[int] | None = None,
        timeout: int = 60,
        args: tuple[str, ...] = (),
        node_args: list[tuple[str, ...]] | None = None,
    ) -> None:
        self.tmp = tmp
        self.nodes = [
            mounts(
                src,
                "5MiB",
                "--aggregate",
                "--nodes",
                str(NODES),
                "--node-rank",
                str(r),
                "--seed",
                str((seeds or [7] * NODES)[r]),
                "--rf",
                "1",
                "--rf-policy",
                "fixed",
                "--shuffle-timeout-secs",
                str(timeout),
                *args,
                *(node_args[r] if node_args else ()),
                name=f"n{r}",
                cache=tmp / f"n{r}" / "cache",
            )
            for r in range(NODES)
        ]

    def mount(self) -> None:
        for m in self.nodes:
            m.mount()

    def refused(self) -> str:
        """Starts the exchange on the mounted nodes and returns its stderr; it must refuse."""
        ex = mpirun(self.tmp)
        _, err = ex.communicate(timeout=60)
        assert ex.returncode != 0, "the exchange ran"
        return err

    def epoch0_tier_bytes(self) -> list[int]:
        """Each node's tier bytes once its epoch-0 slot is staged: its staging of epoch 1 has
        opened the inbox and waits for the exchange, reading nothing (call before it runs)."""
        wait_for(
            lambda: all((m.cache / "slots" / "inbox-e000001").is_dir() for m in self.nodes),
            60,
            "every node staging epoch 1",
        )
        return [m.status()["tier_bytes_read"] for m in self.nodes]

    def train(self, digests: Path, epochs: int, user: str | None = None) -> list[dict[str, Any]]:
        pythonpath = str(ROOT / "bindings" / "python" / "src")
        env = dict(os.environ, PYTHONPATH=pythonpath)
        # The user's trainer runs the system's Python (this one may be in root's home).
        prefix = (
            [
                *as_user(user, self.tmp, PYTHONPATH=pythonpath, PYTHONDONTWRITEBYTECODE="1"),
                "/usr/bin/python3",
            ]
            if user
            else [sys.executable]
        )
        procs = []
        for r, m in enumerate(self.nodes):
            out = self.tmp / f"trainer{r}.json"
            procs.append(
                (
                    subprocess.Popen(
                        [*prefix, "-c", TRAINER, m.socket, str(digests), str(out), str(epochs)],
                        env=env,
                        stderr=subprocess.PIPE,
                        text=True,
                    ),
                    out,
                )
            )
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
        assert union == set(digests) and sum(map(len, views)) == len(digests), (
            f"epoch {e} is not the dataset once"
        )
        parts.append(views)
    for a, b in itertools.pairwise(parts):
        assert a != b, "the shares did not change between epochs"


def reports(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_four_nodes_reshuffle_from_each_other_not_the_tier(
    mounts: Callable[..., Mount], tmp_path: Path, dataset: Any
) -> None:
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


def test_coded_packets_reshuffle_the_nodes_byte_exact(
    mounts: Callable[..., Mount], tmp_path: Path, dataset: Any
) -> None:
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
    assert len(rep) == 3 * NODES and all(
        r["code"] == "uberShuffle" and r["rejected"] == 0 and r["missing"] == 0 for r in rep
    ), rep
    packets = sum(r["packets"] for r in rep)
    blocks = sum(r["decoded_blocks"] for r in rep)
    # Coded: fewer packets than blocks delivered, each packet sent once to each receiver.
    assert 0 < packets < blocks, (packets, blocks)
    assert sum(r["received_samples"] for r in rep) > 0
    assert sum(r["sent_bytes"] for r in rep) > sum(r["packet_bytes"] for r in rep) > 0


# Who sends (`--sender`) and how coded packets travel (`--broadcast`), beside the defaults.
EXTRA = ("--sender", "extra")
RING = ("--broadcast", "ring")
DIRECT = ("--broadcast", "direct")


def is_ring(code: str, flags: tuple[str, ...]) -> bool:
    """Whether coded packets go by scatter-then-ring (the default)."""
    return code == "uberShuffle" and DIRECT[1] not in flags


@pytest.mark.parametrize(
    "code,flags",
    [
        ("uncoded", ()),
        ("uberShuffle", DIRECT),
        ("uncoded", EXTRA),
        ("uberShuffle", EXTRA + DIRECT),
        ("uberShuffle", ()),
        ("uberShuffle", EXTRA + RING),
    ],
    ids=["uncoded", "coded", "uncoded-extra", "coded-extra", "coded-ring", "coded-extra-ring"],
)
def test_a_corrupted_sample_is_caught_and_fetched_from_the_tier(
    mounts: Callable[..., Mount], tmp_path: Path, dataset: Any, code: str, flags: tuple[str, ...]
) -> None:
    src, digests, dpath = dataset
    c = Cluster(mounts, tmp_path, src, args=CODED if code == "uberShuffle" else ())
    c.mount()
    first = sum(c.epoch0_tier_bytes())
    # Two exchanges: epoch 1, and epoch 2, which each node stages ahead.
    ex = mpirun(tmp_path, "--epochs", "2", "--inject-corruption", *flags)
    res = c.train(dpath, 2)
    out, err = ex.communicate(timeout=120)
    assert ex.returncode == 0, err[-3000:]
    check_views(res, digests, 2)
    rep = reports(out)
    rejected = sum(r["rejected"] for r in rep)
    # Each sending rank corrupts the first frame it sends each node in each exchange: the
    # nodes themselves, or the extra rank alone.
    frames = 2 * (NODES if flags[:2] == EXTRA else NODES * (NODES - 1))
    if code == "uncoded":
        assert rejected == frames, rep
    else:
        # The sample its receiver decodes from a corrupted packet fails its CRC; a corrupted
        # ring part reaches every receiver of its packet.
        assert 0 < rejected <= frames * (NODES if is_ring(code, flags) else 1), rep
    assert sum(r["missing"] for r in rep) == rejected, rep
    tier = sum(m.status()["tier_bytes_read"] for m in c.nodes)
    assert first < tier < first + rejected * (20 << 10), (tier, first, rejected)


@pytest.mark.parametrize(
    "code,flags",
    [
        ("uncoded", EXTRA),
        ("uberShuffle", EXTRA + DIRECT),
        ("uberShuffle", ()),
        ("uberShuffle", EXTRA),
    ],
    ids=["uncoded-extra", "coded-extra", "coded-ring", "coded-extra-ring"],
)
def test_the_extra_rank_and_the_ring_reshuffle_the_nodes_byte_exact(
    mounts: Callable[..., Mount], tmp_path: Path, dataset: Any, code: str, flags: tuple[str, ...]
) -> None:
    """The paper's extra rank (`mpirun -np 5` for 4 nodes: it reads what it sends from the
    tier) and scatter-then-ring: every view is the node's share with the tier's bytes for 3
    epochs, and the daemons read the tier in epoch 0 only."""
    src, digests, dpath = dataset
    coded = code == "uberShuffle"
    extra, ring = flags[:2] == EXTRA, is_ring(code, flags)
    c = Cluster(mounts, tmp_path, src, args=CODED if coded else ())
    c.mount()
    first = c.epoch0_tier_bytes()
    ex = mpirun(tmp_path, "--epochs", "3", *flags)
    res = c.train(dpath, 3)
    out, err = ex.communicate(timeout=120)
    assert ex.returncode == 0, out + err[-6000:]
    check_views(res, digests, 3)
    assert [m.status()["tier_bytes_read"] for m in c.nodes] == first
    rep = reports(out)
    ranks = NODES + extra
    assert len(rep) == 3 * ranks, rep
    assert all(
        r["sender"] == ("extra" if extra else "peers")
        and r["broadcast"] == ("direct" if DIRECT[1] in flags else "ring")
        for r in rep
    )
    nodes = [r for r in rep if r["rank"] < NODES]
    assert all(r["rejected"] == 0 and r["missing"] == 0 and r["code"] == code for r in nodes), nodes
    received = sum(r["received_bytes"] for r in nodes)
    assert received > 0
    # Every byte sent was received, and counted message by message.
    assert sum(r["sent_bytes"] for r in rep) == sum(r["recv_bytes"] for r in rep) > 0
    assert all(r["messages"] > 0 for r in rep if r["sent_bytes"] > 0)
    if extra:
        x = [r for r in rep if r["rank"] == NODES]
        # The nodes send nothing of their own (on a ring they forward parts only).
        assert all(
            r["payload_bytes"] == r["forwarded_bytes"]
            and r["packets"] == 0
            and r["tier_bytes"] == 0
            for r in nodes
        ), nodes
        tier = sum(r["tier_bytes"] for r in x)
        if coded:
            # Each operand read once per exchange: at most what the nodes decoded.
            assert 0 < tier <= received and sum(r["packets"] for r in x) > 0, x
        else:
            # Without extras each sample goes to one node: read once, sent once.
            assert tier == received, (tier, received)
    if ring:
        # Each packet's sender sends it once, in parts; its receivers forward the rest.
        assert sum(r["stages"] for r in rep) > 0 and sum(r["forwarded"] for r in rep) > 0
        senders = [r for r in rep if r["packets"] > 0]
        assert all(
            r["payload_bytes"] - r["forwarded_bytes"] == r["packet_bytes"] for r in senders
        ), senders


def test_a_node_that_dies_leaves_the_others_to_the_tier_and_they_say_so(
    mounts: Callable[..., Mount], tmp_path: Path, dataset: Any
) -> None:
    src, digests, dpath = dataset
    # 8 s: short enough to wait out below, long enough for the first exchange (mpirun starting
    # its ranks included) on a loaded 2-core machine, where 3 s was once too short.
    c = Cluster(mounts, tmp_path, src, timeout=8)
    c.mount()
    ex = mpirun(tmp_path)
    # The exchange for epoch 1 (staged while epoch 0 is read) completes on every node...
    wait_for(
        lambda: all(
            (m.status()["aggregate"]["last_exchange"] or {}).get("epoch") == 1 for m in c.nodes
        ),
        60,
        "the first exchange",
    )
    assert all(m.status()["aggregate"]["last_exchange"]["complete"] for m in c.nodes)
    # ...then one rank dies, and MPI ends the others.
    # The ranks (not mpirun, whose command line names them too).
    pids = subprocess.run(
        ["pgrep", "-f", f"^{shuffle_bin()} --cache {tmp_path}"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
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
        assert "did not complete within 8 s" in (st["last_error"] or ""), st["last_error"]


USER = "metfs-user"


def user_problem() -> str | None:
    """Why aggregate mode cannot be run as USER here, or None (scripts/test.sh creates the user
    and lets it open /dev/fuse)."""
    if os.geteuid() != 0:
        return "needs root to switch to another user"
    if subprocess.run(["id", "-u", USER], capture_output=True).returncode != 0:
        return f"no user {USER} (scripts/test.sh creates it)"
    if (
        subprocess.run(
            ["runuser", "-u", USER, "--", "test", "-r", "/dev/fuse", "-a", "-w", "/dev/fuse"]
        ).returncode
        != 0
    ):
        return f"{USER} may not open /dev/fuse (scripts/test.sh grants it)"
    return None


@pytest.mark.skipif(user_problem() is not None, reason=str(user_problem()))
@pytest.mark.parametrize("flags", [(), EXTRA], ids=["peers", "extra"])
def test_aggregate_mode_runs_as_an_ordinary_user(metfs: str, flags: tuple[str, ...]) -> None:
    """Daemons (FUSE through fusermount3), `mpirun` with its ranks and the trainers all run as
    an ordinary user, as on an HPC node; coded, so that both exchanges' paths are used."""
    import pwd
    import tempfile

    uid = pwd.getpwnam(USER).pw_uid
    base = Path(tempfile.mkdtemp(prefix="metfs-aggregate-user-"))
    base.chmod(0o755)
    src = base / "tier"
    digests = make_dataset(src, SAMPLES)
    dpath = base / "digests.json"
    dpath.write_text(json.dumps(digests))
    # The daemon as the user, and its `metfs` commands.
    wrapper = base / "metfs-as-user"
    wrapper.write_text(
        "#!/bin/sh\nexec "
        + " ".join(as_user(USER, base, XDG_DATA_HOME=str(base / "data")))
        + f' {metfs} "$@"\n'
    )
    wrapper.chmod(0o755)
    made: list[Mount] = []

    def mounts(source: Path, budget: str, *extra: str, name: str, cache: Path) -> Mount:
        m = Mount(
            source,
            cache,
            base / f"mnt-{name}",
            metfs=wrapper,
            budget=budget,
            history=base / "h.json",
            args=extra,
        )
        for d in (cache, m.mountpoint):
            d.mkdir(parents=True, exist_ok=True)
        made.append(m)
        return m

    try:
        c = Cluster(mounts, base, src, args=CODED)
        for dirpath, dirnames, filenames in os.walk(base):
            for n in [dirpath, *(os.path.join(dirpath, f) for f in dirnames + filenames)]:
                os.chown(n, uid, -1)
        c.mount()
        assert all(os.stat(f"/proc/{m.pid()}").st_uid == uid for m in c.nodes)
        first = c.epoch0_tier_bytes()
        ex = mpirun(base, "--epochs", "3", *flags, user=USER)
        res = c.train(dpath, 3, user=USER)
        out, err = ex.communicate(timeout=120)
        assert ex.returncode == 0, err[-3000:]
        check_views(res, digests, 3)
        assert [m.status()["tier_bytes_read"] for m in c.nodes] == first
        rep = reports(out)
        assert len(rep) == 3 * (NODES + bool(flags)) and all(
            r["rejected"] == 0 and r["missing"] == 0 for r in rep
        ), rep
        assert sum(r["received_samples"] for r in rep) > 0
        # What the exchange wrote is the user's.
        assert all(os.stat(m.cache / "aggregate.json").st_uid == uid for m in c.nodes)
    finally:
        for m in made:
            m.close()
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("code", ["uncoded", "uberShuffle"])
def test_a_tier_outage_during_epoch_0_is_ridden_out_and_the_views_stay_exact(
    mounts: Callable[..., Mount], tmp_path: Path, dataset: Any, code: str
) -> None:
    """The whole tier goes away while the nodes train epoch 0. The exchange of epoch 1 runs
    (it needs no tier) with corrupted frames, so each node's staging of epoch 1 needs a few
    samples from the tier: with `--stager-retry-secs 1` the slot fails on the outage, says
    so, keeps what it linked, and resumes after its pause once the tier is back; every view
    is exact and nothing is left out."""
    src, digests, dpath = dataset
    c = Cluster(
        mounts,
        tmp_path,
        src,
        timeout=30,
        args=("--stager-retry-secs", "1", *(CODED if code == "uberShuffle" else ())),
    )
    c.mount()
    first = sum(c.epoch0_tier_bytes())
    away = tmp_path / "tier-away"
    src.rename(away)
    # Two exchanges: epoch 1 now, and epoch 2, which each node stages ahead.
    ex = mpirun(tmp_path, "--epochs", "2", "--inject-corruption")
    try:
        # Every node is sent a corrupted frame, so every node's staging of epoch 1 needs the
        # tier, fails on the outage and waits to resume.
        wait_for(
            lambda: all("missing" in (m.status()["last_error"] or "") for m in c.nodes),
            60,
            "the staging to fail on the outage",
        )
        assert not any(m.status()["next_ready"] for m in c.nodes)
    finally:
        away.rename(src)
    res = c.train(dpath, 2)
    out, err = ex.communicate(timeout=120)
    assert ex.returncode == 0, err[-3000:]
    check_views(res, digests, 2)
    st = [m.status() for m in c.nodes]
    assert not any(s["failed_samples"] for s in st), [s["failed_samples"] for s in st]
    # After epoch 0 only the refused samples came from the tier.
    rep = reports(out)
    missing = sum(r["missing"] for r in rep)
    assert missing > 0 and all(r["rejected"] == r["missing"] for r in rep), rep
    tier = sum(s["tier_bytes_read"] for s in st)
    assert first < tier < first + missing * (20 << 10), (tier, first, missing)


def test_files_a_lasting_fault_holds_are_deferred_by_their_node(
    mounts: Callable[..., Mount], tmp_path: Path, dataset: Any
) -> None:
    """A fault that lasts (a Lustre OST down) at the mount: four files answer EIO through
    `faultfs`, a real FUSE file system under the source path. Each node's first staging defers
    the dead files of its share, so every mount succeeds and epoch 0's views are the dataset
    less them. Once repaired, each comes whole in the next epoch's view of the node that
    carried it (besides its place in that epoch's shares); the exchange sends it as missing
    (its sender never held it) and the receiver takes it from the tier. Every view is exact,
    and the nodes count each dead file deferred and recovered once."""
    sys.path.insert(0, str(Path(__file__).parent / "stress"))
    from stresslib import FaultFs

    src, digests, dpath = dataset
    dead = sorted(digests)[5::59][:4]
    assert len(dead) == 4, dead
    control = tmp_path / "dead-files"
    control.write_text("".join(f"{k}\n" for k in dead))
    with FaultFs(src, tmp_path / "ost", control, tmp_path / "faultfs.json") as ffs:
        c = Cluster(
            mounts,
            tmp_path,
            ffs.mnt,
            args=("--stager-retry-secs", "1", "--stager-defer-after-secs", "2"),
        )
        try:
            c.mount()
            carried = [m.status()["deferred_samples"] for m in c.nodes]
            control.write_text("")  # repaired
            ex = mpirun(tmp_path, "--epochs", "2")
            res = c.train(dpath, 2)
            out, err = ex.communicate(timeout=120)
            st = [m.status() for m in c.nodes]
        finally:
            for m in c.nodes:
                m.close()
        counts = ffs.counts()
    assert ex.returncode == 0, err[-3000:]
    assert sum(carried) == len(dead), carried
    assert all(not r["bad"] for r in res), [r["bad"][:3] for r in res]
    views = {e: [set(f) for r in res for ep, f in r["views"] if ep == e] for e in (0, 1)}
    assert all(len(v) == NODES for v in views.values()), views.keys()
    assert set().union(*views[0]) == set(digests) - set(dead)
    assert sum(map(len, views[0])) == len(digests) - len(dead), "epoch 0 is the rest once"
    # Epoch 1: every node's share, and on the nodes that carried them, the dead files.
    assert set().union(*views[1]) == set(digests)
    for r, c0 in zip(res, carried, strict=True):
        e0 = next(set(f) for ep, f in r["views"] if ep == 0)
        e1 = next(set(f) for ep, f in r["views"] if ep == 1)
        mine = {p for p in dead if p not in e0 and p in e1}
        assert len(mine) >= c0 or c0 == 0, (r["views"], c0)
    assert sum(s["deferred_samples"] for s in st) == 0, [s["deferred_samples"] for s in st]
    assert sum(s["recovered_samples"] for s in st) == len(dead), st
    assert not any(s["failed_samples"] for s in st), [s["failed_samples"] for s in st]
    rep = reports(out)
    # Epoch 1's exchange: a dead file whose epoch-0 owner never held it travels as missing
    # (counted as refused by its receiver, which took it from the tier); epoch 2's is whole.
    assert all(r["rejected"] == r["missing"] for r in rep), rep
    assert 0 < sum(r["missing"] for r in rep if r["epoch"] == 1) <= len(dead), rep
    assert all(r["missing"] == 0 for r in rep if r["epoch"] == 2), rep
    assert counts.get("eio_opens", 0) + counts.get("eio_reads", 0) > 0, counts


def test_mismatched_seed_is_refused_by_every_rank(
    mounts: Callable[..., Mount], tmp_path: Path, dataset: Any
) -> None:
    src, _, _ = dataset
    c = Cluster(mounts, tmp_path, src, seeds=[7, 7, 7, 8])
    c.mount()
    err = c.refused()
    assert "seed differs" in err and "--seed" in err, err[-2000:]


def test_a_dataset_larger_than_the_nodes_together_is_refused_with_the_numbers(
    mounts: Callable[..., Mount], tmp_path: Path, dataset: Any
) -> None:
    src, _, _ = dataset
    m = mounts(src, "2200KiB", "--aggregate", "--nodes", "2", "--node-rank", "0", name="small")
    r = m.mount(check=False)
    assert r.returncode != 0
    assert "aggregate mode (2 nodes" in r.stderr and "does not fit" in r.stderr, r.stderr
    assert not (tmp_path / "mnt-small").exists() or not os.listdir(tmp_path / "mnt-small")


def test_coded_shuffling_past_its_node_limit_is_refused_with_the_numbers(
    mounts: Callable[..., Mount], tmp_path: Path, dataset: Any
) -> None:
    """`uberShuffle` at more nodes than a coding table names is refused at mount, with the
    estimate and the limit, and `uncoded` suggested (`shuffle::coded::estimate`)."""
    src, _, _ = dataset
    args = ("--aggregate", "--nodes", "129", "--node-rank", "0", "--shuffle-code", "uberShuffle")
    m = mounts(src, "5MiB", *args, name="wide")
    r = m.mount(check=False)
    assert r.returncode != 0
    for want in ("at most 128 nodes, not 129", "tables", "entries", "--shuffle-code uncoded"):
        assert want in r.stderr, r.stderr
    assert not (tmp_path / "mnt-wide").exists() or not os.listdir(tmp_path / "mnt-wide")


def test_bad_aggregate_settings_name_the_setting(
    mounts: Callable[..., Mount], dataset: Any
) -> None:
    src, _, _ = dataset
    for extra, key in (
        (["--shuffle-extra", "1.5"], "aggregate.extra"),
        (["--share"], "aggregate.enabled"),
    ):
        m = mounts(src, "5MiB", "--aggregate", *extra, name="bad")
        r = m.mount(check=False)
        assert r.returncode != 0 and key in r.stderr, r.stderr
