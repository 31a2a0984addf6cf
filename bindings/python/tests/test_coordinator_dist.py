"""TorchDistributedCoordinator with two real gloo ranks, each with its own fake daemon."""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import pytest
from distrun import run_ranks
from fake_daemon import FakeDaemon


@pytest.fixture
def two_fakes():  # type: ignore[no-untyped-def]
    d = tempfile.mkdtemp(prefix="metfs-dist")
    fakes = [FakeDaemon(os.path.join(d, f"n{i}.sock"), mountpoint=f"/fake/n{i}") for i in range(2)]
    try:
        yield fakes, d
    finally:
        for f in fakes:
            f.close()
        shutil.rmtree(d, ignore_errors=True)


def test_ranks_agree_on_every_mini_epoch(two_fakes) -> None:  # type: ignore[no-untyped-def]
    (leader, follower), d = two_fakes
    follower.next_ready = False  # the follower's daemon never says it is ready by itself
    reports = run_ranks([leader.path, follower.path], epochs=2, workdir=d)
    for r in reports:
        assert r["error"] is None, r["error"]
        assert r["coordinator"] == "TorchDistributedCoordinator" and r["done"]
    pos = [[(p["epoch"], p["mini_epoch"]) for p in r["passes"]] for r in reports]
    assert pos[0] == pos[1]
    # The follower never reported ready; the leader's daemon still advanced (protocol 1 cannot
    # hold it) and the follower applied; both did exactly 2 epochs x 3 mini-epochs.
    assert sorted(set(pos[0])) == [(e, m) for e in range(2) for m in range(3)]
    assert reports[0]["decisions"] == reports[1]["decisions"]
    assert reports[0]["not_ready"] == reports[1]["not_ready"] == [[1]] * 12
    # Only the leader's daemon decided; the follower's was moved with apply.
    assert "pass_end" in leader.ops() and "apply" not in leader.ops()
    assert "pass_end" not in follower.ops() and follower.ops().count("apply") == 6
    assert (follower.epoch, follower.mini_epoch) == (leader.epoch, leader.mini_epoch) == (2, 0)
    # Each rank read its own node's view.
    assert reports[1]["passes"][0]["files"] == follower.files_at(0, 0)


def test_follower_catches_up_at_start(two_fakes) -> None:  # type: ignore[no-untyped-def]
    (leader, follower), d = two_fakes
    leader.epoch, leader.mini_epoch = 1, 2
    reports = run_ranks([leader.path, follower.path], epochs=1, workdir=d)
    assert all(r["error"] is None for r in reports), reports
    assert reports[1]["passes"][0]["epoch"] == 1 and reports[1]["passes"][0]["mini_epoch"] == 2
    assert follower.requests[2] == {
        "v": 1,
        "op": "apply",
        "epoch": 1,
        "mini_epoch": 2,
        "wait": True,
        # The client names its job in every request (a shared mount needs it).
        "job": "dist",
    }


def test_dead_daemon_on_follower_fails_every_rank_fast(  # type: ignore[no-untyped-def]
    two_fakes,
) -> None:
    (leader, follower), d = two_fakes
    t0 = time.monotonic()
    reports = run_ranks([leader.path, follower.path], epochs=3, workdir=d, kill_after=[None, 3])
    assert time.monotonic() - t0 < 60
    r0, r1 = reports
    assert len(r0["passes"]) == len(r1["passes"]) == 3
    assert r1["code"] == "connection_failed" and "rank 1" in r1["error"]
    assert r0["code"] == "peer_failed" and "rank 1" in r0["error"] and follower.path in r0["error"]


def test_dead_daemon_on_leader_fails_every_rank_fast(  # type: ignore[no-untyped-def]
    two_fakes,
) -> None:
    (leader, follower), d = two_fakes
    reports = run_ranks([leader.path, follower.path], epochs=3, workdir=d, kill_after=[2, None])
    r0, r1 = reports
    assert len(r0["passes"]) == len(r1["passes"]) == 2
    assert r0["code"] == "connection_failed" and r1["code"] == "peer_failed"
    assert "rank 0" in r1["error"]
