"""Several jobs on one daemon (`metfs mount --share`): real mounts, each job a separate Python
process using the real client and `metfs.passes`, reading its own view at MNT/<job> and
checking every byte against the source."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from conftest import Mount, footprint, rpc, wait_for
from test_dds_mount import make_dataset

ROOT = Path(__file__).resolve().parent.parent

# One job: joins, trains `epochs` MET epochs with metfs.passes, reads every file of every pass
# through its directory and compares it with the source's digest, then leaves. With a stop file
# (METFS_JOB_STOP) it trains at least `epochs` epochs and goes on, whole epochs at a time, until
# the file exists: a test that needs its jobs running together (staggered joins, faults while
# they switch) cannot rely on how long an epoch takes, which is a few views of 50 ms here.
JOB = r"""
import hashlib, json, os, sys, metfs
sock, job, digests, out, epochs, extra = sys.argv[1:7]
digests = json.load(open(digests))
stop = os.environ.get("METFS_JOB_STOP")
c = metfs.Client(sock, job=job, **json.loads(extra))
res = {"views": [], "bad": [], "share": c.info.share, "passes": 0}
loop = metfs.passes(c, epochs=10**6 if stop else int(epochs))
epoch = None
for p in loop:
    if p.pass_in_mini_epoch == 0:
        if stop and p.epoch != epoch and p.epoch >= int(epochs) and os.path.exists(stop):
            break
        epoch = p.epoch
        res["views"].append([p.epoch, p.mini_epoch, list(p.files)])
    assert p.mountpoint == c.info.share["path"], (p.mountpoint, c.info.share)
    for path, rel in zip(p.paths, p.files):
        with open(path, "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() != digests[rel]:
                res["bad"].append(rel)
    res["passes"] += 1
    p.report(loss=1.0 / (1 + res["passes"]))
res["rf"] = loop.rf_per_mini_epoch()
res["status"] = c.status().raw
c.leave()
json.dump(res, open(out, "w"))
"""


def start_job(
    m: Mount,
    tmp: Path,
    name: str,
    digests: Path,
    epochs: int = 2,
    stop: Path | None = None,
    **extra: Any,
) -> subprocess.Popen[str]:
    """Starts one job (JOB); with `stop`, it trains until that file exists (at least `epochs`)."""
    out = tmp / f"job-{name}.json"
    out.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "bindings" / "python" / "src"))
    if stop is not None:
        env["METFS_JOB_STOP"] = str(stop)
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            JOB,
            m.socket,
            name,
            str(digests),
            str(out),
            str(epochs),
            json.dumps(extra),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(
    p: subprocess.Popen[str], tmp: Path, name: str, m: Mount, timeout: float = 240
) -> dict[str, Any]:
    try:
        _, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as e:
        p.kill()
        _, err = p.communicate()
        raise AssertionError(
            f"job {name} did not finish: {err[-3000:]}\nstatus: {m.status()}\nlog:\n{m.log()}"
        ) from e
    assert p.returncode == 0, f"job {name} failed: {err[-3000:]}\nlog:\n{m.log()}"
    return json.loads((tmp / f"job-{name}.json").read_text())


def check_epochs(
    res: dict[str, Any], dataset: set[str], epochs: int, at_least: bool = False
) -> None:
    """Every epoch's views partition the job's dataset: each sample exactly once. With
    `at_least` (a job run with a stop file), every epoch it trained, `epochs` or more."""
    assert not res["bad"], f"bytes differ from the source: {res['bad'][:5]}"
    if at_least:
        trained = 1 + max(e for e, _, _ in res["views"])
        assert trained >= epochs, f"{trained} epochs trained, fewer than {epochs}"
        epochs = trained
    by_epoch: dict[int, list[str]] = {}
    for epoch, _, files in res["views"]:
        by_epoch.setdefault(epoch, []).extend(files)
    for e in range(epochs):
        files = by_epoch.get(e, [])
        assert len(files) == len(set(files)), f"epoch {e}: a sample is in two views"
        assert set(files) == dataset, (
            f"epoch {e}: {len(set(files))} of {len(dataset)} samples, extra {sorted(set(files) - dataset)[:3]}"
        )


@pytest.fixture
def shared(mounts: Callable[..., Mount], tmp_path: Path) -> tuple[Mount, dict[str, str], Path]:
    src = tmp_path / "src"
    digests = make_dataset(src, 400)
    dpath = tmp_path / "digests.json"
    dpath.write_text(json.dumps(digests))
    return (
        mounts(
            src,
            "4MiB",
            "--share",
            "--share-jobs",
            "4",
            "--rf",
            "2",
            "--share-idle-secs",
            "4",
            name="s",
        ),
        digests,
        dpath,
    )


@pytest.mark.parametrize("k", [2, 4])
def test_jobs_read_their_own_datasets_once_per_epoch_through_one_daemon(
    shared: Any, tmp_path: Path, k: int
) -> None:
    m, digests, dpath = shared
    m.mount()
    assert os.listdir(m.mountpoint) == []
    subsets: list[dict[str, Any]] = [
        {},
        {},
        {"subset": {"labels": ["c1", "c2"]}},
        {"subset": {"fraction": 0.5, "seed": 3}},
    ]
    jobs = {f"j{i}": start_job(m, tmp_path, f"j{i}", dpath, **subsets[i]) for i in range(k)}
    results = {n: finish(p, tmp_path, n, m) for n, p in jobs.items()}
    everything = set(digests)
    for name, res in results.items():
        share = res["share"]
        assert share["path"] == str(m.mountpoint / name)
        if name in ("j0", "j1"):
            dataset = everything
        elif name == "j2":
            dataset = {f for f in everything if f.split("/")[0] in ("c1", "c2")}
        else:
            assert share["samples"] == 200
            dataset = {f for e, _, files in res["views"] if e == 0 for f in files}
            assert len(dataset) == 200
        assert share["samples"] == len(dataset)
        check_epochs(res, dataset, 2)
        # Views fit the job's share: at most half of it.
        assert all(
            sum(os.path.getsize(m.mountpoint.parent / "src" / f) for f in files)
            <= share["view_bytes"]
            for _, _, files in res["views"]
        )
    st = m.status()
    assert st["jobs"] == [], "every job left"
    assert st["cache_bytes"] <= st["budget_bytes"]
    # The tier serves the union of the datasets about once per epoch, not each job's: samples
    # the jobs share are fetched once and hard-linked between their slots.
    src = m.mountpoint.parent / "src"
    size = {f: (src / f).stat().st_size for f in digests}
    # What separate mounts would read for one epoch of every job.
    separate = sum(
        sum(size[f] for e, _, files in r["views"] if e == 0 for f in files)
        for r in results.values()
    )
    if k == 2:
        # Two jobs over the whole dataset: one job's two epochs and its staging ahead (a
        # third epoch's first views), against two such jobs on separate mounts.
        assert st["tier_bytes_read"] <= 1.3 * separate, (st["tier_bytes_read"], separate)
        assert st["reused_bytes"] >= 1.5 * sum(size.values()), st
    else:
        # Overlapping subsets at different paces share less, but still less than separate
        # mounts read in the two epochs.
        assert st["tier_bytes_read"] < 2 * separate, (st["tier_bytes_read"], separate)


def test_a_job_joins_mid_epoch_and_one_has_another_rf(shared: Any, tmp_path: Path) -> None:
    m, digests, dpath = shared
    m.mount()
    a = start_job(m, tmp_path, "a", dpath, epochs=2, rf_policy="fixed", rf=1)
    # b joins once a is a few views in.
    wait_for(
        lambda: any(
            j["name"] == "a" and (j["mini_epoch"] or 0) >= 2 for j in m.status()["jobs"] or []
        ),
        60,
        "job a a few views in",
    )
    b = start_job(m, tmp_path, "b", dpath, epochs=1, rf_policy="fixed", rf=3)
    ra, rb = finish(a, tmp_path, "a", m), finish(b, tmp_path, "b", m)
    check_epochs(ra, set(digests), 2)
    check_epochs(rb, set(digests), 1)
    # Each job's own rf: a one pass per view, b three (bonus passes only add).
    assert all(n == 1 for _, _, n in ra["rf"][:-1]) or ra["status"]["bonus_passes"] > 0, ra["rf"]
    assert all(n >= 3 for _, _, n in rb["rf"][:-1]), rb["rf"]
    assert rb["status"]["rf_policy"] == "fixed" and rb["status"]["rf"] == 3
    # Each job's rf history is its own run in the mount's history file, under its name, ended
    # by its `leave`.
    runs = {r["job"]: r for r in json.loads((tmp_path / "rf-history.json").read_text())["runs"]}
    assert set(runs) == {"a", "b"}, runs.keys()
    assert (
        runs["a"]["dataset"] == runs["b"]["dataset"]
        and runs["a"]["finished"]
        and runs["b"]["finished"]
    )
    for job, res, rf in (("a", ra, 1), ("b", rb, 3)):
        recs = runs[job]["mini_epochs"]
        assert len(recs) >= len(res["rf"]) - 1 and all(r["rf"] >= rf for r in recs), (job, recs)


def test_a_killed_job_is_dropped_after_the_idle_timeout_and_the_others_go_on(
    shared: Any, tmp_path: Path
) -> None:
    m, digests, dpath = shared
    m.mount()
    # A job that joins and never sends pass_end, and one killed with SIGKILL mid-training.
    idle = start_job(m, tmp_path, "idle", dpath)
    wait_for(lambda: "idle" in os.listdir(m.mountpoint), 60, "job idle joined")
    os.kill(idle.pid, signal.SIGSTOP)
    k = start_job(m, tmp_path, "k", dpath, epochs=5)
    wait_for(lambda: "k" in os.listdir(m.mountpoint), 60, "job k joined")
    time.sleep(0.5)
    os.kill(k.pid, signal.SIGKILL)
    k.wait()
    a = start_job(m, tmp_path, "a", dpath, epochs=2)
    ra = finish(a, tmp_path, "a", m)
    check_epochs(ra, set(digests), 2)
    wait_for(lambda: not (m.status()["jobs"] or []), 30, "idle and killed jobs dropped")
    assert os.listdir(m.mountpoint) == []
    log = (m.cache / "metfs.log").read_text(errors="replace")
    assert log.count("dropping a job that sent no request") == 2, log[-3000:]
    os.kill(idle.pid, signal.SIGKILL)
    idle.wait()
    # Their shares are free again: four new jobs fit.
    socks = [rpc(m.socket, {"op": "hello", "job": f"n{i}"}) for i in range(4)]
    assert all(r["ok"] for r in socks), socks
    # Each join answers once the job's first view is staged; these four send nothing after it,
    # so on a loaded machine, where a join takes seconds, the first may already be dropped for
    # its silence (`--share-idle-secs 4`) when the last one joins.
    listed = os.listdir(m.mountpoint)
    assert "n3" in listed and set(listed) <= {"n0", "n1", "n2", "n3"}, listed


def test_kept_slots_are_trimmed_sample_by_sample_within_the_budget(
    mounts: Callable[..., Mount], tmp_path: Path
) -> None:
    """Staggered jobs over one store whose budget keeps retired slots: when a staging needs room,
    single samples of kept slots go (RefCnt's order), the budget holds at every sample of the
    cache's size on disk, and every job still reads its dataset exactly once per epoch."""
    src = tmp_path / "src"
    digests = make_dataset(src, 400)
    dpath = tmp_path / "digests.json"
    dpath.write_text(json.dumps(digests))
    # Shares for 4 jobs and 3 jobs: the fourth share keeps retired slots, a few at a time.
    m = mounts(
        src, "4MiB", "--share", "--share-jobs", "4", "--rf", "1", "--rf-policy", "fixed", name="t"
    )
    m.mount()
    peak = [0]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], footprint(m.cache, each_file_once=True))
            time.sleep(0.02)

    w = threading.Thread(target=watch, daemon=True)
    w.start()
    stop_file = tmp_path / "stop"
    try:
        jobs = {"a": start_job(m, tmp_path, "a", dpath, epochs=2, stop=stop_file)}
        for name in ("b", "c"):
            wait_for(
                lambda: (
                    len(m.status()["jobs"] or []) == len(jobs)
                    and all((j["mini_epoch"] or 0) >= 3 for j in m.status()["jobs"])
                ),
                120,
                "the jobs a few views in",
            )
            jobs[name] = start_job(m, tmp_path, name, dpath, epochs=2, stop=stop_file)
        try:
            wait_for(
                lambda: (
                    len(m.status()["jobs"] or []) == 3
                    and all((j["mini_epoch"] or 0) >= 3 for j in m.status()["jobs"])
                ),
                120,
                "three jobs a few views in",
            )
        except AssertionError as e:
            errs = {
                n: p.stderr.read()[-2000:] if p.poll() is not None and p.stderr else "running"
                for n, p in jobs.items()
            }
            raise AssertionError(
                f"{e}\nstatus: {json.dumps(m.status())}\njobs: {errs}\nlog:\n{m.log()[-6000:]}"
            ) from e
        stop_file.touch()
        results = {n: finish(p, tmp_path, n, m) for n, p in jobs.items()}
    finally:
        stop.set()
        w.join()
    for res in results.values():
        check_epochs(res, set(digests), 2, at_least=True)
    st = m.status()
    assert st["trimmed_samples"] > 0, json.dumps(st)
    assert peak[0] <= st["budget_bytes"], (peak[0], st["budget_bytes"])
    assert st["cache_bytes"] <= st["budget_bytes"], st


