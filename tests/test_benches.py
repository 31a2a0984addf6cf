"""Every benchmark runs: each script in benches/ with `--quick` (the same code paths at a tiny
size, seconds each) completes and prints its tables and ratio lines, found by their headers and
labels, not by their numbers (those belong to the full runs in docs/BENCHMARKS.md). Servers are
real: Garage by scripts/garage.sh, etcd, `mpirun`.

benches/scale.py, benches/peers and benches/tta.py have tests of their own
(test_scale_bench.py, test_peers_bench.py, test_tta_bench.py). A prerequisite that is missing
fails the test under METFS_REQUIRE_SERVERS=1 (as the test command sets it) and skips it
otherwise, naming what is missing."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import ROOT, metfs_bin

BENCHES = ROOT / "benches"


@dataclass
class Case:
    """A script's quick run: its arguments after the script, what it needs, and the lines it
    must print (each string must occur in its output)."""

    args: list[str]
    expect: list[str]
    needs: list[str] = field(default_factory=list)


# What each need checks, and the reason given when it is missing.
NEEDS = {
    "root": (lambda: os.geteuid() == 0, "FUSE mounts and page cache drops need root"),
    "mpirun": (lambda: bool(shutil.which("mpirun")), "needs Open MPI (scripts/install-deps.sh)"),
    "etcd": (lambda: bool(shutil.which("etcd")), "needs etcd (scripts/install-deps.sh)"),
    "fio": (lambda: bool(shutil.which("fio")), "needs fio (scripts/install-deps.sh)"),
    "time": (lambda: os.access("/usr/bin/time", os.X_OK), "needs GNU time (apt-get install time)"),
    "aws": (lambda: bool(shutil.which("aws")), "needs awscli (pip install awscli)"),
    "garage": (
        lambda: bool(shutil.which("garage")) or (Path.home() / ".cargo/bin/garage").exists(),
        "needs Garage (scripts/garage.sh install)",
    ),
    "h5py": (lambda: _imports("h5py"), "needs h5py (pip install h5py)"),
    "PIL": (lambda: _imports("PIL"), "needs Pillow (pip install Pillow)"),
    "numpy": (lambda: _imports("numpy"), "needs numpy (pip install numpy)"),
    "torch": (lambda: _imports("torch"), "needs torch (requirements-test.txt)"),
}


def _imports(module: str) -> bool:
    try:
        __import__(module)
        return True
    except ImportError:
        return False


CASES = {
    "aggregate.py": Case(
        ["--quick"],
        [
            "| mode | tier bytes per epoch after epoch 0 | seconds to fill the next slot | ratio to tier |",
            "| tier | ",
            "| aggregate | ",
        ],
        ["root", "mpirun"],
    ),
    "aggregate_wire.py": Case(
        ["--quick"],
        [
            "| α | code | sender | broadcast | wire MiB |",
            "| uncoded | extra | direct |",
            "| uberShuffle | peers | ring |",
            "| uberShuffle | extra | direct |",
            "| uberShuffle | extra | ring |",
            "| α | p | α held | uncoded MiB | coded MiB | coded/uncoded |",
            "| 0.500 | 0.333 |",
        ],
        ["root", "mpirun"],
    ),
    "core_bench.py": Case(
        ["--quick"],
        [
            "| benchmark | baseline | metfs | ratio |",
            "| read 1 MiB files, cold | direct (slot files under a lease) |",
            "| read 1 MiB files, warm | cached",
            "| read 16 KiB files, cold | passthrough",
            "| read 16 KiB files, warm | pread",
            "| stage 64 x 16 KiB | cp -r ",
            "| stage 2 x 8 MiB | ",
            "x the faster cp; ",
            "| view switch, 500-file mini-epoch |",
        ],
        ["root", "fio"],
    ),
    "dds_straggler.py": Case(
        ["--quick"], ['"dds_share": ', '{"median": {"static_s": ', '"ratio": '], ["etcd"]
    ),
    "dds_straggler_mounts.py": Case(
        ["--quick"],
        ["| 240 files, budget 3MiB per node", "| static ", "| queue ", "| ratio ", "| etcd "],
        ["root", "etcd"],
    ),
    "jobs_tier.py": Case(
        # The cap is the tier's to hold on a busy machine: said, not fatal, here (the bad-input
        # test below checks that an unholdable cap stops the run).
        ["--quick", "--allow-slow-tier"],
        [
            "Several jobs, one tier: 2 jobs with their own mounts start 3 s apart",
            "Arithmetic: one job alone trains C = ",
            "| side | policy | job 1 to target, s | job 2 to target, s | last job reaches target, s |",
            "| fixed rf 1 | fixed, rf 1 | ",
            "| fixed rf 4 | fixed, rf 4 | ",
            "| default | ",
            "| side | seed | job | starts at, s | to target, s | reaches target at, s |",
            "tier-bound check: ",
            "goal: default (",
        ],
        ["root", "garage", "torch"],
    ),
    "job_start.py": Case(
        ["--quick"],
        [
            "# job start: ",
            "| nodes | pacing | runs | every node's first mini-epoch, s | training starts, s |",
            "| 1 | default | 1 | ",
            "| 1 | auto | 1 | ",
            "| 2 | default | 1 | ",
            "| 2 | auto | 1 | ",
            "model (docs/MODEL.md)",
        ],
        ["root", "garage"],
    ),
    "met_bandwidth.py": Case(
        ["--quick"],
        [
            "| consumer | samples/s | of target | waited | tier bytes / sample |",
            "| baseline (direct, tier capped at B2) |",
            "| metfs rf=1 |",
            "| metfs rf=8 |",
            "| metfs rf=8, --prefetch-rate auto |",
            "MiB/s needed)",
        ],
        ["root"],
    ),
    "nodes.py": Case(
        ["--quick"],
        [
            "# many nodes on one machine: ",
            "## the shard queue in etcd",
            "| workers | stripes | killed | shards/epoch | run s | etcd req/s | watch msgs/s ",
            # One cursor per epoch beside the striped queue, at each size.
            "| 8 | 1 | 1 | 96 | ",
            "| 8 | 16 | 1 | 96 | ",
            "| 32 | 1 | 1 | 384 | ",
            "| 32 | 16 | 1 | 384 | ",
            "at 32 workers, claim p99 with 16 stripes ",
            " ms with one cursor per epoch: ",
            # The invariant held at both sizes (a violation prints CHECK FAILED and exits 1).
            "| yes (2 x 96) |",
            "| yes (2 x 384) |",
            "goal at 32 workers: claim p99 <= 50 ms: ",
            "goal at 32 workers: requeue within lease 2 s + 2 s = 4 s: ",
            "## the decision broadcast (torch.distributed, gloo)",
            "| ranks | advances | broadcast p50 ms | broadcast p99 ms ",
            "| 8 | 6 | ",
        ],
        ["etcd"],
    ),
    "share.py": Case(
        ["--quick"],
        [
            "| case | shared / one job on its own mount | separate / one job on its own mount |",
            "| same2 | ",
            "| overlap | ",
            "| staggered arrivals, 4 jobs over 75% subsets |",
            "| refcnt / lru |",
        ],
        ["root"],
    ),
    "transform_bench.py": Case(
        ["--quick"],
        [
            "rep 0 reader ",
            "rep 0 transform ",
            "median samples/s: reader decodes every pass ",
            ", --transform ",
            ", ratio ",
        ],
        ["root", "numpy", "PIL"],
    ),
    "hdf5_staging.sh": Case(
        ["--quick"],
        [
            "| tool | median s | MiB/s | vs cp | peak RSS MiB |",
            "| cp | ",
            "| metfs | ",
            "| h5py | ",
            "metfs / cp throughput: ",
            "metfs / h5py throughput: ",
            "metfs peak RSS: ",
        ],
        ["time", "h5py", "numpy"],
    ),
    "manifest_mount.sh": Case(
        ["--quick", "{tmp}/manifest"],
        [
            "| samples in the manifest | mount until the first mini-epoch (",
            "`metfs plan`, manifest cold / warm |",
            "| 2000 | ",
        ],
        ["root", "time"],
    ),
    "plan_scale.sh": Case(
        ["--quick", "{tmp}/plan"],
        ["10k ", "10k-shuf ", "20k ", "20k-shuf ", "s wall (goal ", "MB peak RSS (goal "],
        ["time"],
    ),
    "s3_staging.sh": Case(
        ["--quick"],
        [
            "| objects | tool | median s | MiB/s |",
            "| 40 x 128 KiB | awscli |",
            "| 40 x 128 KiB | ceiling-sync |",
            "| 40 x 128 KiB | metfs |",
            "| 2 x 8 MiB | metfs-nofsync |",
            "| 2 x 8 MiB | metfs-mount |",
            "| objects | metfs vs awscli (goal >= 1.5x) |",
            "| 2 x 8 MiB | ",
        ],
        ["root", "garage", "aws"],
    ),
}

# Examples the shell scripts run from beside METFS_BIN (the Python ones build theirs).
EXAMPLES = {
    "hdf5_staging.sh": ("metfs-prefetcher", "h5_stage"),
    "s3_staging.sh": ("metfs-prefetcher", "s3_fetch"),
}


def need(what: list[str]) -> None:
    missing = [why for w in what for ok, why in [NEEDS[w]] if not ok()]
    if not missing:
        return
    why = "; ".join(missing)
    if os.environ.get("METFS_REQUIRE_SERVERS", "0") not in ("", "0"):
        pytest.fail(f"METFS_REQUIRE_SERVERS is set and {why}")
    pytest.skip(why)


def mounted_under(top: Path) -> list[str]:
    prefix = str(top) + "/"
    with open("/proc/self/mounts") as f:
        points = [line.split()[1].replace("\\040", " ") for line in f]
    return [p for p in points if p.startswith(prefix)]


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short directory under /tmp (the benchmarks' temporary directories go there, and a Unix
    socket's path has at most 107 bytes); whatever a failed run left mounted there is
    unmounted."""
    d = Path(tempfile.mkdtemp(prefix="mb-", dir="/tmp"))
    try:
        yield d
    finally:
        for p in mounted_under(d):
            subprocess.run([metfs_bin(), "umount", p], capture_output=True, timeout=60, check=False)
        for p in mounted_under(d):
            subprocess.run(["umount", "-l", p], capture_output=True, check=False)
        shutil.rmtree(d, ignore_errors=True)


