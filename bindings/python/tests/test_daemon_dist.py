"""Two torch.distributed (gloo) ranks, each with its own real metfs daemon and FUSE mount."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable

from distrun import run_ranks
from realmount import RealMount


def test_two_ranks_two_daemons_agree(real_mount: Callable[..., RealMount]) -> None:
    nodes = [real_mount(per_class=8, mini_epochs=3, rf=2) for _ in range(2)]
    reports = run_ranks(
        [n.socket for n in nodes],
        epochs=2,
        workdir=tempfile.mkdtemp(dir=os.path.dirname(nodes[0].root)),
    )
    for r in reports:
        assert r["error"] is None, r["error"]
        assert r["done"] and r["coordinator"] == "TorchDistributedCoordinator"
    pos = [[(p["epoch"], p["mini_epoch"]) for p in r["passes"]] for r in reports]
    assert pos[0] == pos[1] and len(set(pos[0])) == 6
    # Every pass read a whole view through its own node's mount.
    for r, node in zip(reports, nodes):
        for p in r["passes"]:
            assert p["bytes"] == sum(
                os.path.getsize(os.path.join(node.source, f)) for f in p["files"]
            )
    # Same dataset and seed on both nodes: the same plan, so the same files at every pass.
    assert [p["files"] for p in reports[0]["passes"]] == [p["files"] for p in reports[1]["passes"]]


def test_daemon_dying_on_one_node_fails_both_ranks(real_mount: Callable[..., RealMount]) -> None:
    nodes = [real_mount(per_class=8, mini_epochs=3, rf=2) for _ in range(2)]
    reports = run_ranks(
        [n.socket for n in nodes],
        epochs=3,
        workdir=tempfile.mkdtemp(dir=os.path.dirname(nodes[0].root)),
        kill_after=[None, 3],
    )
    r0, r1 = reports
    # The daemon answers `shutdown` and then stops: the failure shows at the end of pass 3 or
    # when pass 4 reads the view, on both ranks at the same point.
    assert len(r0["passes"]) == len(r1["passes"]) in (3, 4)
    assert r1["code"] in ("connection_failed", "connection_lost", "shutting_down"), r1
    assert r0["code"] == "peer_failed" and "rank 1" in r0["error"], r0
    assert r0["seconds"] < 60
