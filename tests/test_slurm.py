"""The Slurm job scripts of deploy/slurm on a real Slurm: two nodes (two slurmd) on this host.

The module starts the cluster with ``scripts/slurm-local.sh start`` (installing Slurm and munge
if needed) and stops it at the end, also when a test fails. Every test runs real sbatch jobs:
the per-node helper mounts metfs on both nodes, two torch.distributed (gloo) ranks train
through the two mounts, and the job's cleanup removes every mount and daemon. Each test checks
that nothing is left (``/proc/mounts``, metfs processes) and then sweeps what is, so one failure
does not spill into the next test.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
from conftest import free_port, free_port_pair

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy" / "slurm"
SLURM_LOCAL = ROOT / "scripts" / "slurm-local.sh"
KILLWAIT = 15
# Bounds of the waits below (seconds).
JOB_TIMEOUT = 150
FAIL_FAST = 60


# --------------------------------------------------------------------------------------------
# Leftovers: metfs mounts and daemons under a directory
# --------------------------------------------------------------------------------------------


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def metfs_mounts(under: Path) -> list[str]:
    """Mountpoints under ``under`` that are FUSE mounts (metfs's), from /proc/mounts."""
    prefix = str(under) + "/"
    out = []
    with open("/proc/mounts") as f:
        for line in f:
            fields = line.split()
            mp = _unescape(fields[1])
            if fields[2].startswith("fuse") and mp.startswith(prefix):
                out.append(mp)
    return out


def metfs_daemons(under: Path) -> dict[int, str]:
    """Running (not zombie) metfs processes whose command line names a path under ``under``."""
    out: dict[int, str] = {}
    needle = str(under) + "/"
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        state = stat.rsplit(")", 1)[-1].split()[0]
        if state in ("Z", "X") or not args or os.path.basename(args[0]) != "metfs":
            continue
        if any(needle in a for a in args):
            out[int(entry)] = " ".join(args)
    return out


def leftovers(under: Path, wait: float = 10.0) -> list[str]:
    """What is still mounted or running under ``under`` after up to ``wait`` seconds."""
    end = time.monotonic() + wait
    while True:
        left = [f"mount {m}" for m in metfs_mounts(under)] + [
            f"daemon {pid}: {cmd}" for pid, cmd in metfs_daemons(under).items()
        ]
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.2)


def sweep(under: Path) -> None:
    """Kills metfs daemons and detaches mounts under ``under`` (teardown after a failure)."""
    for pid in metfs_daemons(under):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for mp in metfs_mounts(under):
        subprocess.run(["umount", "-l", mp], capture_output=True)


# --------------------------------------------------------------------------------------------
# The cluster
# --------------------------------------------------------------------------------------------