def test_every_benchmark_has_a_quick_test() -> None:
    """Each script in benches/ is run here, or by a test of its own that runs its `--quick`
    (a tests/test_*.py that names it and `--quick`)."""
    scripts = {p.name for p in BENCHES.iterdir() if p.is_file() and p.suffix in (".py", ".sh")}
    elsewhere = {
        name
        for t in Path(__file__).parent.glob("test_*.py")
        if t.name != Path(__file__).name and "--quick" in (text := t.read_text())
        for name in scripts
        if f"benches/{name}" in text
    }
    # Not benchmarks: the helpers, and the planning benchmarks' manifest writer (which runs in
    # theirs, and in test_gen_manifest below).
    helpers = {"benchlib.py", "gen_manifest.py"}
    untested = scripts - set(CASES) - elsewhere - helpers
    assert not untested, f"scripts in benches/ whose --quick no test runs: {sorted(untested)}"
    assert set(CASES) <= scripts, set(CASES) - scripts


@pytest.mark.parametrize("script", sorted(CASES))
def test_benchmark_quick(script: str, short_tmp: Path) -> None:
    case = CASES[script]
    need(case.needs)
    exe = Path(metfs_bin())
    if script in EXAMPLES and not (exe.parent / "examples" / EXAMPLES[script][1]).exists():
        package, example = EXAMPLES[script]
        assert exe.parent == ROOT / "target" / "debug", f"no {example} beside {exe}"
        subprocess.run(
            ["cargo", "build", "-q", "-p", package, "--example", example], cwd=ROOT, check=True
        )
    env = dict(
        os.environ,
        METFS_BIN=str(exe),
        METFS_BENCH_DIR=str(short_tmp / "work"),
        BENCH_DIR=str(short_tmp / "bench"),
        TMPDIR=str(short_tmp),
        # The shell scripts' `python3` is this interpreter (a virtual environment's, maybe).
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        PYTHONDONTWRITEBYTECODE="1",
    )
    path = BENCHES / script
    cmd = [sys.executable, str(path)] if script.endswith(".py") else ["bash", str(path)]
    cmd += [a.format(tmp=short_tmp) for a in case.args]
    t = time.monotonic()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout or ""
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or ""
        pytest.fail(f"{script} --quick ran past 600 s:\n{out[-3000:]}\n{err[-3000:]}")
    secs = time.monotonic() - t
    print(f"{script} --quick: {secs:.1f} s\n{r.stdout}")
    assert r.returncode == 0, (
        f"{script} --quick exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    )
    missing = [line for line in case.expect if line not in r.stdout]
    assert not missing, f"{script} --quick did not print {missing}:\n{r.stdout[-4000:]}"
    assert "CHECK FAILED" not in r.stdout
    assert not mounted_under(short_tmp), "the benchmark left mounts behind"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        # 300 MiB/s: 6,400 GETs/s of 48 KiB, beyond the checker's boto3 clients on any machine
        # the tests run on (and its GETs, twice what the cap would deliver in the check's
        # second, stay few).
        (["--rate-mib", "300"], "jobs_tier.py: --rate-mib 300.0: the proxy cannot hold"),
        (["--target", "99.9"], "jobs_tier.py: --target 99.9 %: the local copy of seed 0 never"),
    ],
    ids=["cap", "target"],
)
def test_jobs_tier_stops_on_bad_input(args: list[str], says: str, short_tmp: Path) -> None:
    """Bad input to benches/jobs_tier.py (issue 52): a tier cap the proxy cannot hold, or a
    target the local copy never reached, stops the run with the input's name and the reason,
    and leaves nothing mounted."""
    need(["root", "garage", "torch"])
    env = dict(os.environ, METFS_BIN=str(metfs_bin()), JOBS_TIER_WORK=str(short_tmp / "work"))
    cmd = [sys.executable, str(BENCHES / "jobs_tier.py"), "--quick", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert r.returncode != 0, r.stdout[-3000:]
    assert says in r.stderr, r.stderr[-3000:]
    assert "Several jobs, one tier" not in r.stdout, "a table was printed after bad input"
    assert not mounted_under(short_tmp), "the benchmark left mounts behind"


def test_job_start_refuses_a_node_count_of_0_or_beyond_the_cluster() -> None:
    """benches/job_start.py: a point of 0 nodes, or of more than the cluster has
    (SLURM_LOCAL_NODES) or the local Slurm emulates, is refused before anything starts, naming
    the setting; so is scripts/slurm-local.sh's own node count of 0 or above its limit."""
    bench = [sys.executable, str(BENCHES / "job_start.py")]
    env = {k: v for k, v in os.environ.items() if k != "SLURM_LOCAL_NODES"}
    cases = [
        (["--nodes", "1,0"], {}, "--nodes 1,0: 0: a job has at least 1 node"),
        (["--nodes", "1,4"], {"SLURM_LOCAL_NODES": "2"}, "4 is more than the cluster's 2 nodes"),
        (["--nodes", "100"], {}, "--nodes 100: 100 is more than the local Slurm emulates"),
        (["--nodes", "2,x"], {}, "--nodes 2,x: `x` is not a node count"),
    ]
    for args, extra, want in cases:
        r = subprocess.run(
            bench + args, capture_output=True, text=True, timeout=60, env={**env, **extra}
        )
        assert r.returncode != 0 and want in r.stderr, (args, r.stderr)
    script = ROOT / "scripts" / "slurm-local.sh"
    for nodes, want in [
        ("0", "SLURM_LOCAL_NODES=0: a cluster has at least 1 node"),
        ("65", "SLURM_LOCAL_NODES=65: more nodes than this script emulates"),
        ("two", "SLURM_LOCAL_NODES=two: not a node count"),
    ]:
        r = subprocess.run(
            ["bash", str(script), "env"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**env, "SLURM_LOCAL_NODES": nodes},
        )
        assert r.returncode != 0 and want in r.stderr, (nodes, r.stderr)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--workers", "0"], "--workers: a worker count of 0: a job has at least 1 node"),
        (["--workers", "8,0"], "--workers: a worker count of 0: a job has at least 1 node"),
        (["--ranks", "0"], "--ranks: a rank count of 0: a job has at least 1 rank"),
    ],
    ids=["workers", "workers-list", "ranks"],
)
def test_nodes_refuses_a_count_of_0(args: list[str], says: str) -> None:
    """benches/nodes.py: a worker (or rank) count of 0 is refused before anything starts,
    naming the setting."""
    cmd = [sys.executable, str(BENCHES / "nodes.py"), *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and says in r.stderr, r.stderr[-2000:]
    assert "## the shard queue" not in r.stdout


def test_gen_manifest(tmp_path: Path) -> None:
    """The planning benchmarks' manifest: N rows over CLASSES classes, in path order or
    shuffled (the benchmarks above run it at their quick sizes)."""
    need(["numpy"])
    for shuffled in (False, True):
        out = tmp_path / f"m-{shuffled}.csv"
        cmd = [sys.executable, str(BENCHES / "gen_manifest.py"), "1003", "10", str(out)]
        subprocess.run(cmd + (["--shuffled"] if shuffled else []), check=True, timeout=60)
        with open(out, newline="") as f:
            rows = list(csv.DictReader(f))
        assert len(rows) == 1003
        assert len({r["label"] for r in rows}) == 10
        assert all(int(r["size"]) > 0 and r["path"].endswith(".JPEG") for r in rows)
        paths = [r["path"] for r in rows]
        assert (paths == sorted(paths)) != shuffled