def test_bad_joins_get_clear_errors_and_leave_the_others_alone(shared: Any, tmp_path: Path) -> None:
    m, digests, dpath = shared
    m.mount()
    a = start_job(m, tmp_path, "a", dpath, epochs=2)
    wait_for(lambda: "a" in os.listdir(m.mountpoint), 60, "job a joined")

    def hello(**kw: Any) -> dict[str, Any]:
        return rpc(m.socket, {"op": "hello", "v": 1, **kw})

    r = hello(job="a")
    assert not r["ok"] and "already on this shared mount" in r["error"]["message"], r
    manifest = tmp_path / "subset.txt"
    manifest.write_text("c0/s0000.bin\nc7/nowhere.bin\n")
    r = hello(job="b", subset={"manifest": str(manifest)})
    assert (
        not r["ok"]
        and "line 2" in r["error"]["message"]
        and "c7/nowhere.bin" in r["error"]["message"]
    ), r
    r = hello(job="b", subset={"labels": ["dogs"]})
    assert not r["ok"] and '"dogs"' in r["error"]["message"], r
    r = hello(job="../b")
    assert not r["ok"] and "not valid" in r["error"]["message"], r
    r = hello()
    assert not r["ok"] and "name the job" in r["error"]["message"], r
    r = rpc(m.socket, {"op": "pass_end", "metrics": {}})
    assert not r["ok"] and "name the job" in r["error"]["message"], r
    r = rpc(m.socket, {"op": "pass_end", "job": "ghost", "metrics": {}})
    assert not r["ok"] and "has not joined" in r["error"]["message"], r
    # The budget is shared by four: three more fit, a fifth is refused with the numbers.
    for i in range(3):
        assert hello(job=f"f{i}")["ok"]
    r = hello(job="f3")
    assert (
        not r["ok"]
        and "cannot join" in r["error"]["message"]
        and "share.jobs" in r["error"]["message"]
    ), r
    for i in range(3):
        assert rpc(m.socket, {"op": "leave", "job": f"f{i}"})["ok"]
    ra = finish(a, tmp_path, "a", m)
    check_epochs(ra, set(digests), 2)