def _free_port_base() -> int:
    """A port P with P, P+1, P+2 free on loopback (slurmctld and the two slurmd)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base > 60000:
            continue
        ok = True
        for p in range(base, base + 3):
            with socket.socket() as t:
                try:
                    t.bind(("0.0.0.0", p))
                except OSError:
                    ok = False
        if ok:
            return base
    raise RuntimeError("no three consecutive free ports")


@dataclass
class Job:
    id: str
    output: Path

    def text(self) -> str:
        return self.output.read_text(errors="replace") if self.output.exists() else ""


@dataclass
class Cluster:
    dir: Path
    env: dict[str, str]

    def run(self, *cmd: str, timeout: float = 30) -> str:
        r = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout)
        assert r.returncode == 0, f"{' '.join(cmd)}: {r.stderr}"
        return r.stdout

    def sbatch(self, script: Path, env: dict[str, str], output: Path, *opts: str) -> Job:
        r = subprocess.run(
            ["sbatch", "--parsable", f"--output={output}", "--time=5", *opts, str(script)],
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert r.returncode == 0, f"sbatch {script}: {r.stderr}"
        return Job(r.stdout.strip().split(";")[0], output)

    def info(self, job: Job) -> dict[str, str]:
        out = self.run("scontrol", "show", "job", "-o", job.id)
        return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)

    def in_queue(self, job: Job) -> bool:
        """Whether the job is pending, running or still completing (its steps not all gone)."""
        return bool(self.run("squeue", "-h", "-j", job.id, "-o", "%T").strip())

    def ensure_up(self) -> None:
        """Starts again a slurmd that died, so that one crash fails one test, not every test
        after it. Debian 12's slurmd 22.05 has aborted on a corrupted heap while launching two
        steps of a job at once (`malloc(): unaligned tcache chunk detected` under
        `nodelist_find`), once in many runs; the cluster is real, so its bugs are too.
        `slurm-local.sh start` checks each daemon and starts only what is not running."""
        r = subprocess.run(
            [str(SLURM_LOCAL), "start"], env=self.env, capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, f"slurm-local.sh start failed:\n{r.stderr}"
        if "starting slurmd" in r.stderr:
            print(
                f"a slurmd had died (log and core in {self.env['SLURM_LOCAL_DIR']}/log):\n{r.stderr}",
                file=sys.stderr,
            )

    def wait(self, job: Job, timeout: float = JOB_TIMEOUT) -> dict[str, str]:
        end = time.monotonic() + timeout
        while self.in_queue(job):
            if time.monotonic() > end:
                subprocess.run(["scancel", job.id], env=self.env, capture_output=True)
                pytest.fail(
                    f"job {job.id} still in the queue after {timeout}s:\n{job.text()[-3000:]}"
                )
            time.sleep(0.5)
        return self.info(job)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    d = Path(tempfile.mkdtemp(prefix="metfs-slurm-", dir="/tmp"))
    # The cluster's directory and port: SLURM_LOCAL_DIR and SLURM_LOCAL_PORT when set (to run
    # these tests beside another local cluster), else a directory of the test's own and free
    # ports. Either way the module starts the cluster and stops it at its end.
    env = dict(
        os.environ,
        SLURM_LOCAL_DIR=os.environ.get("SLURM_LOCAL_DIR") or str(d / "slurm"),
        SLURM_LOCAL_PORT=os.environ.get("SLURM_LOCAL_PORT") or str(_free_port_base()),
        SLURM_LOCAL_KILLWAIT=str(KILLWAIT),
    )
    try:
        r = subprocess.run(
            [str(SLURM_LOCAL), "start"], env=env, capture_output=True, text=True, timeout=600
        )
        assert r.returncode == 0, f"slurm-local.sh start failed:\n{r.stderr}"
        m = re.search(r"export SLURM_CONF=(\S+)", r.stdout)
        assert m, r.stdout
        env["SLURM_CONF"] = m.group(1)
        yield Cluster(d, env)
    finally:
        subprocess.run([str(SLURM_LOCAL), "stop"], env=env, capture_output=True, timeout=120)
        sweep(d)
        shutil.rmtree(d, ignore_errors=True)


def _dataset_module() -> Any:
    spec = importlib.util.spec_from_file_location(
        "make_dataset", ROOT / "scripts" / "make_dataset.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def dataset(cluster: Cluster) -> tuple[Path, set[str]]:
    src = cluster.dir / "tier"
    # 170 files: the nodes' views differ in size, so ranks take different numbers of steps.
    _dataset_module().make_dataset(str(src), classes=10, per_class=17, seed=1)
    files = {str(p.relative_to(src)) for p in src.rglob("*") if p.is_file()}
    assert len(files) == 170
    return src, files


@dataclass
class Work:
    """One test's directory (node caches, mounts, rank logs, job outputs) and job settings."""

    dir: Path
    env: dict[str, str]

    @property
    def logs(self) -> Path:
        return self.dir / "logs"

    def ranks(self) -> list[list[dict[str, Any]]]:
        out = []
        for r in (0, 1):
            p = self.logs / f"rank{r}.jsonl"
            out.append(
                [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []
            )
        return out

    def wait_passes(self, n: int, job: Job, cluster: Cluster, timeout: float = 120) -> None:
        end = time.monotonic() + timeout
        while min(len(r) for r in self.ranks()) < n:
            if not cluster.in_queue(job):
                pytest.fail(f"job {job.id} ended before {n} passes:\n{job.text()[-3000:]}")
            if time.monotonic() > end:
                pytest.fail(f"fewer than {n} passes after {timeout}s:\n{job.text()[-3000:]}")
            time.sleep(0.3)


@pytest.fixture
def work(
    cluster: Cluster, dataset: tuple[Path, set[str]], metfs: str, request: pytest.FixtureRequest
) -> Iterator[Work]:
    cluster.ensure_up()
    d = cluster.dir / request.node.name[:40]
    for n in ("n1", "n2"):
        (d / n).mkdir(parents=True)
    src, _ = dataset
    env = {
        "METFS_BIN": metfs,
        "METFS_SOURCE": str(src),
        "METFS_CACHE_ROOT": str(d / "%n" / "cache"),
        "METFS_BUDGET": "8MiB",
        "METFS_MOUNTPOINT": str(d / "%n" / "mnt"),
        "METFS_ARGS": "--mini-epochs 2 --rf 2 --compose random --seed 3",
        "METFS_MOUNT_TIMEOUT": "120",
        "METFS_DEPLOY": str(DEPLOY),
        "PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT / "bindings" / "python" / "src"), os.environ.get("PYTHONPATH", "")]
        ).rstrip(os.pathsep),
        "TRAIN_ARGS": f"--epochs 2 --log-dir {d / 'logs'}",
    }
    try:
        yield Work(d, env)
    finally:
        # Jobs of a failed test must not run on into the next one.
        out = subprocess.run(
            ["squeue", "-h", "-o", "%i"], env=cluster.env, capture_output=True, text=True
        ).stdout.split()
        for jid in out:
            subprocess.run(["scancel", jid], env=cluster.env, capture_output=True)
        end = time.monotonic() + KILLWAIT + 30
        while out and time.monotonic() < end:
            out = subprocess.run(
                ["squeue", "-h", "-o", "%i"], env=cluster.env, capture_output=True, text=True
            ).stdout.split()
            time.sleep(0.5)
        sweep(d)


