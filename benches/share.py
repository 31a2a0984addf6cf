"""Several jobs on one node: one shared daemon (`metfs mount --share`) against k separate
mounts with the same total budget, side by side in one run (issue: several jobs, one store).

Each job is a separate Python process using the real client and `metfs.passes`: it reads every
file of every pass through its view (a fixed time per sample: `--step-ms`, doubled for the slow
job of the `slow` case) for `--epochs` MET epochs at a fixed rf of 2. The dataset is twice the
budget. Printed per case: the capacity-tier bytes of the epochs trained (`tier_bytes_read`
from `status` less what the event log's `staged` records fetched for later epochs: the views
a job stages ahead once it is done depend on when it stopped, not on sharing) of the shared daemon and of the separate mounts, each divided by what one job
alone reads, in two ways: on the shared daemon with that job only (same view size, and the
whole budget's spare room to keep retired slots in), and on a mount of its own with its 1/k of
the budget (the first of the separate mounts: "one job's" bytes of the issue, whose separate
mounts read "about 2x" that); and, for `slow`, the fast job's samples/s against running alone.

Cases (the goals of the issue in brackets):
* `same2`: 2 jobs, same dataset [shared <= 1.05x one job; separate about 2x];
* `same4`: 4 jobs, same dataset [<= 1.1x];
* `slow`: 2 jobs, one 2x slower, `--share-pace wait` [<= 1.1x; fast job >= 0.9x alone];
* `overlap`: 2 jobs with 75% overlap [<= 1.05 x |D1 u D2| / |D1| x one job];
* `stagger`: paper 004's staggered arrivals, 4 jobs over random 75% subsets each starting a
  quarter of an epoch after the one before, a budget with shares for 8 (half of it free for
  retired slots), `--share-evict refcnt` against `lru` on the same daemon [refcnt <= 0.9x the
  tier bytes of lru].

usage: python3 benches/share.py [--files 1000] [--kib 16] [--budget 8MiB] [--epochs 2]
       [--step-ms 1] [--runs 3] [--cases same2,same4,slow,overlap,stagger]
       python3 benches/share.py --quick   # 100 files of 64 KiB, 1 epoch, 1 run, the cases
                                          # same2, overlap and stagger (same4 and slow run
                                          # same2's code with more jobs or a slower one)

`METFS_BIN` picks the binary; else the release build.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchlib
from benchlib import Mount, med, parse_size

JOB = r"""
import json, sys, time, metfs
sock, job, out, epochs, step, extra = sys.argv[1:7]
step = float(step)
c = metfs.Client(sock, job=job or None, **json.loads(extra))
n, t0 = 0, time.monotonic()
for p in metfs.passes(c, epochs=int(epochs)):
    for path in p.paths:
        with open(path, "rb") as f:
            f.read()
        n += 1
        if step:
            time.sleep(step)
    p.report(loss=1.0)
secs = time.monotonic() - t0
# Let the staging of the view after the last one finish, so that every configuration counts
# exactly one view ahead per job (else the count depends on where a staging was cut off).
deadline = time.monotonic() + 20
st = c.status().raw
while not st["next_ready"] and time.monotonic() < deadline:
    time.sleep(0.05)
    st = c.status().raw
if job:
    c.leave()
