#!/usr/bin/env python3
"""Job start at scale: how long a job of N nodes waits until every node has its first
mini-epoch, when all N stage it at the same moment through one shared, rate-capped tier.

    python3 benches/job_start.py              # 1, 2, 4, 8 nodes; 5 runs per point
    python3 benches/job_start.py --quick      # 1 and 2 nodes, tiny data, 1 run (the smoke test)

**The cluster**: the local Slurm of the tests (scripts/slurm-local.sh) with as many emulated
nodes as the largest point (SLURM_LOCAL_NODES; set it to run on a cluster of that size, and a
point above it is refused). The nodes are slurmd processes on this one machine: they share its
cores, its memory and one disk, so N nodes' daemons stage into one file system and compete for
the same CPUs, where a real cluster gives each node its own.

**The tier**: Garage behind benches/peers/proxy.py (`peers.Tier`): one token bucket for all
connections, so the N nodes together get at most the cap, as from one parallel file system or
one object store link. Each node's shard is an equal part of the dataset; every mini-epoch of
every node is the same size M at every point (`--mini-epochs` is set per point so that
M = dataset / (N x nm)), and the budget holds two such slots and the metadata.

**The job**: deploy/slurm/train-pytorch.sbatch as users submit it (`sbatch --nodes=N`): the
catalog step on the first node (the catalog file is kept between jobs, as for a user's next job
of the same dataset version; an untimed job makes it first), the mount step on every node with
its node check (`metfs doctor`), the ready step, then a training script that only records when
it started, and the unmount step. Every job gets fresh caches (`%j`).

**Measured**, per job: from `sbatch` to the moment every node has its first mini-epoch (the last
node's `start` event, which each daemon logs once its first view is staged and served), and how
that splits: the wait before the first node starts staging (submission, catalog step, node
check, mount set-up), the spread of the nodes' staging starts, and the staging itself (first
start to last node done, from each daemon's log). Also the tier bytes delivered by then (the
proxy's count), against the N x M the first mini-epochs need: with the default pacing a node
that is done stages its next mini-epoch at once, at full speed, through the same tier; with
`--prefetch-rate auto` it trickles (256 KiB/s) until the job's first pass is timed. Both pacings
run at each point, alternating, several runs each; medians with min and max are printed, with
the model of docs/MODEL.md ("The first mini-epoch of N nodes") beside them.

Needs root (slurmd, FUSE), Slurm (installed by slurm-local.sh when missing) and Garage
(scripts/garage.sh install). Work directory: $METFS_BENCH_DIR or /tmp/metfs-bench (removed
unless --keep). `METFS_BIN` picks the binary; else the release build.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benches" / "peers"))

import benchlib  # noqa: E402 (the binary under test, medians, mounts)
import run as peers  # noqa: E402 (Garage behind the rate-capping proxy, the dataset upload)

SLURM_LOCAL = ROOT / "scripts" / "slurm-local.sh"
DEPLOY = ROOT / "deploy" / "slurm"
MIB = 1 << 20
# What scripts/slurm-local.sh emulates on one host at most.
MAX_LOCAL_NODES = 64
# Room in the budget for metadata beside the two slots (README "Choosing the budget").
RESERVE = 8 * MIB
PACINGS = {"default": "", "auto": "--prefetch-rate auto"}

# The training script of the job: it only records when it started on each rank.
FIRST_PASS = """\
import json, os, sys, time
t = time.time()
rank = int(os.environ.get("SLURM_PROCID", "0"))
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, "node": os.environ.get("SLURMD_NODENAME"), "t": t}, f)
"""


def log(msg: str) -> None:
    print(f"# {msg}", file=sys.stderr, flush=True)


@dataclass
class Config:
    nodes: list[int]
    runs: int
    files: int  # in the dataset, all of one size
    kib: int
    slot_mib: float  # M: every node's mini-epoch, at every point
    cap_mib: float  # the tier's cap, all nodes together

    @property
    def size(self) -> int:
        return self.kib << 10

    @property
    def m_bytes(self) -> int:
        return int(self.slot_mib * MIB)

    @property
    def cap(self) -> int:
        return int(self.cap_mib * MIB)

    def mini_epochs(self, n: int) -> int:
        """nm per node at `n` nodes, so that each mini-epoch is M."""
        return self.files * self.size // (n * self.m_bytes)

    def budget(self) -> str:
        return f"{(2 * self.m_bytes + RESERVE) // 1024}KiB"


def parse_nodes(text: str, cluster: int | None) -> list[int]:
    """The points of `--nodes`: each a node count of 1 to the cluster's nodes (SLURM_LOCAL_NODES
    when set, else what slurm-local.sh emulates at most)."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit():
            raise SystemExit(f"job_start.py: --nodes {text}: `{part}` is not a node count")
        n = int(part)
        if n == 0:
            raise SystemExit(f"job_start.py: --nodes {text}: 0: a job has at least 1 node")
        if cluster is not None and n > cluster:
            raise SystemExit(
                f"job_start.py: --nodes {text}: {n} is more than the cluster's {cluster} nodes "
                f"(SLURM_LOCAL_NODES={cluster})"
            )
        if n > MAX_LOCAL_NODES:
            raise SystemExit(
                f"job_start.py: --nodes {text}: {n} is more than the local Slurm emulates "
                f"(at most {MAX_LOCAL_NODES} nodes, scripts/slurm-local.sh)"
            )
        out.append(n)
    return sorted(set(out))