def check_no_leftovers(work: Work, job: Job) -> None:
    left = leftovers(work.dir)
    assert not left, f"left behind after job {job.id}: {left}\n{job.text()[-3000:]}"


def check_agreement(work: Work, files: set[str], epochs: int) -> None:
    """Both ranks at the same mini-epoch at every pass; nodes' slots disjoint; each epoch covered."""
    r0, r1 = work.ranks()
    assert len(r0) == len(r1) > 0
    pos0 = [(p["epoch"], p["mini_epoch"]) for p in r0]
    pos1 = [(p["epoch"], p["mini_epoch"]) for p in r1]
    assert pos0 == pos1, f"ranks disagree: {pos0} vs {pos1}"
    assert {e for e, _ in pos0} == set(range(epochs)), pos0
    assert {p["node"] for p in r0} == {"n1"} and {p["node"] for p in r1} == {"n2"}
    # A view switch on one node is a view switch on the other: generations move together.
    for a, b in zip(r0, r1, strict=True):
        assert a["generation"] - r0[0]["generation"] == b["generation"] - r1[0]["generation"]
    views: dict[tuple[int, int], list[set[str]]] = {}
    for a, b in zip(r0, r1, strict=True):
        key = (a["epoch"], a["mini_epoch"])
        fa, fb = set(a["files"]), set(b["files"])
        assert fa and fb, f"an empty view at {key}"
        if key in views:  # a repeated pass shows the same slot
            assert [fa, fb] == views[key], f"the view changed within mini-epoch {key}"
        views[key] = [fa, fb]
        assert not fa & fb, f"nodes share files at {key}: {sorted(fa & fb)[:5]}"
    for e in range(epochs):
        parts = [s for (ep, _), pair in views.items() if ep == e for s in pair]
        union = set().union(*parts)
        assert union == files, (
            f"epoch {e}: missing {sorted(files - union)[:5]}, extra {sorted(union - files)[:5]}"
        )
        assert sum(len(s) for s in parts) == len(files), f"epoch {e}: a file was served twice"


# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------