json.dump({"samples": n, "secs": secs, "tier": st["tier_bytes_read"]}, open(out, "w"))
"""


def make_dataset(root: Path, files: int, kib: int) -> list[str]:
    rng = random.Random(3)
    rels = []
    for i in range(files):
        rel = f"c{i % 8}/s{i:05d}.bin"
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rng.randbytes(kib << 10))
        rels.append(rel)
    return rels


def run_jobs(
    sock: str, work: Path, jobs: list[tuple[str, float, dict[str, Any]]], epochs: int
) -> list[dict[str, Any]]:
    env = benchlib.python_env()
    procs = []
    t0 = time.monotonic()
    for i, (name, step, extra) in enumerate(jobs):
        out = work / f"out-{i}.json"
        s = sock if isinstance(sock, str) else sock[i]
        # A staggered arrival: the job starts `delay` seconds after the first.
        extra = dict(extra)
        time.sleep(max(0.0, extra.pop("delay", 0.0) - (time.monotonic() - t0)))
        procs.append(
            (
                subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        JOB,
                        s,
                        name,
                        str(out),
                        str(epochs),
                        str(step),
                        json.dumps(extra),
                    ],
                    env=env,
                    stderr=subprocess.PIPE,
                    text=True,
                ),
                out,
            )
        )
    res = []
    for p, out in procs:
        _, err = p.communicate(timeout=1800)
        if p.returncode != 0:
            raise SystemExit(f"a job failed: {err[-2000:]}")
        res.append(json.loads(out.read_text()))
    return res


def trained_tier_bytes(m: Mount, epochs: int) -> int:
    """The tier bytes of the `epochs` epochs trained: the daemon's `tier_bytes_read` less what it
    fetched for views of later epochs (staged ahead once a job is done, which depends on
    when it stopped, not on sharing), from the `staged` events of its event log."""
    ahead = 0
    events = m.cache / "run" / "events.jsonl"
    for line in events.read_text().splitlines():
        e = json.loads(line)
        if e.get("event") == "staged" and e["epoch"] >= epochs:
            ahead += e["bytes_fetched"]
    return int(m.status()["tier_bytes_read"]) - ahead


def shared_run(
    src: Path,
    work: Path,
    budget: str,
    k_share: int,
    jobs: list[tuple[str, float, dict[str, Any]]],
    epochs: int,
    args: tuple[str, ...] = (),
) -> tuple[int, list[dict[str, Any]]]:
    cache = work / "cache-shared"
    cache.mkdir()
    m = Mount(
        src,
        cache,
        work / "mnt-shared",
        metfs=benchlib.metfs_bin(),
        budget=budget,
        share=True,
        share_jobs=k_share,
        rf=2,
        rf_policy="fixed",
        history=work / "h.json",
        args=args,
    )
    m.mount()
    try:
        res = run_jobs(m.socket, work, jobs, epochs)
        return trained_tier_bytes(m, epochs), res
    finally:
        m.close()
        shutil.rmtree(cache, ignore_errors=True)


def separate_run(
    src: Path,
    work: Path,
    budget_bytes: int,
    jobs: list[tuple[str, float, dict[str, Any]]],
    epochs: int,
    manifests: list[Path | None],
) -> list[int]:
    mounts = []
    for i in range(len(jobs)):
        cache = work / f"cache-sep{i}"
        cache.mkdir()
        m = Mount(
            src,
            cache,
            work / f"mnt-sep{i}",
            metfs=benchlib.metfs_bin(),
            budget=budget_bytes // len(jobs),
            rf=2,
            rf_policy="fixed",
            history=work / f"h{i}.json",
            manifest=manifests[i],
        )
        m.mount()
        mounts.append(m)
    try:
        run_jobs([m.socket for m in mounts], work, [("", step, {}) for _, step, _ in jobs], epochs)  # type: ignore[arg-type]
        return [trained_tier_bytes(m, epochs) for m in mounts]
    finally:
        for i, m in enumerate(mounts):
            m.close()
            shutil.rmtree(work / f"cache-sep{i}", ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--kib", type=int, default=16)
    ap.add_argument("--budget", default="8MiB")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--step-ms", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cases", help="default: same2,same4,slow,overlap,stagger")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="100 files of 64 KiB, 1 epoch, 1 run, cases same2, overlap and stagger",
    )
    a = ap.parse_args()
    if a.quick:
        a.files, a.kib, a.epochs, a.runs = 100, 64, 1, 1
        a.cases = a.cases or "same2,overlap,stagger"
    a.cases = a.cases or "same2,same4,slow,overlap,stagger"
    benchlib.build()
    step = a.step_ms / 1000
    budget = parse_size(a.budget)
    with tempfile.TemporaryDirectory(prefix="metfs-share-") as t:
        tmp = Path(t)
        src = tmp / "src"
        rels = make_dataset(src, a.files, a.kib)
        n = len(rels)
        # D1 and D2 overlap in 75% of each: as subsets of the shared mount (lists of paths) and
        # as manifests of separate mounts (CSV with sizes).
        parts = (rels[: int(0.8 * n)], rels[int(0.2 * n) :])
        d1, d2 = tmp / "d1.txt", tmp / "d2.txt"
        c1, c2 = tmp / "d1.csv", tmp / "d2.csv"
        for lst, d, c in zip(parts, (d1, d2), (c1, c2), strict=True):
            d.write_text("\n".join(lst) + "\n")
            c.write_text("path,size\n" + "".join(f"{r},{a.kib << 10}\n" for r in lst))
        print(
            f"dataset {n} files of {a.kib} KiB ({n * a.kib / 1024:.1f} MiB), budget {a.budget}, {a.epochs} epochs at rf 2, {a.runs} runs, medians"
        )
        rows = []
        stagger: dict[str, list[int]] = {"refcnt": [], "lru": []}
        for case in a.cases.split(","):
            if case == "stagger":
                # Paper 004's staggered arrivals: 4 jobs over random 75% subsets, each starting a
                # quarter of an epoch after the one before; the budget has shares for 8, so half
                # of it can keep retired slots, let go in RefCnt's or LRU's order.
                step4 = 4 * step
                epoch_s = 0.75 * n * 2 * step4
                sjobs = [
                    (
                        f"s{i}",
                        step4,
                        {"subset": {"fraction": 0.75, "seed": i + 1}, "delay": i * epoch_s / 4},
                    )
                    for i in range(4)
                ]
                for r in range(a.runs):
                    for policy in ["refcnt", "lru"] if r % 2 == 0 else ["lru", "refcnt"]:
                        work = tmp / f"stagger-{policy}-{r}"
                        work.mkdir()
                        stagger[policy].append(
                            shared_run(
                                src, work, a.budget, 8, sjobs, a.epochs, ("--share-evict", policy)
                            )[0]
                        )
                        shutil.rmtree(work, ignore_errors=True)
                continue
            if case.startswith("same"):
                k = int(case[4:])
                jobs: list[tuple[str, float, dict[str, Any]]] = [
                    (f"j{i}", step, {}) for i in range(k)
                ]
                mans: list[Path | None] = [None] * k
                ideal = 1.0
            elif case == "slow":
                k = 2
                jobs = [("fast", step, {}), ("slow", 2 * step, {})]
                mans = [None, None]
                ideal = 1.0
            elif case == "overlap":
                k = 2
                jobs = [
                    ("d1", step, {"subset": {"manifest": str(d1)}}),
                    ("d2", step, {"subset": {"manifest": str(d2)}}),
                ]
                mans = [c1, c2]
                ideal = 1.0 / 0.8
            else:
                raise SystemExit(f"unknown case {case}")
            ratios_sh, ratios_sep, ratios_own, ratios_sep_own, speed = [], [], [], [], []
            for r in range(a.runs):
                work = tmp / f"{case}-{r}"
                work.mkdir()
                order = ["alone", "shared", "separate"]
                random.Random(r).shuffle(order)
                out: dict[str, Any] = {}
                for what in order:
                    if what == "alone":
                        out["alone"] = shared_run(src, work, a.budget, k, [jobs[0]], a.epochs)
                    elif what == "shared":
                        out["shared"] = shared_run(src, work, a.budget, k, jobs, a.epochs)
                    else:
                        out["separate"] = separate_run(src, work, budget, jobs, a.epochs, mans)
                alone = out["alone"][0]
                ratios_sh.append(out["shared"][0] / alone)
                ratios_sep.append(sum(out["separate"]) / alone)
                own = out["separate"][0]
                ratios_own.append(out["shared"][0] / own)
                ratios_sep_own.append(sum(out["separate"]) / own)
                fast_alone = out["alone"][1][0]["samples"] / out["alone"][1][0]["secs"]
                fast_shared = out["shared"][1][0]["samples"] / out["shared"][1][0]["secs"]
                speed.append(fast_shared / fast_alone)
                shutil.rmtree(work, ignore_errors=True)
            rows.append(
                (
                    case,
                    med(ratios_own),
                    med(ratios_sep_own),
                    med(ratios_sh),
                    med(ratios_sep),
                    ideal,
                    med(speed),
                )
            )
        print()
        print(
            "| case | shared / one job on its own mount | separate / one job on its own mount | shared / one job alone on the shared daemon | separate / one job alone on the shared daemon | |D1 u D2| / |D1| | first job's samples/s, shared / alone |"
        )
        print("|---|---|---|---|---|---|---|")
        for case, own, sep_own, sh, sep, ideal, sp in rows:
            print(
                f"| {case} | {own:.3f} | {sep_own:.3f} | {sh:.3f} | {sep:.3f} | {ideal:.2f} | {sp:.2f} |"
            )
        if stagger["refcnt"]:
            rc, lru = med(stagger["refcnt"]), med(stagger["lru"])
            print()
            print(
                "| staggered arrivals, 4 jobs over 75% subsets | tier MiB, --share-evict refcnt | tier MiB, lru | refcnt / lru |"
            )
            print("|---|---|---|---|")
            print(
                f"| runs: {stagger['refcnt']} / {stagger['lru']} | {rc / 2**20:.2f} | {lru / 2**20:.2f} | {rc / lru:.3f} |"
            )


if __name__ == "__main__":
    main()
