"""A shared mount (`metfs mount --share`) killed with `kill -9` loses no job's pass: each job's
position, rf policy state and cohort place are saved (`CACHE/share.json`, atomically) before
every `pass_end` answers, so after a restart with the same mount command each job resumes at
the epoch, mini-epoch and pass its last answer gave. A job whose saved place cannot be resumed
is told why in its `hello`, in `status` and by a `job_not_resumed` event."""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from conftest import Mount, rpc
from test_dds_mount import make_dataset

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bindings" / "python" / "src"))

import metfs  # noqa: E402


SHARE = ("--share", "--share-idle-secs", "3600")


def _client(m: Mount, name: str, token: str | None = None) -> metfs.Client:
    return metfs.Client(m.socket, job=name, token=token, wait_timeout=120)


def _jobs(m: Mount) -> dict[str, dict[str, Any]]:
    return {j["name"]: j for j in m.status()["jobs"] or []}


def _at(d: Any) -> tuple[int, int, int]:
    """Where a `pass_end` answer leaves the job: epoch, mini-epoch, passes over it."""
    return (d.epoch, d.mini_epoch, d.passes_done)


def _kill_and_mount_again(m: Mount) -> str:
    """`kill -9` of the daemon, then the same mount command; returns the new log's lines."""
    os.kill(m.pid(), signal.SIGKILL)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            os.kill(m.pid(), 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    size = (m.cache / "metfs.log").stat().st_size
    m.mount()
    return (m.cache / "metfs.log").read_bytes()[size:].decode(errors="replace")


def test_the_issues_case_resumes_both_jobs_after_kill_9(
    mounts: Callable[..., Mount], tmp_path: Path
) -> None:
    """Issue 57's reproduction: two jobs each advance twice, 2 s of quiet, `kill -9`, the same
    mount: both resume where they were (the first was refused its own save: it owed a sample
    more than two reads, drawn ahead by the other's requests)."""
    src = tmp_path / "src"
    make_dataset(src, 240)
    # A budget whose views hold the whole dataset: every view is an epoch, so the second job's
    # views are drawn ahead by the first one's, two epochs and more.
    m = mounts(
        src, "16MiB", *SHARE, "--share-jobs", "2", "--mini-epochs", "4", "--rf", "1", name="i"
    )
    m.mount()
    clients = {n: _client(m, n) for n in ("ja", "jb")}
    for c in clients.values():
        for _ in range(2):
            assert c.advance(wait=True).decision == "advance"
    time.sleep(2)
    before = _jobs(m)
    saved = json.loads((m.cache / "share.json").read_text())
    owed = {j["name"]: max(n for _, n in j["cohort"]["needs"]) for j in saved["jobs"]}
    print(f"most reads owed of one sample, by job: {owed}")
    assert owed["ja"] >= 3, owed
    log = _kill_and_mount_again(m)
    assert "cannot resume" not in log, log[-3000:]
    assert log.count("job resumed from its kept slots") == 2, log[-3000:]
    assert m.status()["not_resumed"] == []
    for n, c in clients.items():
        # The client's next request reconnects with its token.
        assert c.status().raw["jobs"] is not None
        assert c.info.not_resumed is None
        after = _jobs(m)[n]
        for k in ("epoch", "mini_epoch", "pass", "generation"):
            assert after[k] == before[n][k], (n, k, before[n], after)
    for c in clients.values():
        assert c.advance(wait=True).decision == "advance"
        c.leave()
        c.close()


def _passes(
    m: Mount,
    clients: dict[str, metfs.Client],
    reached: dict[str, tuple[int, int, int]],
    n: int,
    rng: random.Random,
    times: list[float],
) -> None:
    """`n` pass ends (at least one per job, so that each has an answer to resume at), the
    others by jobs drawn at random, in a random order; `reached` keeps each one's last answer."""
    names = sorted(clients)
    order = names + [rng.choice(names) for _ in range(max(0, n - len(names)))]
    rng.shuffle(order)
    for name in order:
        t = time.perf_counter()
        d = clients[name].pass_end({"loss": rng.random()})
        times.append(time.perf_counter() - t)
        reached[name] = _at(d)


def test_three_jobs_resume_at_the_pass_they_reached_after_kill_9(
    mounts: Callable[..., Mount], tmp_path: Path
) -> None:
    """Three jobs pass over their views (rf 3, so most answers are `repeat` and no switch saves
    for them); the daemon is killed right after a random pass's answer, twice, and each job
    resumes at the epoch, mini-epoch and pass of its last answer, and goes on from there."""
    seed = int(os.environ.get("METFS_KILL_SEED", time.time_ns() % 10**6))
    rng = random.Random(seed)
    print(f"seed {seed} (METFS_KILL_SEED reruns it)")
    src = tmp_path / "src"
    make_dataset(src, 300)
    m = mounts(src, "4MiB", *SHARE, "--share-jobs", "3", "--rf", "3", name="k")
    m.mount()
    clients = {n: _client(m, n) for n in ("a", "b", "c")}
    reached: dict[str, tuple[int, int, int]] = {}
    times: list[float] = []
    for round_ in range(2):
        _passes(m, clients, reached, rng.randrange(5, 40), rng, times)
        print(f"round {round_}: killed after {reached}")
        log = _kill_and_mount_again(m)
        assert log.count("job resumed from its kept slots") == 3, log[-3000:]
        for name, c in clients.items():
            st = c.status()
            assert c.info.not_resumed is None
            job = _jobs(m)[name]
            assert (job["epoch"], job["mini_epoch"], job["pass"]) == reached[name], (
                f"{name} resumed at {job}, its last answer was {reached[name]} (seed {seed})"
            )
            assert st.raw["not_resumed"] == []
    # Each job goes on from its pass: the next answer counts one more (or moves on).
    for name, c in clients.items():
        d = c.pass_end({"loss": 0.5})
        e, mini, p = reached[name]
        assert _at(d) == (e, mini, p + 1) or d.decision in ("advance", "wait"), (name, d)
        c.leave()
        c.close()
    ms = sorted(t * 1e3 for t in times)
    print(
        f"pass_end answered in {statistics.median(ms):.2f} ms median, "
        f"{ms[int(0.9 * (len(ms) - 1))]:.2f} ms p90 over {len(ms)} passes "
        "(each with the save of every job's place)"
    )


def test_a_job_whose_place_cannot_be_resumed_is_told_why(
    mounts: Callable[..., Mount], tmp_path: Path
) -> None:
    """A saved place that does not check (its owed reads edited) is not resumed: the job's
    `hello` says why and where it was, `status` lists it, the event log has a
    `job_not_resumed` record; the other job resumes, and the refused one starts over."""
    src = tmp_path / "src"
    make_dataset(src, 240)
    m = mounts(src, "4MiB", *SHARE, "--share-jobs", "2", "--rf", "1", name="t")
    m.mount()
    clients = {n: _client(m, n) for n in ("good", "bad")}
    for c in clients.values():
        assert c.advance(wait=True).decision == "advance"
        c.pass_end({"loss": 1.0})
    before = _jobs(m)
    tokens = {n: c.info.share["token"] for n, c in clients.items()}
    for c in clients.values():
        c.close()
    os.kill(m.pid(), signal.SIGKILL)
    time.sleep(0.5)
    path = m.cache / "share.json"
    saved = json.loads(path.read_text())
    bad = next(j for j in saved["jobs"] if j["name"] == "bad")
    bad["cohort"]["needs"][0][1] += 5
    path.write_text(json.dumps(saved))
    m.mount()
    st = m.status()
    assert [n["job"] for n in st["not_resumed"]] == ["bad"], st["not_resumed"]
    told = st["not_resumed"][0]
    assert "needs" in told["reason"] and "its views say" in told["reason"], told
    assert (told["epoch"], told["mini_epoch"], told["passes"]) == (
        before["bad"]["epoch"],
        before["bad"]["mini_epoch"],
        before["bad"]["pass"],
    )
    # `metfs status`'s text says it too.
    text = subprocess.run(
        [m.bin, "status", "--socket", m.socket], capture_output=True, text=True, check=True
    ).stdout
    assert f"job bad not resumed (it starts over at epoch 0; saved at epoch {told['epoch']}" in (
        text
    ), text
    events = [json.loads(line) for line in (m.cache / "run" / "events.jsonl").open()]
    ev = [e for e in events if e["event"] == "job_not_resumed"]
    assert len(ev) == 1 and ev[0]["job"] == "bad" and ev[0]["reason"] == told["reason"], ev
    # Its hello (with its old token: it was not resumed, so this is a new join) says why, once.
    c = _client(m, "bad", tokens["bad"])
    assert c.info.not_resumed is not None
    assert c.info.not_resumed.reason == told["reason"]
    assert c.status().raw["jobs"] is not None
    assert _jobs(m)["bad"]["epoch"] == 0
    good = _client(m, "good", tokens["good"])
    assert good.info.not_resumed is None
    assert _jobs(m)["good"]["mini_epoch"] == before["good"]["mini_epoch"]
    c.leave()
    c.close()
    r = rpc(m.socket, {"op": "hello", "v": 1, "job": "bad"})
    assert r["ok"] and r["not_resumed"] is None, r
    assert rpc(m.socket, {"op": "leave", "job": "bad"})["ok"]
    good.leave()
    good.close()