def test_pytorch_job_two_nodes_agree_and_clean_up(
    cluster: Cluster, work: Work, dataset: tuple[Path, set[str]]
) -> None:
    env = dict(work.env, TRAIN_ARGS=f"--epochs 2 --batch-size 4 --log-dir {work.logs}")
    job = cluster.sbatch(DEPLOY / "train-pytorch.sbatch", env, work.dir / "job.out")
    info = cluster.wait(job)
    out = job.text()
    assert info["JobState"] == "COMPLETED", f"{info['JobState']}:\n{out[-4000:]}"
    for node in ("n1", "n2"):
        assert f"metfs-node: {node}: mounted" in out and "first mini-epoch staged" in out, out
        assert f"metfs-node: {node}: unmounted" in out, out
    assert "coordinator TorchDistributedCoordinator" in out, out
    check_agreement(work, dataset[1], epochs=2)
    # Uneven views (DDP under Join): some pass had more files on one node than on the other.
    r0, r1 = work.ranks()
    assert any(len(a["files"]) != len(b["files"]) for a, b in zip(r0, r1, strict=True)), [
        (len(a["files"]), len(b["files"])) for a, b in zip(r0, r1, strict=True)
    ]
    check_no_leftovers(work, job)


def test_pytorch_job_with_dynamic_sharding_on_the_jobs_own_etcd(
    cluster: Cluster, work: Work, dataset: tuple[Path, set[str]]
) -> None:
    """METFS_DDS=auto: the job starts its own etcd on its first node, every node's mount takes
    its mini-epochs from the queue there, ranks agree on the mini-epoch sequence, and the two
    nodes' views of an epoch are disjoint and cover the dataset."""
    # A 2 MiB budget: slots of ~40 of the 170 files, so an epoch is several batches.
    env = dict(
        work.env,
        METFS_DDS="auto",
        METFS_BUDGET="2MiB",
        METFS_ARGS="--rf 2 --compose random --seed 3",
        METFS_ETCD_PORT=str(free_port_pair()),
        TRAIN_ARGS=f"--epochs 2 --batch-size 4 --log-dir {work.logs}",
    )
    job = cluster.sbatch(DEPLOY / "train-pytorch.sbatch", env, work.dir / "job.out")
    info = cluster.wait(job)
    out = job.text()
    assert info["JobState"] == "COMPLETED", f"{info['JobState']}:\n{out[-4000:]}"
    assert "etcd for the job's shard queue" in out, out[-3000:]
    for node in ("n1", "n2"):
        assert f"metfs-node: {node}: mounting" in out and "shards from the queue etcd://" in out, (
            out
        )
        assert f"metfs-node: {node}: unmounted" in out, out
    r0, r1 = work.ranks()
    assert len(r0) == len(r1) > 0
    assert [p["mini_epoch"] for p in r0] == [p["mini_epoch"] for p in r1]
    files = dataset[1]
    seen: list[set[str]] = [set(), set()]
    for rank, passes in enumerate((r0, r1)):
        for p in passes:
            if p["epoch"] == 0:
                seen[rank] |= set(p["files"])
    assert not seen[0] & seen[1], sorted(seen[0] & seen[1])[:5]
    assert seen[0] | seen[1] == files, sorted(files - (seen[0] | seen[1]))[:5]
    check_no_leftovers(work, job)
    # The job's etcd ended with the job.
    end = time.monotonic() + 20
    while True:
        etcds = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if cmd.startswith("etcd ") and str(work.dir) in cmd:
                etcds.append(pid)
        if not etcds or time.monotonic() > end:
            break
        time.sleep(0.2)
    assert not etcds, f"the job's etcd is still running: {etcds}"


