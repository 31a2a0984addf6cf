"""The coordination planes of a many-node job, simulated on one machine: the dynamic-sharding
queue at 8 to 1,024 nodes against a real etcd, and the decision broadcast of the Python
coordinator at 64 ranks over torch.distributed (gloo).

**The queue.** For each worker count N, a fresh etcd (Debian's etcd-server, started as the tests
start it and waited for by its own health answer) and `metfs-dds/examples/dds_nodes/`: N tokio
tasks, each a node's daemon reduced to its queue feed, running the daemon's own `Worker` (join
under a lease renewed in the background, the watch that requeues dead nodes' shards, claim,
done) with the daemon's pauses. Each node claims a slot (4 shards), claims its successor while
a pass runs, marks DONE after the first pass, and makes `--rf` passes per view; the queue holds
3 slots per node and epoch, 2 epochs. 1 % of the nodes (at least one: 1 of 8 and 1 of 64, 3 of
256, 10 of 1,024) die at random moments of the first epoch, each a node that holds a batch
then: its task is aborted, which stops its lease renewal without revoking anything, as a
`kill -9` does.

Pass times (`--pass-ms`, default 10 s ± 25 %, rf 1): a pass reads one slot, half a node's
budget. For a 1,024-node job to keep every node busy the dataset must hold several slots per
node (here 3 per epoch); with a 20 GiB budget a slot is 10 GiB, ~95,000 ImageNet-sized JPEGs,
which a node trains on in ~40 s (ResNet-50 on Summit's 6 V100s, ~2,400 images/s) to ~10 s (8
A100s, ~10,000 images/s). 10 s with rf 1 (a claim and a done per pass, the most a node makes)
is the fast end of that range, so etcd's load here is the most a real job of N nodes gives it.
The lease is the daemon's default (`--dds-lease-ttl-secs` 10).

Reported per N: etcd's requests/s (gRPC messages it received: transactions, reads,
keep-alives) and watch messages sent/s, etcd's CPU (from /proc of its pid) and the simulator's,
claim latency p50/p99 (each claim that gave a batch, retries after conflicts inside it), etcd
transactions per claim, the time from each kill to the last of its shards back in TODO, and
the invariant: every shard of every epoch DONE exactly once (its done key written once and
reported done to one node), nothing left TODO or DOING, every sample in exactly one DONE shard
per epoch. A violation prints CHECK FAILED and fails the run. A job whose epochs are not done
after `--max-run-s` (300 s) is stopped: its figures are those of the time it ran, claims still
unanswered then are counted apart, and the invariant checked is the part that holds mid-epoch
(no shard DONE twice, no sample in two DONE shards). Goal lines at the largest N: claim p99 <=
50 ms, requeue within the lease TTL + 2 s.

**The decision broadcast.** `--ranks` (64) ranks of a gloo job on this machine, each with its
own fake daemon (bindings/python/tests/fake_daemon.py, rf 1: every pass ends in `advance`),
each calling `TorchDistributedCoordinator.pass_end`. Measured from the moment rank 0 has its
daemon's decision and starts the broadcast until each other rank has it (broadcast), and until
the last rank returns from `pass_end` with the view applied and the check of every rank's
apply done (every rank applied); the first pass end warms up and is not counted. The ranks are
forked from this process after it imported torch, so that they share its ~300 MB of torch's
pages (64 separately started interpreters would need ~19 GB).

usage: python3 benches/nodes.py [--workers 8,64,256,1024] [--ranks 64] [--pass-ms 10000]
       python3 benches/nodes.py --quick   # 8 and 32 workers, 1 s passes, 2 s lease; 8 ranks

`METFS_BIN` picks the build whose `examples/dds_nodes` runs; else the release build.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchlib
from benchlib import ROOT, med

from conftest import Etcd, free_ports  # noqa: E402  (tests/, put on sys.path by benchlib)

PY_TESTS = ROOT / "bindings" / "python" / "tests"

CLAIM_P99_GOAL_MS = 50.0
REQUEUE_SLACK_S = 2.0


def counts(text: str, noun: str, unit: str) -> list[int]:
    """A comma-separated list of positive counts; 0 or less is refused (argparse names the
    setting: `argument --workers: a worker count of 0: ...`)."""
    try:
        xs = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of {noun} counts") from None
    if not xs:
        raise argparse.ArgumentTypeError(f"no {noun} count given")
    for x in xs:
        if x <= 0:
            raise argparse.ArgumentTypeError(f"a {noun} count of {x}: a job has at least 1 {unit}")
    return xs


# -- the queue ----------------------------------------------------------------------------------


def run_queue(exe: Path, work: Path, n: int, stripes: int, a: argparse.Namespace) -> dict[str, Any]:
    """One simulated job of `n` nodes on a queue of `stripes` stripes (0: the default a mount
    makes) against a fresh etcd; the simulator's JSON."""
    # A directory of its own per run: a layout may be given twice (repeated runs).
    d = Path(tempfile.mkdtemp(prefix=f"etcd-{n}-{stripes}-", dir=work))
    # Extensive metrics: etcd's own time per transaction, printed beside the nodes' (a tail
    # etcd does not see is the machine's, not the store's).
    etcd = Etcd(d, *free_ports(2), metrics="extensive")
    etcd.start()
    assert etcd.proc is not None
    try:
        cmd = [
            str(exe),
            "--url",
            etcd.url(f"nodes{n}"),
            "--workers",
            str(n),
            "--epochs",
            str(a.epochs),
            "--pass-ms",
            str(a.pass_ms),
            "--rf",
            str(a.rf),
            "--lease-secs",
            str(a.lease_secs),
            "--etcd-pid",
            str(etcd.proc.pid),
            "--max-run-s",
            str(a.max_run_s),
            "--stripes",
            str(stripes),
        ]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
    finally:
        etcd.kill()
    if r.returncode not in (0, 1) or not r.stdout.strip():
        raise SystemExit(f"dds_nodes at {n} workers exited {r.returncode}:\n{r.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def requeue_worst(r: dict[str, Any]) -> float | None:
    times = [k["requeue_s"] for k in r["kills"] if k["requeue_s"] is not None]
    return max(times) if times else None


def queue_table(rows: list[dict[str, Any]]) -> None:
    print(
        "| workers | stripes | killed | shards/epoch | run s | etcd req/s | watch msgs/s | etcd CPU (cores) "
        "| simulator CPU (cores) | join p50 s | claim p50 ms | claim p99 ms "
        "| claim p99 ms: first / while a pass runs | etcd txns per claim "
        "| kill to requeue s (worst) | every shard done exactly once |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        e = r["etcd"]
        claims = r["claim_ms"]["n"]
        txns = e["by_method"].get("Txn", 0)
        worst = requeue_worst(r)
        kills = len(r["kills"])
        measured = sum(1 for k in r["kills"] if k["requeue_s"] is not None)
        requeue = "n/a" if worst is None else f"{worst:.2f} ({measured} of {kills} kills)"
        join = f"{r['join_ms']['p50'] / 1000:.2f}"
        if r["never_joined"]:
            join += f" ({r['workers'] - r['never_joined']} of {r['workers']} joined)"
        inv = r["invariant"]
        total = r["epochs"] * r["shards_per_epoch"]
        if not inv["ok"]:
            once = "NO: " + "; ".join(inv["problems"])
        elif r["finished"]:
            once = f"yes ({r['epochs']} x {r['shards_per_epoch']})"
        else:
            once = (
                f"none twice; stopped at {r['max_run_s']} s with {r['done_shards']} of {total} done"
            )
        print(
            f"| {r['workers']} | {r['stripes']} | {kills} | {r['shards_per_epoch']} | {r['run_s']:.1f} "
            f"| {e['requests_per_s']:.0f} | {e['watch_msgs_per_s']:.0f} | {e['cpu_cores']:.2f} "
            f"| {r['sim_cpu_cores']:.2f} | {join} | {r['claim_ms']['p50']:.1f} | {r['claim_ms']['p99']:.1f} "
            f"| {phase_p99(r)} | {txns / max(claims, 1):.1f} "
            f"| {requeue} | {once} |"
        )


def phase_p99(r: dict[str, Any]) -> str:
    """Claim p99 of the nodes' first claims (all at the job's start, before any mount is live)
    and of the rest (a successor claimed while a pass runs), as `first / running`."""
    first, running = r.get("first_claim_ms"), r.get("running_claim_ms")
    if not first or not running:
        return "n/a"
    return f"{first['p99']:.1f} / {running['p99']:.1f}"


def goal_lines(rows: list[dict[str, Any]]) -> None:
    """The goals at the largest worker count, on the last queue layout run there (the default
    stripes unless told otherwise), with the one-cursor queue beside it where it ran."""
    r = rows[-1]
    n = r["workers"]
    p99 = r["claim_ms"]["p99"]
    one = [x for x in rows if x["workers"] == n and x["stripes"] == 1 and x is not r]
    if one:
        base = one[0]["claim_ms"]["p99"]
        print(
            f"at {n} workers, claim p99 with {r['stripes']} stripes {p99:.1f} ms against "
            f"{base:.1f} ms with one cursor per epoch: {p99 / max(base, 1e-9):.3f}x"
        )
    waiting = r["claims_waiting_at_stop"]
    # Claims still unanswered when a job was stopped are not in the percentiles: say so.
    more = (
        f" (at least: {waiting['n']} claims were still waiting at the stop, "
        f"the oldest for {waiting['max'] / 1000:.0f} s)"
        if waiting["n"]
        else ""
    )
    server = r["etcd"].get("server") or {}
    txn, fsync = server.get("grpc_server_handling"), server.get("etcd_disk_wal_fsync")
    if txn:
        print(
            f"at {n} workers, etcd's own handling of a transaction (its gRPC server's histogram, "
            f"over {txn['n']:.0f}): p50 <= {txn['p50_le_ms']:g} ms, p99 <= {txn['p99_le_ms']:g} ms"
            + (f"; its WAL fsync p99 <= {fsync['p99_le_ms']:g} ms" if fsync else "")
            + f"; the nodes' claim p99 {p99:.1f} ms (a claim is one or two transactions, more "
            "after a lost race)"
        )
    if r.get("running_claim_ms"):
        f, g = r["first_claim_ms"], r["running_claim_ms"]
        print(
            f"at {n} workers, claim p99 of the nodes' first claims (all at the job's start) "
            f"{f['p99']:.1f} ms over {f['n']}, of the claims made while a pass runs "
            f"{g['p99']:.1f} ms over {g['n']} (p50 {g['p50']:.1f} ms); the goal is judged on all"
        )
    if p99 <= CLAIM_P99_GOAL_MS and not waiting["n"]:
        print(f"goal at {n} workers: claim p99 <= {CLAIM_P99_GOAL_MS:.0f} ms: {p99:.1f} ms, met")
    else:
        print(
            f"goal at {n} workers: claim p99 <= {CLAIM_P99_GOAL_MS:.0f} ms: {p99:.1f} ms, "
            f"missed by {p99 - CLAIM_P99_GOAL_MS:.1f} ms ({p99 / CLAIM_P99_GOAL_MS:.1f}x the goal)"
            + more
        )
    bound = r["lease_secs"] + REQUEUE_SLACK_S
    worst = requeue_worst(r)
    if worst is None:
        why = "no node held a batch at the kill moments" if not r["kills"] else "none requeued"
        measured = [x for x in rows if requeue_worst(x) is not None]
        last = (
            f"; at {measured[-1]['workers']} workers, worst {requeue_worst(measured[-1]):.2f} s"
            if measured
            else ""
        )
        print(f"goal at {n} workers: requeue within {bound:.0f} s: n/a ({why}){last}")
    elif worst <= bound:
        print(
            f"goal at {n} workers: requeue within lease {r['lease_secs']} s + "
            f"{REQUEUE_SLACK_S:.0f} s = {bound:.0f} s: worst {worst:.2f} s, met"
        )
    else:
        print(
            f"goal at {n} workers: requeue within lease {r['lease_secs']} s + "
            f"{REQUEUE_SLACK_S:.0f} s = {bound:.0f} s: worst {worst:.2f} s, "
            f"missed by {worst - bound:.2f} s"
        )


# -- the decision broadcast ----------------------------------------------------------------------


def rank_main(rank: int, world: int, port: int, work: str, passes: int) -> None:
    """One rank (a forked child): its own fake daemon, the coordinator, `passes` pass ends.
    Writes `work/rank{rank}.json`: per pass end, when the broadcast started and ended and when
    `pass_end` returned (time.monotonic, one clock for every process of this machine)."""
    from datetime import timedelta

    import torch.distributed as dist
    from fake_daemon import FakeDaemon

    import metfs
    from metfs.coordinator import TorchDistributedCoordinator

    fake = FakeDaemon(os.path.join(work, f"r{rank}.sock"), rf=1, mini_epochs=4)
    marks: list[dict[str, Any]] = []
    report: dict[str, Any] = {"rank": rank, "marks": marks, "error": None}
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=600),
        )
        client = metfs.Client(fake.path, job="nodes")
        coord = TorchDistributedCoordinator()
        broadcast = coord._broadcast
        cur: dict[str, Any] = {}

        def timed_broadcast(obj: dict[str, Any] | None) -> dict[str, Any]:
            # On rank 0 the decision is known here; on the others it arrives at the return.
            cur["bc0"] = time.monotonic()
            box = broadcast(obj)
            cur["bc1"] = time.monotonic()
            return box

        coord._broadcast = timed_broadcast  # type: ignore[method-assign]
        coord.start(client)
        for _ in range(passes):
            d = coord.pass_end(client, {"loss": 1.0}, block=False)
            marks.append(
                dict(cur, end=time.monotonic(), decision=d.decision, position=list(d.position))
            )
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001 - the parent reports every rank's failure
        report["error"] = f"{type(e).__name__}: {e}"
    finally:
        fake.close()
    with open(os.path.join(work, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    os._exit(0)


def run_broadcast(ranks: int, passes: int, work: Path) -> dict[str, Any]:
    import torch.distributed  # noqa: F401  (imported once here, shared by the forked ranks)

    work.mkdir()
    port = free_ports(1)[0]
    ctx = multiprocessing.get_context("fork")
    procs = [
        ctx.Process(target=rank_main, args=(r, ranks, port, str(work), passes))
        for r in range(ranks)
    ]
    t = time.monotonic()
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=max(60.0, 900 - (time.monotonic() - t)))
        if p.is_alive():
            for q in procs:
                q.kill()
            raise SystemExit(f"a rank of the {ranks}-rank broadcast hung")
    reports = []
    for r in range(ranks):
        f = work / f"rank{r}.json"
        if not f.exists():
            raise SystemExit(f"rank {r} of {ranks} wrote no report (exit {procs[r].exitcode})")
        reports.append(json.loads(f.read_text()))
    errors = [f"rank {r['rank']}: {r['error']}" for r in reports if r["error"]]
    if errors:
        raise SystemExit("the broadcast failed: " + "; ".join(errors[:5]))
    problems = []
    bcast: list[float] = []
    applied: list[float] = []
    for i in range(1, passes):  # pass end 0 warms the connections up
        leader = reports[0]["marks"][i]
        sent = leader["bc0"]
        decisions = {(r["marks"][i]["decision"], tuple(r["marks"][i]["position"])) for r in reports}
        if len(decisions) != 1 or leader["decision"] != "advance":
            problems.append(f"pass end {i}: ranks disagree or did not advance: {sorted(decisions)}")
        bcast += [(r["marks"][i]["bc1"] - sent) * 1000 for r in reports[1:]]
        applied.append((max(r["marks"][i]["end"] for r in reports) - sent) * 1000)
    bcast.sort()
    applied.sort()
    return {
        "ranks": ranks,
        "advances": passes - 1,
        "bcast_p50": med(bcast),
        "bcast_p99": pct(bcast, 99),
        "applied_p50": med(applied),
        "applied_p99": pct(applied, 99),
        "problems": problems,
        "wall_s": time.monotonic() - t,
    }


def pct(sorted_xs: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    i = max(1, -(-len(sorted_xs) * p // 100))
    return sorted_xs[int(i) - 1]


# -- main ------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--workers",
        type=lambda s: counts(s, "worker", "node"),
        default=[8, 64, 256, 1024],
        help="simulated node counts, comma-separated",
    )
    ap.add_argument(
        "--ranks",
        type=lambda s: counts(s, "rank", "rank"),
        default=[64],
        help="ranks of the broadcast",
    )
    ap.add_argument(
        "--stripes",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 0],
        help="queue layouts to run at each worker count: stripes of the never-claimed shards, "
        "1 for one cursor per epoch (the queue before stripes), 0 for the default a mount makes",
    )
    ap.add_argument("--pass-ms", type=int, default=10_000, help="a pass, ± 25 %%")
    ap.add_argument("--rf", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lease-secs", type=int, default=10)
    ap.add_argument("--advances", type=int, default=30, help="pass ends of the broadcast")
    ap.add_argument(
        "--max-run-s",
        type=int,
        default=300,
        help="stop a job whose epochs are not done after this many seconds (0: never)",
    )
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per worker count")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="8 and 32 workers, 1 and 16 stripes, 1 s passes, 2 s lease; 8 ranks",
    )
    a = ap.parse_args()
    if a.quick:
        a.workers, a.ranks, a.pass_ms, a.lease_secs, a.advances = [8, 32], [8], 1000, 2, 6
        # A queue that small has one stripe by default: 16 exercises the striped claims too
        # (more stripes than a node reads at first).
        a.stripes = [1, 16]
    for name in ("pass_ms", "rf", "epochs", "advances"):
        if getattr(a, name) <= 0:
            ap.error(f"--{name.replace('_', '-')}: {getattr(a, name)}: must be at least 1")
    if a.lease_secs < 2:
        ap.error(f"--lease-secs: {a.lease_secs}: etcd's shortest lease is 2 s")
    benchlib.build(package="metfs-dds", bins=(), examples=["dds_nodes"])
    exe = benchlib.example_bin("dds_nodes")
    print(
        f"# many nodes on one machine: {os.cpu_count()} cores, "
        f"{datetime.date.today().isoformat()}; pass {a.pass_ms} ms ± 25 %, rf {a.rf}, "
        f"lease {a.lease_secs} s, {a.epochs} epochs of 3 slots (12 shards) per node, "
        f"1 % of the nodes killed (at least 1)"
    )
    failed = False
    with tempfile.TemporaryDirectory(prefix="nodes-") as t:
        work = Path(t)
        rows = []
        for n in a.workers:
            for stripes in a.stripes:
                r = run_queue(exe, work, n, stripes, a)
                print(json.dumps(r), flush=True)
                if not r["invariant"]["ok"]:
                    problems = "; ".join(r["invariant"]["problems"])
                    print(f"CHECK FAILED: at {n} workers, {r['stripes']} stripes: {problems}")
                    failed = True
                rows.append(r)
        print()
        print("## the shard queue in etcd")
        print()
        queue_table(rows)
        print()
        goal_lines(rows)
        print()
        print("## the decision broadcast (torch.distributed, gloo)")
        print()
        print(
            "| ranks | advances | broadcast p50 ms | broadcast p99 ms "
            "| every rank applied p50 ms | every rank applied p99 ms |"
        )
        print("|---|---|---|---|---|---|")
        sys.path[:0] = [str(ROOT / "bindings" / "python" / "src"), str(PY_TESTS)]
        for ranks in a.ranks:
            b = run_broadcast(ranks, a.advances + 1, work / f"ranks{ranks}")
            print(
                f"| {b['ranks']} | {b['advances']} | {b['bcast_p50']:.1f} | {b['bcast_p99']:.1f} "
                f"| {b['applied_p50']:.1f} | {b['applied_p99']:.1f} |",
                flush=True,
            )
            for p in b["problems"]:
                print(f"CHECK FAILED: {ranks} ranks: {p}")
                failed = True
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