def cluster_nodes() -> int | None:
    v = os.environ.get("SLURM_LOCAL_NODES", "")
    if not v:
        return None
    if not v.isdigit() or int(v) == 0:
        raise SystemExit(f"job_start.py: SLURM_LOCAL_NODES={v}: a cluster has at least 1 node")
    return int(v)


def port_base(n: int) -> int:
    """A port P with P .. P+n free on loopback (slurmctld and n slurmd)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n > 65000:
            continue
        free = True
        for p in range(base, base + n + 1):
            with socket.socket() as t:
                try:
                    t.bind(("0.0.0.0", p))
                except OSError:
                    free = False
                    break
        if free:
            return base
    raise SystemExit(f"job_start.py: no {n + 1} consecutive free ports")


class Cluster:
    """The local Slurm of `nodes` emulated nodes in `dir`, on free ports; stopped by `stop`."""

    def __init__(self, dir: Path, nodes: int) -> None:
        self.env = dict(
            os.environ,
            SLURM_LOCAL_DIR=str(dir),
            SLURM_LOCAL_PORT=str(port_base(nodes)),
            SLURM_LOCAL_NODES=str(nodes),
        )
        r = subprocess.run(
            [str(SLURM_LOCAL), "start"], env=self.env, capture_output=True, text=True, timeout=600
        )
        if r.returncode != 0:
            raise SystemExit(f"job_start.py: slurm-local.sh start failed:\n{r.stderr}")
        m = re.search(r"export SLURM_CONF=(\S+)", r.stdout)
        assert m, r.stdout
        self.env["SLURM_CONF"] = m.group(1)
        self.nodes = nodes

    def stop(self) -> None:
        subprocess.run([str(SLURM_LOCAL), "stop"], env=self.env, capture_output=True, timeout=180)

    def in_queue(self, job: str) -> bool:
        r = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%T"], env=self.env, capture_output=True, text=True
        )
        return bool(r.stdout.strip())

    def state(self, job: str) -> str:
        r = subprocess.run(
            ["scontrol", "show", "job", "-o", job], env=self.env, capture_output=True, text=True
        )
        m = re.search(r"JobState=(\S+)", r.stdout)
        return m.group(1) if m else "?"


class TierCount(threading.Thread):
    """Samples the proxy's count of bytes delivered, so that the bytes by any moment of a job
    can be read back (interpolated between samples 50 ms apart). The proxy writes its count at
    most every 50 ms, so a sample holds the count of 25 ms before it was read, on average: it is
    dated so."""

    LAG = 0.025

    def __init__(self, tier: peers.Tier) -> None:
        super().__init__(daemon=True)
        self.tier, self.samples, self.halt = tier, [], threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            self.samples.append((time.time() - self.LAG, self.tier.down()))
            self.halt.wait(0.05)

    def stop(self) -> None:
        self.halt.set()
        self.join()

    def at(self, t: float) -> float:
        s = self.samples
        for (t0, b0), (t1, b1) in zip(s, s[1:], strict=False):
            if t0 <= t <= t1:
                return b0 + (b1 - b0) * (t - t0) / max(t1 - t0, 1e-9)
        return float(s[-1][1] if s and t > s[-1][0] else s[0][1] if s else 0)


def first_staging(cache: Path) -> tuple[float, float, int]:
    """A node's first mini-epoch: (when its staging started, when the view was up: the `start`
    event, its bytes), from the daemon's event log and its log line `mini-epoch staged`."""
    start = None
    for line in (cache / "run" / "events.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e.get("event") == "start":
            start = e
            break
    if start is None:
        raise RuntimeError(f"no start event in {cache}/run/events.jsonl")
    secs = None
    for line in (cache / "metfs.log").read_text(errors="replace").splitlines():
        if "mini-epoch staged" in line:
            m = re.search(r"secs=([0-9.e+-]+)", line)
            if m:
                secs = float(m.group(1))
                break
    if secs is None:
        raise RuntimeError(f"no `mini-epoch staged` line in {cache}/metfs.log")
    # The view is up just after the staging ends: the event's time is the end of staging (to
    # within the daemon's set-up of the view, milliseconds).
    return start["t"] - secs, start["t"], int(start["view_bytes"])


def mounts_under(top: Path) -> list[Path]:
    prefix = str(top) + "/"
    with open("/proc/self/mounts") as f:
        points = [line.split()[1].replace("\\040", " ") for line in f]
    return [Path(p) for p in points if p.startswith(prefix)]


def one_job(
    cfg: Config,
    cluster: Cluster,
    tier: peers.Tier,
    count: TierCount,
    env: dict[str, str],
    work: Path,
    n: int,
    pacing: str,
    tag: str,
) -> dict:
    d = work / tag
    logs = d / "logs"
    logs.mkdir(parents=True)
    for i in range(1, n + 1):
        (d / f"n{i}").mkdir()
    args = (
        f"--mini-epochs {cfg.mini_epochs(n)} --rf 4 --compose random --seed 0 "
        f"--endpoint {tier.endpoint} --region garage --allow-http {PACINGS[pacing]}"
    ).strip()
    job_env = {
        **env,
        "METFS_CACHE_ROOT": str(d / "%n" / "cache-%j"),
        "METFS_MOUNTPOINT": str(d / "%n" / "mnt-%j"),
        "METFS_ARGS": args,
        "TRAIN_ARGS": str(logs),
    }
    out = d / "job.out"
    t_submit = time.time()
    r = subprocess.run(
        [
            "sbatch",
            "--parsable",
            f"--nodes={n}",
            f"--output={out}",
            "--time=10",
            str(DEPLOY / "train-pytorch.sbatch"),
        ],
        env={**cluster.env, **job_env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    if r.returncode != 0:
        raise RuntimeError(f"sbatch --nodes={n}: {r.stderr}")
    job = r.stdout.strip().split(";")[0]
    end = time.monotonic() + 600
    while cluster.in_queue(job):
        if time.monotonic() > end:
            subprocess.run(["scancel", job], env=cluster.env, capture_output=True)
            raise RuntimeError(f"job {job} ({tag}) still running after 600 s")
        time.sleep(0.2)
    state = cluster.state(job)
    text = out.read_text(errors="replace") if out.exists() else ""
    left = mounts_under(d)
    for m in left:
        benchlib.umount(m)
    if state != "COMPLETED":
        raise RuntimeError(f"job {job} ({tag}): {state}\n{text[-3000:]}")
    if left:
        raise RuntimeError(f"job {job} ({tag}) left mounts behind: {left}")
    nodes = [first_staging(d / f"n{i}" / f"cache-{job}") for i in range(1, n + 1)]
    ranks = [json.loads(p.read_text()) for p in sorted(logs.glob("rank*.json"))]
    if len(ranks) != n:
        raise RuntimeError(f"job {job} ({tag}): {len(ranks)} of {n} ranks started training")
    first = min(s for s, _, _ in nodes)
    last = max(e for _, e, _ in nodes)
    res = {
        "nodes": n,
        "pacing": pacing,
        "job": job,
        # sbatch to every node's first mini-epoch
        "start_s": last - t_submit,
        # sbatch to the first node's first byte of staging: submission, catalog step, node
        # check, mount set-up
        "fixed_s": first - t_submit,
        # the nodes' staging starts, first to last
        "spread_s": max(s for s, _, _ in nodes) - first,
        # first node's staging start to the last node's first mini-epoch
        "staging_s": last - first,
        "slowest_node_s": max(e - s for s, e, _ in nodes),
        "m_bytes": min(b for _, _, b in nodes),
        "tier_bytes": count.at(last) - count.at(t_submit),
        "train_s": min(r["t"] for r in ranks) - t_submit,
    }
    shutil.rmtree(d, ignore_errors=True)
    return res


def predict(cfg: Config, n: int, m: int, fixed: float, spread_s: float, pacing: str) -> float:
    """docs/MODEL.md, "The first mini-epoch of N nodes": with staging starts spread over S
    seconds after a fixed wait F, every node gets its fair share B / N of the tier once all have
    started. With the default pacing a node that is done takes its share on for its next
    mini-epoch, so the last to start is done N x M / B after its start: F + S + N x M / B. With
    `auto` a node that is done draws only its trickle, so the tier's B serves the first
    mini-epochs: F + max(N x M / B, S + M / B). The trickle (at most (N - 1) x 256 KiB/s, from
    the nodes done before the last) is left out: the tier bytes column shows what it took."""
    b = cfg.cap
    if pacing == "default":
        return fixed + spread_s + n * m / b
    return fixed + max(n * m / b, spread_s + m / b)


def spread(xs: list[float]) -> str:
    return f"{benchlib.med(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def table(cfg: Config, rows: list[dict]) -> str:
    lines = [
        "| nodes | pacing | runs | every node's first mini-epoch, s | training starts, s | "
        "before staging (F), s | staging starts spread (S), s | staging, s | "
        "tier MiB by then (N x M) | model, s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n in cfg.nodes:
        for p in PACINGS:
            rs = [r for r in rows if r["nodes"] == n and r["pacing"] == p]
            if not rs:
                continue
            m = rs[0]["m_bytes"]
            f, s = (benchlib.med([r[k] for r in rs]) for k in ("fixed_s", "spread_s"))
            cells = [spread([r[k] for r in rs]) for k in ("start_s", "train_s", "fixed_s")]
            cells += [spread([r[k] for r in rs]) for k in ("spread_s", "staging_s")]
            lines.append(
                f"| {n} | {p} | {len(rs)} | "
                + " | ".join(cells)
                + f" | {benchlib.med([r['tier_bytes'] for r in rs]) / MIB:.1f} "
                f"({n * m / MIB:.1f}) | {predict(cfg, n, m, f, s, p):.2f} |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="1,2,4,8", help="node counts, comma-separated")
    ap.add_argument("--runs", type=int, default=5, help="jobs per point and pacing")
    ap.add_argument("--files", type=int, default=1024)
    ap.add_argument("--kib", type=int, default=256, help="size of each file")
    ap.add_argument("--slot-mib", type=float, default=8, help="M, every node's mini-epoch")
    ap.add_argument("--cap-mib", type=float, default=8, help="the tier's cap, MiB/s, all nodes")
    ap.add_argument("--quick", action="store_true", help="1 and 2 nodes, tiny data, 1 run")
    ap.add_argument(
        "--allow-slow-tier",
        action="store_true",
        help="go on where the machine delivers less than 90 %% of the cap",
    )
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--json", type=Path, help="write the runs to this file")
    ap.add_argument(
        "--from-json", type=Path, help="print the tables of a run's --json file; run nothing"
    )
    a = ap.parse_args()
    if a.from_json:
        saved = json.loads(a.from_json.read_text())
        report(Config(**saved["config"]), saved["runs"], saved.get("header", []))
        return
    if a.quick:
        a.nodes = "1,2" if a.nodes == "1,2,4,8" else a.nodes
        a.runs, a.files, a.kib, a.slot_mib, a.cap_mib = 1, 64, 32, 0.5, 4
    nodes = parse_nodes(a.nodes, cluster_nodes())
    if a.runs < 1:
        raise SystemExit(f"job_start.py: --runs {a.runs}: at least 1")
    cfg = Config(nodes, a.runs, a.files, a.kib, a.slot_mib, a.cap_mib)
    for n in nodes:
        nm = cfg.mini_epochs(n)
        if nm < 2 or nm * n * cfg.m_bytes != cfg.files * cfg.size:
            raise SystemExit(
                f"job_start.py: {cfg.files} files of {cfg.kib} KiB do not split into mini-epochs "
                f"of {cfg.slot_mib} MiB, at least 2 per node, at {n} nodes: choose --files as "
                f"a multiple of 2 x {max(nodes)} x --slot-mib / --kib"
            )
    if os.geteuid() != 0:
        raise SystemExit("job_start.py: needs root (slurmd runs jobs as their users; FUSE)")
    benchlib.build()
    metfs = benchlib.metfs_bin()
    size = cluster_nodes() or max(nodes)

    base = Path(os.environ.get("METFS_BENCH_DIR", "/tmp/metfs-bench"))
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="job_start-", dir=base))
    tier = cluster = count = None
    rows: list[dict] = []
    try:
        tier = peers.Tier(work, cfg.cap)
        ds = peers.Dataset("js", cfg.files, cfg.size)
        ds.upload(tier, 0, work, with_mds=False)
        cap_line = ""
        if not a.quick:
            # Where the machine cannot deliver the cap, the tier is slower than B, and every
            # point measures the machine instead.
            held = peers.tier_holds(tier, f"{ds.name}/files", ds.keys, cfg.size)
            cap_line = (
                f"tier check: Garage behind proxy.py delivered {held * cfg.cap_mib:.1f} MiB/s "
                f"of the {cfg.cap_mib:g} MiB/s cap ({100 * held:.0f} %) to GETs in flight"
            )
            log(cap_line)
            if held < 0.9 and not a.allow_slow_tier:
                raise SystemExit(
                    f"job_start.py: {cap_line}: this machine cannot hold the cap now; lower "
                    f"--cap-mib (and --slot-mib), free the machine, or pass --allow-slow-tier"
                )
        cluster = Cluster(work / "slurm", size)
        count = TierCount(tier)
        count.start()
        env = {
            **{k: v for k, v in tier.env.items() if k.startswith("AWS_")},
            "METFS_BIN": str(metfs),
            "METFS_SOURCE": f"s3://{tier.bucket}/{ds.name}/files",
            "METFS_BUDGET": cfg.budget(),
            "METFS_CATALOG": str(work / "catalog.bin"),
            "METFS_MOUNT_TIMEOUT": "300",
            "METFS_DEPLOY": str(DEPLOY),
            "PYTHON": sys.executable,
            "PYTHONPATH": os.pathsep.join(
                [str(ROOT / "bindings" / "python" / "src"), os.environ.get("PYTHONPATH", "")]
            ).rstrip(os.pathsep),
            "TRAIN": str(work / "first_pass.py"),
        }
        (work / "first_pass.py").write_text(FIRST_PASS)
        log("an untimed job makes the catalog and warms the binaries")
        one_job(cfg, cluster, tier, count, env, work, nodes[0], "default", "warm-up")
        for rep in range(cfg.runs):
            for n in nodes:
                order = list(PACINGS) if (rep + n) % 2 == 0 else list(PACINGS)[::-1]
                for p in order:
                    r = one_job(cfg, cluster, tier, count, env, work, n, p, f"n{n}-{p}-{rep}")
                    rows.append(r)
                    log(
                        f"{n} nodes, {p}: {r['start_s']:.2f} s (before staging {r['fixed_s']:.2f}, "
                        f"spread {r['spread_s']:.2f}, staging {r['staging_s']:.2f}), tier "
                        f"{r['tier_bytes'] / MIB:.1f} MiB"
                    )
    finally:
        if count is not None:
            count.stop()
        if cluster is not None:
            cluster.stop()
        for m in mounts_under(work):
            benchlib.umount(m)
        if tier is not None:
            tier.stop()
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)

    header = [
        f"job start: {cfg.files} files of {cfg.kib} KiB ({cfg.files * cfg.size / MIB:.0f} MiB) "
        f"on Garage behind one token bucket of {cfg.cap_mib:g} MiB/s for all nodes; every "
        f"node's mini-epoch M = {cfg.slot_mib:g} MiB (nm per node: "
        + ", ".join(f"{n} nodes {cfg.mini_epochs(n)}" for n in nodes)
        + f"), budget {cfg.budget()} per node; deploy/slurm/train-pytorch.sbatch, node check on, "
        f"catalog kept; {cfg.runs} runs per point; local Slurm of {size} nodes on one machine "
        f"of {os.cpu_count()} cores (one disk); metfs {metfs}; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    ]
    if cap_line:
        header.append(cap_line)
    report(cfg, rows, header)
    if a.json:
        a.json.write_text(
            json.dumps({"config": cfg.__dict__, "header": header, "runs": rows}, indent=1)
        )


def report(cfg: Config, rows: list[dict], header: list[str]) -> None:
    for line in header:
        print(f"# {line}")
    print(table(cfg, rows))
    print(
        "model (docs/MODEL.md), from the point's median F and S and the cap B: default "
        "F + S + N x M / B; auto F + max(N x M / B, S + M / B)"
    )


if __name__ == "__main__":
    main()