def test_adjust_bs_three_ranks_per_node_a_capped_node_gets_smaller_batches(
    cluster: Cluster, work: Work
) -> None:
    """ADJUST_BS (paper 003) on two nodes with three ranks each (torchrun), on the job's own
    shard queue: every rank paced at 200 samples per second, n2's capped at 25 from pass 8.
    Every rank sees the same sizes at every pass, adding up to the global batch; they stay the
    even split until AntDT's trigger finds n2 a straggler over the 1 s window, then all ranks
    adopt smaller batches for n2 at the same pass, and only after the cap."""
    t0 = time.monotonic()
    # etcd takes etcd_port and etcd_port + 1; the master's port is neither.
    etcd_port = free_port_pair()
    master_port = next(p for p in iter(free_port, None) if p not in (etcd_port, etcd_port + 1))
    batch, passes, slow_from = 24, 24, 8
    train_args = (
        f"--global-batch {batch} --passes {passes} --steps 4 --rate 200 "
        f"--slow n2:25:{slow_from} --window 1 --slowness 1.5 --log-dir {work.logs}"
    )
    env = dict(
        work.env,
        METFS_DDS="auto",
        METFS_BUDGET="2MiB",
        METFS_ARGS="--rf 2 --compose random --seed 3",
        METFS_ETCD_PORT=str(etcd_port),
        MASTER_PORT=str(master_port),
        TRAIN=str(ROOT / "tests" / "adjust_bs_rank.py"),
        TRAIN_ARGS=train_args,
        LAUNCHER="torchrun",
        GPUS_PER_NODE="3",
    )
    # One torchrun per node starts its three ranks (LOCAL_WORLD_SIZE=3): the local cluster's
    # nodes have two CPUs, and Slurm refuses three tasks per node even with --overcommit.
    job = cluster.sbatch(DEPLOY / "train-pytorch.sbatch", env, work.dir / "job.out")
    info = cluster.wait(job)
    out = job.text()
    # torchrun's failure summary fills the output's tail; the ranks' own reasons come earlier.
    reasons = [
        line
        for line in out.splitlines()
        if line.startswith("train: rank") or "Error" in line or "error" in line
    ][:30]
    assert info["JobState"] == "COMPLETED", (
        f"{info['JobState']}; the ranks' reasons:\n" + "\n".join(reasons) + f"\n...\n{out[-3000:]}"
    )
    logs = {
        r: [json.loads(line) for line in (work.logs / f"bs-rank{r}.jsonl").read_text().splitlines()]
        for r in range(6)
    }
    assert all(len(v) == passes for v in logs.values()), {r: len(v) for r, v in logs.items()}
    assert sorted((v[0]["node"], v[0]["local"]) for v in logs.values()) == [
        (n, i) for n in ("n1", "n2") for i in range(3)
    ]
    even = {"n1": [4, 4, 4], "n2": [4, 4, 4]}
    sizes = []
    for i in range(passes):
        at = [logs[r][i] for r in range(6)]
        s = at[0]["sizes"]
        # One collective step: the same sizes on every rank, each rank taking its own.
        assert all(a["sizes"] == s for a in at), at
        assert all(a["batch_size"] == s[a["node"]][a["local"]] for a in at), at
        assert sum(map(sum, s.values())) == batch, s
        sizes.append(s)
    changed = [i for i in range(1, passes) if sizes[i] != sizes[i - 1]]
    assert changed, f"the sizes never changed: {sizes[-1]}\n{out[-3000:]}"
    first = changed[0]
    # Even until the trigger; the trigger only after the cap (its sizes hold from the next pass).
    assert all(s == even for s in sizes[:first]), sizes
    assert first > slow_from, (first, out[-3000:])
    for s in sizes[first:]:
        assert max(s["n2"]) < min(s["n1"]), s
    changes = [
        json.loads(line.split("adjust-bs: change ", 1)[1])
        for line in out.splitlines()
        if "adjust-bs: change " in line
    ]
    assert changes and changes[0]["boundary"] == first - 1, (changes, first)
    assert changes[0]["stragglers"] == ["n2"] and changes[0]["window_s"] >= 1.0, changes[0]
    assert changes[0]["bpt"]["n2"] >= 1.5 * changes[0]["mean_bpt"], changes[0]
    check_no_leftovers(work, job)
    print(
        f"ADJUST_BS job: {time.monotonic() - t0:.1f} s, sizes {sizes[first - 1]} -> "
        f"{sizes[first]} at pass {first}, {len(changes)} change(s)"
    )


def test_keras_job_two_nodes_agree_and_clean_up(
    cluster: Cluster, work: Work, dataset: tuple[Path, set[str]]
) -> None:
    job = cluster.sbatch(DEPLOY / "train-keras.sbatch", work.env, work.dir / "job.out")
    info = cluster.wait(job)
    out = job.text()
    assert info["JobState"] == "COMPLETED", f"{info['JobState']}:\n{out[-4000:]}"
    # rf 2 over 2 epochs of 2 mini-epochs: 8 passes, plus a bonus pass for each `wait` (the
    # next mini-epoch not staged yet, as on a busy machine). Each mini-epoch gets at least its
    # rf, in order.
    done = re.search(r"train: done after (\d+) passes \(done=True\)", out)
    assert done and int(done.group(1)) >= 8, out
    seen = re.findall(r"train: pass \d+ epoch (\d+) mini-epoch (\d+)", out)
    assert len(seen) == int(done.group(1)), out
    per_view = Counter((int(e), int(m)) for e, m in seen)
    assert list(per_view) == [(0, 0), (0, 1), (1, 0), (1, 1)], per_view
    assert all(n >= 2 for n in per_view.values()), per_view
    check_agreement(work, dataset[1], epochs=2)
    check_no_leftovers(work, job)