def test_a_plain_mount_refuses_share_requests(mounts: Callable[..., Mount], tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_dataset(src, 40)
    m = mounts(src, "4MiB", name="p")
    m.mount()
    r = rpc(m.socket, {"op": "hello", "job": "a", "subset": {"fraction": 0.5}})
    assert not r["ok"] and "shared mounts" in r["error"]["message"], r
    r = rpc(m.socket, {"op": "leave", "job": "a"})
    assert not r["ok"] and "shared mounts" in r["error"]["message"], r
    assert m.status()["jobs"] is None


# A shared mount saves each job's place (`CACHE/share.json`): after a restart, clean or
# `kill -9`, a job that joins again with its name and token resumes where it was.
RESUME = (
    "--share",
    "--share-jobs",
    "4",
    "--share-pace",
    "evict",
    "--share-idle-secs",
    "3600",
    "--rf-policy",
    "score",
    "--score-metrics",
    "loss",
    "--score-weights",
    "1",
    "--score-wait",
    "1",
    "--rf-max",
    "4",
)


def _client(m: Mount, name: str, token: str | None = None) -> Any:
    sys.path.insert(0, str(ROOT / "bindings" / "python" / "src"))
    import metfs

    return metfs.Client(m.socket, job=name, token=token)


def _train(
    m: Mount, c: Any, digests: dict[str, str], seen: dict[tuple[str, int], list[str]], advances: int
) -> None:
    """Passes over the job's view until it has switched `advances` times: each pass reads every
    file through MNT/<job> and checks it; the loss improves once per view, so the score policy
    (wait 1) leaves each view after its second pass."""
    done = 0
    first = True
    while done < advances:
        root = m.mountpoint / c.job
        st = next(j for j in m.status()["jobs"] if j["name"] == c.job)
        files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
        for rel in files:
            assert hashlib.sha256((root / rel).read_bytes()).hexdigest() == digests[rel], (
                f"{c.job}: {rel} differs from the source"
            )
        if first:
            seen.setdefault((c.job, st["epoch"]), []).extend(files)
            first = False
        d = c.pass_end({"loss": 1.0 / (2 + st["mini_epoch"] + 1000 * st["epoch"])})
        if d.decision == "advance":
            done += 1
            first = True


def _all_next_ready(m: Mount, names: list[str]) -> None:
    wait_for(
        lambda: (
            all(j["next_ready"] for j in m.status()["jobs"] or [])
            and len(m.status()["jobs"] or []) == len(names)
        ),
        180,
        "every job's next view staged",
    )
    # The save that follows a staging lands on a thread of its own.
    time.sleep(1.0)


def _place(j: dict[str, Any]) -> dict[str, Any]:
    return {
        k: j[k]
        for k in (
            "epoch",
            "mini_epoch",
            "generation",
            "pass",
            "rf_policy",
            "rf",
            "samples",
            "share_bytes",
            "files",
            "view_bytes",
        )
    }


def _resume_case(mounts: Callable[..., Mount], tmp_path: Path, kill: bool) -> None:
    src = tmp_path / "src"
    digests = make_dataset(src, 400)
    m = mounts(src, "4MiB", *RESUME, name="r")
    m.mount()
    names = ["a", "b", "c"]
    clients = {n: _client(m, n) for n in names}
    seen: dict[tuple[str, int], list[str]] = {}
    for i, n in enumerate(names):
        _train(m, clients[n], digests, seen, 1 + i)
    _all_next_ready(m, names)
    before = {j["name"]: j for j in m.status()["jobs"]}
    tokens = {n: clients[n].info.share["token"] for n in names}
    for c in clients.values():
        c.close()
    if kill:
        os.kill(m.pid(), signal.SIGKILL)
        time.sleep(0.5)
    else:
        m.umount()
    assert (m.cache / "share.json").exists()
    m.mount()
    log = (m.cache / "metfs.log").read_text(errors="replace")
    assert log.count("job resumed from its kept slots") == 3, log[-3000:]
    if not kill:
        assert "sealed at the last clean shutdown" in log
    # A job of a saved name without its token is another job: refused, as on a live mount.
    r = rpc(m.socket, {"op": "hello", "v": 1, "job": "a", "token": "0123456789abcdef"})
    assert not r["ok"] and "already on this shared mount" in r["error"]["message"], r
    clients = {n: _client(m, n, tokens[n]) for n in names}
    after = {j["name"]: j for j in m.status()["jobs"]}
    for n in names:
        assert _place(after[n]) == _place(before[n]), (n, before[n], after[n])
        assert clients[n].info.share["token"] == tokens[n]
    _all_next_ready(m, names)
    # Nothing was fetched again: every job's current and next views were in its kept slots.
    st = m.status()
    assert st["tier_bytes_read"] == 0, st
    for n in names:
        _train(m, clients[n], digests, seen, 1)
    for (job, epoch), files in seen.items():
        assert len(files) == len(set(files)), f"{job} read a sample twice in epoch {epoch}"
    for c in clients.values():
        c.leave()
        c.close()
    assert m.status()["jobs"] == []


def test_jobs_resume_their_places_after_a_kill_9_of_the_daemon(
    mounts: Callable[..., Mount], tmp_path: Path
) -> None:
    _resume_case(mounts, tmp_path, kill=True)


def test_jobs_resume_their_places_after_a_clean_unmount(
    mounts: Callable[..., Mount], tmp_path: Path
) -> None:
    _resume_case(mounts, tmp_path, kill=False)


def test_a_saved_job_that_does_not_come_back_is_dropped_and_a_corrupt_save_file_is_refused(
    mounts: Callable[..., Mount], tmp_path: Path
) -> None:
    src = tmp_path / "src"
    digests = make_dataset(src, 400)
    m = mounts(src, "4MiB", *RESUME, name="d")
    m.mount()
    seen: dict[tuple[str, int], list[str]] = {}
    c = _client(m, "gone")
    _train(m, c, digests, seen, 1)
    _all_next_ready(m, ["gone"])
    c.close()
    m.umount()
    # Not back within share.idle_secs after the restart: dropped as a silent job, its share freed.
    m.args[m.args.index("--share-idle-secs") + 1] = "3"
    m.mount()
    # A drop leaves the sessions first and the mount's root a moment later (`leave_as`).
    wait_for(
        lambda: not (m.status()["jobs"] or []) and os.listdir(m.mountpoint) == [],
        60,
        "the job that did not come back dropped",
    )
    wait_for(
        lambda: not json.loads((m.cache / "share.json").read_text())["jobs"],
        30,
        "the save file without it",
    )
    m.umount()
    (m.cache / "share.json").write_text('{"version": 1, "settings": {')
    r = m.mount(check=False)
    assert r.returncode != 0
    assert "share.json" in r.stderr and "--reset" in r.stderr, r.stderr
    m.args += ["--reset"]
    m.mount()
    assert m.status()["jobs"] == []


@pytest.mark.parametrize("read_path", ["pread", "cached", "passthrough"])
def test_a_frozen_reader_is_capped_and_its_newest_views_keep_their_bytes(
    mounts: Callable[..., Mount], tmp_path: Path, read_path: str
) -> None:
    """A reader of job `a` keeps a file of each of its views open while the job moves on (a
    frozen reader). Under `share.held_open_cap` 0.5 (one view's bytes) one held retired view
    is allowed; once it holds two, the oldest is taken back within seconds: it no longer pins
    its slot (`status` stops listing it as draining), a read through the old descriptor (its
    cached pages dropped) fails, the newer held view still reads the source's bytes, and
    `status` and an event say what the job held and what was taken back. Through passthrough
    the kernel reads the slot files itself: nothing is taken back, and the event says how many
    bytes past the cap could not be, once."""
    import errno

    src = tmp_path / "src"
    digests = make_dataset(src, 400)
    m = mounts(
        src, "4MiB", "--share", "--share-jobs", "2", "--rf", "1", "--read-path", read_path, name="s"
    )
    m.mount()
    c = _client(m, "a")
    root = m.mountpoint / "a"
    wait_for(lambda: bool(c.files().files), 60, "job a's first view")

    def hold() -> tuple[Any, str, int]:
        v = c.files()
        rel = v.files[0]
        f = open(root / rel, "rb")  # noqa: SIM115 (held open across the switches)
        assert hashlib.sha256(f.read()).hexdigest() == digests[rel]
        return f, rel, v.generation

    def job() -> dict[str, Any]:
        return next(j for j in m.status()["jobs"] if j["name"] == "a")

    def capped() -> list[dict[str, Any]]:
        events = (json.loads(line) for line in (m.cache / "run" / "events.jsonl").open())
        return [e for e in events if e["event"] == "held_open_capped"]

    old, old_rel, g_old = hold()
    c.advance(wait=True)
    new, new_rel, g_new = hold()
    time.sleep(1.5)  # one look of the monitor: one held view is within the cap
    assert job()["revoked_bytes"] == 0, job()
    c.advance(wait=True)
    cap = job()["share_bytes"] // 2
    if read_path == "passthrough":
        wait_for(lambda: bool(capped()), 30, "the job reported past its cap")
        time.sleep(2.5)  # more looks of the monitor: reported once, not at each
        ev = capped()
        assert len(ev) == 1 and ev[0]["generations"] == [] and ev[0]["unrevocable_bytes"] > 0, ev
        assert job()["revoked_bytes"] == 0 and job()["held_open_bytes"] > cap, job()
        old.seek(0)
        assert hashlib.sha256(old.read()).hexdigest() == digests[old_rel]
    else:
        wait_for(lambda: job()["revoked_bytes"] > 0, 30, "the oldest held view taken back")
        assert 0 < job()["held_open_bytes"] <= cap, (job(), cap)
        wait_for(
            lambda: g_old not in {d["generation"] for d in m.status()["draining"]},
            30,
            "the view taken back to stop pinning its slot",
        )
        # Its pages dropped, a read of the old descriptor reaches the daemon, which refuses it.
        os.posix_fadvise(old.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        with pytest.raises(OSError) as e:
            os.pread(old.fileno(), 4096, 0)
        assert e.value.errno in (errno.EIO, errno.ESTALE), e.value
        ev = capped()
        assert ev and ev[0]["job"] == "a" and ev[0]["generations"] == [g_old], ev
        # The reader (this process) is named where it opened the file through the daemon.
        assert ev[0]["pids"] == ([] if read_path == "cached" else [os.getpid()]), ev
        assert ev[0]["held_bytes"] > ev[0]["cap_bytes"] == cap, ev
        assert g_new not in ev[0]["generations"]
    new.seek(0)
    assert hashlib.sha256(new.read()).hexdigest() == digests[new_rel]
    old.close()
    new.close()
    c.leave()


def test_a_held_open_cap_larger_than_the_share_is_refused(
    mounts: Callable[..., Mount], tmp_path: Path
) -> None:
    src = tmp_path / "src"
    make_dataset(src, 20)
    for bad in ("1.5", "0"):
        m = mounts(src, "4MiB", "--share", "--share-held-open-cap", bad, name=f"cap{bad}")
        r = m.mount(check=False)
        assert r.returncode != 0
        assert "share.held_open_cap" in r.stderr and "a fraction of a job's share" in r.stderr, (
            r.stderr
        )
