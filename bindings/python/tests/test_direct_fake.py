"""Direct reads against the fake control socket: ``files`` with ``direct``, the lease the client
keeps (and takes again after a reconnection), ``release``, and the loaders' ``direct``.

The same against a real daemon on a real mount: ``test_daemon_direct.py``.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_daemon import FakeDaemon, wait_for
from training import keras_training, lightning_training, torch_training

import metfs


def _direct_requests(fake: FakeDaemon) -> list[bool]:
    """For every ``files`` received, whether it asked for direct paths."""
    return [r.get("direct") is True for r in fake.requests if r.get("op") == "files"]


def test_direct_files_name_the_slot_copies_and_take_a_lease(fake: FakeDaemon) -> None:
    with metfs.Client(fake.path) as c:
        plain = c.files()
        assert plain.direct_root is None and plain.direct_paths == ()
        assert plain.paths == plain.mount_paths and c.lease is None
        v = c.files(direct=True)
        assert fake.requests[-1]["direct"] is True
        assert v.direct_root == "/fake/cache/slots/g1" and c.lease == 1 == v.generation
        assert v.direct_paths == [os.path.join(v.direct_root, f) for f in v.files]
        # `paths` and iteration are what to open: the copies; `mount_paths` the mount's.
        assert list(v) == list(v.paths) == v.direct_paths
        assert v.mount_paths == [os.path.join("/fake/mnt", f) for f in v.files]
        assert fake.leases == {1: 1}


def test_the_lease_follows_the_view_until_released(fake: FakeDaemon) -> None:
    with metfs.Client(fake.path) as c:
        v = c.files(direct=True)
        # Unchanged: the view held comes back, still under the lease.
        assert c.files(v) is v and _direct_requests(fake) == [True, True]
        assert c.advance().advanced
        # The old view is retired and leased: status shows it draining.
        assert [(d["generation"], d["leases"]) for d in c.status()["draining"]] == [(1, 1)]
        # `direct=None` (the default) keeps asking with `direct` once a lease was taken, so the
        # lease moves to the new view instead of pinning the old one.
        w = c.files(v)
        assert w.generation == 2 and w.direct_root == fake.root_of(2) and c.lease == 2
        assert fake.leases == {2: 1} and c.status()["draining"] == []
        # `direct=False` asks for the mount's paths only; the lease stays where it is.
        m = c.files(w, direct=False)
        assert m.direct_root is None and m.paths == m.mount_paths == w.mount_paths
        assert list(m) == [os.path.join("/fake/mnt", f) for f in m.files]
        assert "direct" not in fake.requests[-1] and fake.leases == {2: 1} and c.lease == 2
        assert c.release() == 2
        assert fake.requests[-1] == {"v": 1, "op": "release"}
        assert fake.leases == {} and c.lease is None
        # Released: the next files are the mount's again.
        after = c.files(w)
        assert after.direct_root is None and "direct" not in fake.requests[-1]


def test_a_mount_view_asked_again_with_direct_gets_its_direct_paths(fake: FakeDaemon) -> None:
    with metfs.Client(fake.path) as c:
        v = c.files()
        d = c.files(v, direct=True)
        assert fake.requests[-1]["known_generation"] == v.generation
        assert d is not v and d.generation == v.generation and d.files is v.files
        assert d.direct_root == fake.root_of(v.generation) and c.lease == v.generation
        assert list(d.direct_paths) == [os.path.join(fake.root_of(1), f) for f in v.files]
        assert c.files(d, direct=True) is d


def test_release_without_the_lease_is_no_lease(fake: FakeDaemon) -> None:
    with metfs.Client(fake.path) as c:
        with pytest.raises(metfs.MetfsError) as e:
            c.release()
        assert e.value.code == "no_lease"
        c.files(direct=True)
        with pytest.raises(metfs.MetfsError) as e:
            c.release(generation=7)
        assert e.value.code == "no_lease" and "generation 1" in e.value.message
        # The lease on generation 1 is kept, and the client still asks with `direct`.
        assert c.lease == 1 and fake.leases == {1: 1}
        c.files()
        assert _direct_requests(fake)[-1] is True
        with pytest.raises(metfs.MetfsError) as e:
            c.release(generation=-1)
        assert e.value.code == "bad_request"
        assert c.release(generation=1) == 1 and fake.requests[-1]["generation"] == 1
        assert fake.leases == {} and c.lease is None


def test_a_reconnection_loses_the_lease_and_the_next_files_takes_it_again(
    fake: FakeDaemon,
) -> None:
    with metfs.Client(fake.path) as c:
        v = c.files(direct=True)
        fake.drop_connections()  # as the daemon does to a connection idle too long
        assert wait_for(lambda: fake.leases == {})
        time.sleep(0.05)
        # Any request reconnects; the new connection holds no lease.
        assert c.status().generation == 1
        assert c.lease is None and fake.leases == {}
        # The next files asks with `direct` again (and the generation held): the same view,
        # leased again.
        assert c.files(v) is v
        assert fake.requests[-1]["direct"] is True and fake.requests[-1]["known_generation"] == 1
        assert c.lease == 1 and fake.leases == {1: 1} and fake.hello_count == 2


def test_close_ends_the_lease(fake: FakeDaemon) -> None:
    c = metfs.Client(fake.path)
    c.files(direct=True)
    assert fake.leases == {1: 1}
    c.close()
    assert c.lease is None and wait_for(lambda: fake.leases == {})
    # A later request reconnects without taking a lease unless asked.
    assert c.files().direct_root is None and fake.leases == {}
    c.close()


def test_a_client_made_direct_asks_with_direct(fake: FakeDaemon) -> None:
    with metfs.Client(fake.path, direct=True) as c:
        assert c.direct and c.files().direct_root == fake.root_of(1)
        assert c.release() == 1
        # Its default stays direct after a release.
        assert c.files().direct_root == fake.root_of(1) and c.lease == 1
        assert c.files(direct=False).direct_root is None


def test_direct_refused_and_a_daemon_without_direct(
    fake: FakeDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    with metfs.Client(fake.path) as c:
        fake.fail_ops["files"] = "not_permitted"
        with pytest.raises(metfs.MetfsError) as e:
            c.files(direct=True)
        assert e.value.code == "not_permitted" and c.lease is None
        del fake.fail_ops["files"]
        # A daemon older than direct reads ignores the field and names no slot directory.
        monkeypatch.setattr(fake, "root_of", lambda generation: None)
        with pytest.raises(metfs.MetfsError) as e:
            c.files(direct=True)
        assert e.value.code == "bad_response" and "read through the mount" in e.value.message


def test_passes_direct_reads_the_slot_copies_and_lets_the_last_view_go(
    fake: FakeDaemon,
) -> None:
    with metfs.Client(fake.path) as c:
        run = metfs.passes(c, epochs=1, direct=True)
        for p in run:
            assert p.view is not None and p.view.direct_root == fake.root_of(p.generation)
            assert list(p.paths) == [os.path.join(fake.root_of(p.generation), f) for f in p.files]
            assert p.paths is p.view.paths is p.view.direct_paths
            assert p.mount_paths == [os.path.join(fake.mountpoint, f) for f in p.files]
            assert p.mount_paths is p.view.mount_paths
            # Only this pass's view is leased.
            assert fake.leases == {p.generation: 1} and c.lease == p.generation
        assert run.done and run.decisions[-1].advanced
        # The loop ended after an advance: the lease on the view it left is released.
        assert c.lease is None and fake.leases == {}
        assert fake.ops()[-1] == "release"
    assert all(_direct_requests(fake))
    # Without `direct` the loop reads the mount and never releases.
    with metfs.Client(fake.path) as c:
        for p in metfs.passes(c, epochs=1):
            assert p.view is not None and p.view.direct_root is None
            assert p.paths is p.view.paths and p.mount_paths is p.view.mount_paths
    assert fake.ops().count("release") == 1


@pytest.fixture
def direct_view(fake_view: FakeDaemon, tmp_path: Path) -> Iterator[FakeDaemon]:
    """``fake_view`` whose direct root is another path (a symlink) to the same files."""
    slot = tmp_path / "slot"
    slot.symlink_to(fake_view.mountpoint)
    fake_view.direct_root = str(slot)
    yield fake_view


def _check_direct(fake: FakeDaemon, per_pass: list[list[str]], passes: int) -> None:
    """Each pass read every file of its view once, through the direct root."""
    assert fake.direct_root is not None and len(per_pass) == passes
    positions = [(e, m) for e in range(3) for m in range(fake.mini_epochs) for _ in range(2)]
    for files, (e, m) in zip(per_pass, positions):
        assert all(f.startswith(fake.direct_root + "/") for f in files), files[:3]
        rel = Counter(os.path.relpath(f, fake.direct_root) for f in files)
        assert rel == Counter(fake.files_at(e, m)), (e, m)


def test_torch_met_train_direct_with_workers(direct_view: FakeDaemon) -> None:
    with metfs.Client(direct_view.path, job="torch") as c:
        out = torch_training(c, epochs=1, num_workers=2, direct=True)
        assert out["run"].done and c.lease is None
    _check_direct(direct_view, out["per_pass"], 6)
    assert direct_view.leases == {}


def test_keras_callback_direct(direct_view: FakeDaemon) -> None:
    with metfs.Client(direct_view.path, job="keras") as c:
        out = keras_training(c, epochs=1, direct=True)
        assert c.direct and out["callback"].done
        # Training ended after an advance: the lease on the view left went with it.
        assert c.lease is None and direct_view.leases == {}
    _check_direct(direct_view, out["per_pass"], 6)


def test_lightning_callback_direct(  # type: ignore[no-untyped-def]
    direct_view: FakeDaemon, tmp_path
) -> None:
    with metfs.Client(direct_view.path, job="lightning") as c:
        out = lightning_training(c, epochs=1, tmpdir=str(tmp_path), direct=True)
        assert c.direct and out["callback"].done
        assert c.lease is None and direct_view.leases == {}
    _check_direct(direct_view, out["per_pass"], 6)