def test_sweep_trials_share_one_store_on_one_node(
    cluster: Cluster, work: Work, dataset: tuple[Path, set[str]]
) -> None:
    # The sweep template: one shared daemon on one node, two trials with their own learning
    # rates, each its own job of the store (METFS_JOB=trial-N) reading its own view.
    env = dict(
        work.env,
        # Each trial's view holds about a third of the dataset (views of 122 KiB).
        METFS_BUDGET="2200KiB",
        METFS_ARGS="--share --share-jobs 2 --rf 2 --seed 3",
        TRAIN_ARGS=f"--epochs 2 --batch-size 4 --log-dir {work.logs}",
        LRS="0.1 0.5",
    )
    job = cluster.sbatch(DEPLOY / "sweep-one-node.sbatch", env, work.dir / "job.out", "--ntasks=2")
    info = cluster.wait(job)
    out = job.text()
    assert info["JobState"] == "COMPLETED", f"{info['JobState']}:\n{out[-4000:]}"
    assert "2 trials on one shared store" in out and "every trial finished" in out, out
    node = next(n for n in ("n1", "n2") if f"metfs-node: {n}: mounted" in out)
    assert f"metfs-node: {node}: unmounted" in out, out
    mnt = work.dir / node / "mnt"
    files = dataset[1]
    for trial in ("trial-0", "trial-1"):
        assert f"train: job {trial} on a shared store, its view at {mnt / trial}" in out, out
        log = work.logs / f"{trial}-rank0.jsonl"
        passes = [json.loads(line) for line in log.read_text().splitlines()]
        assert passes and {p["node"] for p in passes} == {node}
        # Its own views: each epoch is the whole dataset once, in views of about a third.
        views: dict[tuple[int, int], set[str]] = {}
        for p in passes:
            key, fs = (p["epoch"], p["mini_epoch"]), set(p["files"])
            assert views.setdefault(key, fs) == fs, f"{trial}: the view changed within {key}"
        assert {e for e, _ in views} == {0, 1}, sorted(views)
        for e in (0, 1):
            parts = [fs for (ep, _), fs in views.items() if ep == e]
            assert len(parts) >= 2, f"{trial}: epoch {e} in one view"
            assert set().union(*parts) == files and sum(map(len, parts)) == len(files), (
                f"{trial}: epoch {e} is not the dataset once"
            )
    check_no_leftovers(work, job)


def test_scancel_mid_run_leaves_nothing(cluster: Cluster, work: Work) -> None:
    env = dict(work.env, TRAIN_ARGS=f"--epochs 1000 --pass-sleep 0.3 --log-dir {work.logs}")
    job = cluster.sbatch(DEPLOY / "train-pytorch.sbatch", env, work.dir / "job.out")
    work.wait_passes(3, job, cluster)
    assert len(metfs_daemons(work.dir)) == 2 and len(metfs_mounts(work.dir)) == 2
    cluster.run("scancel", job.id)
    info = cluster.wait(job, timeout=KILLWAIT + 45)
    assert info["JobState"] == "CANCELLED", info["JobState"]
    check_no_leftovers(work, job)
    # The guard steps did it: Slurm refuses new steps (the trap's umount step) once cancelled.
    out = job.text()
    for node in ("n1", "n2"):
        assert f"metfs-node: {node}: job ending: unmounting" in out, out


