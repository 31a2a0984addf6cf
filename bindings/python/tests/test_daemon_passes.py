"""The client and the pass loop against a real metfs daemon on a real FUSE mount."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable

import pytest
from realmount import REPO, RealMount, is_mounted
from realmount import _daemon_pids as daemon_pids

import metfs
from metfs.pathlist import PathList


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_hello_status_files(real_mount: Callable[..., RealMount]) -> None:
    m = real_mount(per_class=10, mini_epochs=3, rf=2)
    with metfs.Client(m.socket, job="probe") as c:
        assert c.info is not None and c.info.protocol == 1
        assert os.path.realpath(c.info.mountpoint or "") == os.path.realpath(m.mountpoint)
        assert c.info.job == "probe"
        st = c.status()
        assert (st.epoch, st.mini_epoch, st.passes_done) == (0, 0, 0)
        assert st.mini_epochs == 3 and st.rf == 2 and st.generation >= 1
        assert isinstance(st.next_ready, bool)
        for name in ("cache_bytes", "budget_bytes", "tier_bytes_read", "view_files"):
            assert isinstance(getattr(st, name), int), (name, st.raw)
        assert st.cache_bytes <= st.budget_bytes
        v = c.files()
        assert v.generation == st.generation and (v.epoch, v.mini_epoch) == (0, 0)
        assert len(v) == st.view_files and len(v) > 0
        assert sorted(v.files) == m.view_files()
        for rel, path in zip(v.files, v.paths):
            assert not os.path.isabs(rel) and path == os.path.join(v.mountpoint, rel)
            assert _read(path) == _read(os.path.join(m.source, rel))


def test_the_list_comes_packed_and_only_when_the_view_changed(
    real_mount: Callable[..., RealMount],
) -> None:
    m = real_mount(per_class=10, mini_epochs=3, rf=2)
    with metfs.Client(m.socket) as c:
        v = c.files()
        assert isinstance(v.files, PathList) and isinstance(v.paths, PathList)
        # The packed list is the JSON list, in the same order.
        listed = c.request({"op": "files"})
        assert listed["count"] == len(v) and v.files == listed["files"]
        assert list(v.paths) == [os.path.join(v.mountpoint, f) for f in listed["files"]]
        # Unchanged: no list on the wire, the view held comes back.
        raw = c.request({"op": "files", "known_generation": v.generation})
        assert raw["unchanged"] is True and raw["files"] == [] and raw["packed"] is None
        assert c.files(v) is v
        d = c.advance(wait=True)
        after = c.files(v)
        assert after.generation == d.generation != v.generation
        assert sorted(after.files) == m.view_files() and set(after.files).isdisjoint(v.files)
        # A worker process started by spawn gets the list by pickle, the buffer once.
        assert pickle.loads(pickle.dumps(after.paths)) == after.paths
        # The pass loop hands every pass over one view the same list object.
        run = metfs.passes(c, epochs=1, block=True)
        seen: dict[int, int] = {}
        for p in run:
            assert seen.setdefault(p.generation, id(p.files)) == id(p.files), p
            for rel, path in zip(p.files, p.paths, strict=True):
                assert _read(path) == _read(os.path.join(m.source, rel))
        assert len(seen) >= 2


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("known_generation", -1, "field `known_generation` must be a non-negative integer"),
        ("known_generation", "3", "field `known_generation` must be a non-negative integer"),
        ("form", "xml", 'field `form` must be "list" or "packed", got "xml"'),
    ],
)
def test_a_bad_files_request_is_refused_naming_the_field(
    real_mount: Callable[..., RealMount], field: str, value: object, message: str
) -> None:
    m = real_mount(per_class=4, mini_epochs=2, rf=2)
    with metfs.Client(m.socket) as c:
        with pytest.raises(metfs.MetfsError) as e:
            c.request({"op": "files", field: value})
        assert e.value.code == "bad_request" and message in e.value.message, e.value
        assert sorted(c.files().files) == m.view_files()


def test_passes_cover_each_epoch_and_advance_the_view(real_mount: Callable[..., RealMount]) -> None:
    m = real_mount(per_class=12, mini_epochs=3, rf=2)
    source = set(m.source_files)
    with metfs.Client(m.socket, job="loop") as c:
        run = metfs.passes(c, epochs=2, block=True)
        per_epoch: dict[int, Counter[str]] = {}
        views: dict[tuple[int, int], list[str]] = {}
        generations: list[int] = []
        for p in run:
            # What the mount lists is exactly what the daemon says the view is.
            assert sorted(p.files) == m.view_files(), p
            for rel, path in zip(p.files, p.paths):
                assert _read(path) == _read(os.path.join(m.source, rel))
            if p.position not in views:
                views[p.position] = sorted(p.files)
                per_epoch.setdefault(p.epoch, Counter()).update(p.files)
            else:
                assert views[p.position] == sorted(p.files)
            generations.append(p.generation)
            p.report(loss=1.0 / (1 + p.index), accuracy=min(1.0, 0.1 * p.index))
    assert run.done and (run.start_epoch, run.target_epoch) == (0, 2)
    # Every source file in exactly one mini-epoch of each epoch.
    assert set(per_epoch) == {0, 1}
    for counts in per_epoch.values():
        assert set(counts) == source and set(counts.values()) == {1}
    # rf=2 with blocking: exactly two passes per mini-epoch, six mini-epochs.
    assert run.rf_per_mini_epoch() == [(e, mi, 2) for e in range(2) for mi in range(3)]
    assert [d.decision for d in run.decisions] == ["repeat", "advance"] * 6
    # The generation grows by one at every switch and the files change with it.
    assert generations == [g for g in range(generations[0], generations[0] + 6) for _ in range(2)]
    assert views[(0, 0)] != views[(0, 1)] != views[(0, 2)]
    assert run.decisions[-1].position == (2, 0)


def test_pass_end_without_block_repeats_or_waits(real_mount: Callable[..., RealMount]) -> None:
    m = real_mount(per_class=10, mini_epochs=3, rf=2)
    with metfs.Client(m.socket) as c:
        d = c.pass_end({"loss": 0.5})
        assert d.decision == "repeat" and d.passes_done == 1 and d.position == (0, 0)
        assert d.reason is not None and d.reason["policy"] == "fixed", d.raw
        g = c.status().generation
        d = c.pass_end({"loss": 0.4})
        assert d.decision in ("advance", "wait"), d.raw
        if d.decision == "advance":
            assert d.position == (0, 1) and d.passes_done == 0 and d.generation == g + 1
        else:
            assert d.position == (0, 0) and d.generation == g
        st = c.status()
        assert (st.epoch, st.mini_epoch, st.generation) == (d.epoch, d.mini_epoch, d.generation)


def test_advance_wait_switches_the_mount(real_mount: Callable[..., RealMount]) -> None:
    m = real_mount(per_class=10, mini_epochs=3, rf=4)
    with metfs.Client(m.socket) as c:
        before = c.files()
        assert sorted(before.files) == m.view_files()
        d = c.advance(wait=True)
        assert d.advanced and d.position == (0, 1) and d.generation == before.generation + 1
        after = c.files()
        assert after.generation == d.generation and set(after.files).isdisjoint(before.files)
        assert sorted(after.files) == m.view_files()


def test_apply_moves_to_a_given_position(real_mount: Callable[..., RealMount]) -> None:
    m = real_mount(per_class=10, mini_epochs=3, rf=4)
    with metfs.Client(m.socket) as c:
        g = c.status().generation
        d = c.apply(0, 1, wait=True)
        assert d.position == (0, 1) and d.generation == g + 1, d.raw
        assert c.files().mini_epoch == 1 and sorted(c.files().files) == m.view_files()
        # Applying the position already shown changes nothing.
        d = c.apply(0, 1, wait=True)
        assert d.position == (0, 1) and d.generation == g + 1, d.raw


def test_daemon_rejects_bad_requests_and_keeps_the_connection(
    real_mount: Callable[..., RealMount],
) -> None:
    m = real_mount(per_class=10, mini_epochs=3, rf=2)
    with metfs.Client(m.socket) as c:
        with pytest.raises(metfs.MetfsError) as e:
            c.request({"op": "format_disk"})
        assert e.value.code == "unknown_op"
        with pytest.raises(metfs.MetfsError) as e:
            c.request({"op": "pass_end", "metrics": {"loss": "low"}})
        assert e.value.code == "bad_metrics" and "loss" in e.value.message
        with pytest.raises(metfs.MetfsError) as e:
            c.request({"op": "advance", "wait": "yes"})
        assert e.value.code == "bad_request"
        # Rejected before sending: the daemon never counts the pass.
        with pytest.raises(metfs.MetfsError) as e:
            c.pass_end({"loss": float("nan")})
        assert e.value.code == "bad_metrics"
        st = c.status()
        assert st.passes_done == 0 and st.generation >= 1


def test_unmounted_daemon_is_a_fast_clear_error(real_mount: Callable[..., RealMount]) -> None:
    m = real_mount(per_class=10, mini_epochs=3, rf=2)
    c = metfs.Client(m.socket)
    assert c.status().epoch == 0
    m.close()
    assert not is_mounted(m.mountpoint)
    t0 = time.monotonic()
    with pytest.raises(metfs.MetfsConnectionError) as e:
        c.status()
    assert time.monotonic() - t0 < 2.0
    assert e.value.code in ("connection_failed", "connection_lost", "shutting_down")
    assert m.socket in e.value.message or e.value.code == "shutting_down"


def test_example_over_real_mount(  # type: ignore[no-untyped-def]
    real_mount: Callable[..., RealMount], tmp_path
) -> None:
    m = real_mount(per_class=20, mini_epochs=3, rf=2, val=True, compose="random")
    out = tmp_path / "summary.json"
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "examples", "met_sklearn.py"),
            "--mount",
            m.mountpoint,
            "--socket",
            m.socket,
            "--val",
            str(m.val),
            "--epochs",
            "2",
            "--block",
            "--json",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout
    s = json.loads(out.read_text())
    assert s["passes"] == 12 and len(s["mini_epochs"]) == 6
    assert s["mount_bytes"] == 2 * 2 * m.stats["train_bytes"]  # 2 epochs x rf 2
    # Every sample came from the tier at least once, and never once per pass: at most once per
    # epoch plus what was staged ahead (less when staged samples are reused from the store).
    assert m.stats["train_bytes"] <= s["tier_bytes"] <= m.stats["train_bytes"] * 3
    assert s["final_val_accuracy"] > 0.5
    assert "reading every pass from the tier would have cost" in proc.stdout
    print(proc.stdout)


def test_slow_staging_gives_wait_and_the_job_keeps_repeating(
    real_mount: Callable[..., RealMount],
) -> None:
    # Each mini-epoch is ~70 KB; staged at 64 KiB/s the next one takes about a second, far
    # longer than two passes over the current one.
    m = real_mount(per_class=10, mini_epochs=3, rf=2, extra_args=["--prefetch-rate", "64KiB/s"])
    with metfs.Client(m.socket, job="slow") as c:
        run = metfs.passes(c, epochs=1)
        by_position: dict[tuple[int, int], set[int]] = {}
        for p in run:
            by_position.setdefault(p.position, set()).add(p.generation)
            for path in p.paths:
                _read(path)
            time.sleep(0.02)
    decisions = [d.decision for d in run.decisions]
    assert "wait" in decisions, decisions
    # A wait keeps the view: one generation per mini-epoch, however many passes it got.
    assert all(len(g) == 1 for g in by_position.values())
    counts = run.rf_per_mini_epoch()
    assert [(e, mi) for e, mi, _ in counts] == [(0, 0), (0, 1), (0, 2)]
    assert all(n >= 2 for _, _, n in counts) and max(n for _, _, n in counts) > 2
    # The passes after rf are answered with wait until the next mini-epoch is staged.
    for (e, mi, n), start in zip(counts, (0, counts[0][2], counts[0][2] + counts[1][2])):
        assert decisions[start : start + n] == ["repeat"] + ["wait"] * (n - 2) + ["advance"]


def test_block_waits_for_staging_instead(real_mount: Callable[..., RealMount]) -> None:
    m = real_mount(per_class=10, mini_epochs=3, rf=2, extra_args=["--prefetch-rate", "64KiB/s"])
    with metfs.Client(m.socket, job="blocking") as c:
        assert c.pass_end().decision == "repeat"
        assert not c.status().next_ready
        t0 = time.monotonic()
        d = c.pass_end(block=True)
        waited = time.monotonic() - t0
        assert d.advanced and d.position == (0, 1) and d.passes_done == 0
        assert waited > 0.2, waited
        assert sorted(c.files().files) == m.view_files()


def test_after_shutdown_every_request_is_refused(real_mount: Callable[..., RealMount]) -> None:
    """Saving the position and unmounting may take seconds on a busy disk; a job must not
    train on meanwhile: every request from the shutdown on is refused, on any connection."""
    m = real_mount(per_class=4, mini_epochs=2, rf=2)
    with metfs.Client(m.socket) as c, metfs.Client(m.socket) as other:
        assert c.request({"op": "shutdown"})["shutting_down"] is True
        for _ in range(20):
            with pytest.raises(metfs.MetfsConnectionError) as e:
                other.status()
            assert e.value.code in ("shutting_down", "connection_failed", "connection_lost"), (
                e.value
            )
    # The daemon unmounts and exits on its own; teardown's `metfs umount` then finds nothing
    # left to do (it runs only while a mount or a daemon process remains).
    deadline = time.monotonic() + 60
    while (is_mounted(m.mountpoint) or daemon_pids(m.mountpoint)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not is_mounted(m.mountpoint) and not daemon_pids(m.mountpoint)