def test_time_limit_trap_unmounts_every_node(cluster: Cluster, work: Work) -> None:
    # --signal=B:TERM@45 with a one-minute limit: the batch script gets SIGTERM 15 s after the
    # start at the earliest (Slurm's periodic check adds up to ~30 s), once the job's catalog
    # step, node check and mount are done, and its trap unmounts every node in the 45 s left.
    env = dict(work.env, TRAIN_ARGS=f"--epochs 1000 --pass-sleep 0.3 --log-dir {work.logs}")
    job = cluster.sbatch(
        DEPLOY / "train-pytorch.sbatch", env, work.dir / "job.out", "--time=1", "--signal=B:TERM@45"
    )
    t0 = time.monotonic()
    info = cluster.wait(job, timeout=120)
    out = job.text()
    assert "metfs: job signalled (time limit or cancel)" in out, out[-4000:]
    assert "metfs: unmounting on every node" in out, out[-4000:]
    assert "the umount step failed" not in out, out[-4000:]
    for node in ("n1", "n2"):
        assert f"metfs-node: {node}: unmounted" in out, out[-4000:]
    assert info["JobState"] in ("FAILED", "TIMEOUT"), info["JobState"]
    assert time.monotonic() - t0 < 100
    check_no_leftovers(work, job)


def test_bad_budget_and_missing_cache_fail_the_step_with_node_and_reason(
    cluster: Cluster, work: Work
) -> None:
    # n1: the budget cannot even hold the metadata; n2: its node-local directory is missing.
    shutil.rmtree(work.dir / "n2")
    env = dict(work.env, METFS_BUDGET="16KiB")
    job = cluster.sbatch(DEPLOY / "train-pytorch.sbatch", env, work.dir / "job.out")
    info = cluster.wait(job, timeout=90)
    out = job.text()
    assert info["JobState"] == "FAILED", f"{info['JobState']}:\n{out}"
    assert re.search(r"metfs-node: n1: mount failed: .*budget 16\.00 KiB is too small", out), out
    assert re.search(
        r"metfs-node: n2: cache directory \S+/n2/cache: its parent \S+/n2 does not exist", out
    ), out
    assert "every node staged its first mini-epoch" not in out, out
    check_no_leftovers(work, job)


def test_daemon_killed_on_one_node_fails_training_fast(cluster: Cluster, work: Work) -> None:
    env = dict(work.env, TRAIN_ARGS=f"--epochs 1000 --pass-sleep 0.3 --log-dir {work.logs}")
    job = cluster.sbatch(DEPLOY / "train-pytorch.sbatch", env, work.dir / "job.out")
    work.wait_passes(3, job, cluster)
    lock = work.dir / "n2" / "cache" / "metfs.lock"
    pid = int(lock.read_text().strip())
    assert pid in metfs_daemons(work.dir), (pid, metfs_daemons(work.dir))
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    info = cluster.wait(job, timeout=FAIL_FAST + 30)
    elapsed = time.monotonic() - t0
    out = job.text()
    assert info["JobState"] == "FAILED", f"{info['JobState']}:\n{out[-4000:]}"
    assert elapsed < FAIL_FAST, f"the job took {elapsed:.0f}s to fail:\n{out[-4000:]}"
    # Every rank names the failure: rank 1 its own daemon, rank 0 the peer on n2.
    reasons = re.findall(r"train: rank (\d) on (n\d): (.*)", out)
    assert reasons, out[-4000:]
    assert any(node == "n2" and ("metfs" in why or "daemon" in why) for _, node, why in reasons), (
        reasons
    )
    check_no_leftovers(work, job)


def test_epilog_removes_what_a_job_left_behind(cluster: Cluster, work: Work) -> None:
    # A job that mounts and never cleans up: its daemons outlive it (proctrack/linuxproc).
    script = work.dir / "leaky.sbatch"
    script.write_text(
        "#!/usr/bin/env bash\nset -euo pipefail\n"
        f"srun --ntasks-per-node=1 {DEPLOY / 'metfs-node.sh'} mount\n"
    )
    job = cluster.sbatch(script, work.env, work.dir / "job.out", "--nodes=2", "--ntasks-per-node=1")
    info = cluster.wait(job, timeout=90)
    assert info["JobState"] == "COMPLETED", job.text()
    assert len(metfs_daemons(work.dir)) == 2 and len(metfs_mounts(work.dir)) == 2, job.text()
    # One daemon dies on its own; the other is still serving.
    os.kill(int((work.dir / "n2" / "cache" / "metfs.lock").read_text()), signal.SIGKILL)
    for node in ("n1", "n2"):
        r = subprocess.run(
            [str(DEPLOY / "epilog.sh")],
            env=dict(os.environ, SLURM_JOB_ID=job.id, SLURMD_NODENAME=node),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
    check_no_leftovers(work, job)
