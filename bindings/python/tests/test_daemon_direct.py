"""Direct reads against a real metfs daemon on a real FUSE mount: the view's files read from the
cache without FUSE, the lease that keeps a retired view's slot while a client reads it, and the
loaders (``passes``, ``MetDataset`` with ``DataLoader`` workers) reading direct paths across
switches. Runs as root and as an ordinary user (the daemon's own user may read its cache).
"""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Callable

import pytest
from realmount import RealMount

import metfs
from metfs.pathlist import PathList


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _draining(c: metfs.Client) -> dict[int, int]:
    """The retired views the daemon still holds: generation -> leases on it."""
    return {d["generation"]: d["leases"] for d in c.status()["draining"]}


def _wait_gone(c: metfs.Client, generation: int, timeout: float = 30.0) -> dict[int, int]:
    """Polls status until ``generation`` is no longer draining; returns the last draining."""
    end = time.monotonic() + timeout
    while True:
        draining = _draining(c)
        if generation not in draining or time.monotonic() > end:
            return draining
        time.sleep(0.05)


def test_direct_paths_hold_the_source_bytes(real_mount: Callable[..., RealMount]) -> None:
    m = real_mount(per_class=6, mini_epochs=3, rf=2)
    with metfs.Client(m.socket) as c:
        v = c.files(direct=True)
        assert v.direct_root is not None and os.path.isabs(v.direct_root)
        # The copies lie in the cache, never under the mount.
        cache = os.path.realpath(m.cache)
        assert os.path.realpath(v.direct_root).startswith(cache + os.sep), v.direct_root
        assert c.lease == v.generation and len(v) > 0
        assert isinstance(v.direct_paths, PathList) and v.paths is v.direct_paths
        assert sorted(v.files) == m.view_files()
        for rel, direct, mounted in zip(v.files, v.direct_paths, v.mount_paths, strict=True):
            assert direct == os.path.join(v.direct_root, rel)
            assert mounted == os.path.join(v.mountpoint, rel)
            data = _read(direct)
            assert data == _read(os.path.join(m.source, rel)) == _read(mounted), rel
        # A spawned worker gets the direct list by pickle.
        assert pickle.loads(pickle.dumps(v.direct_paths)) == v.direct_paths
        # Asked again while the view is the same: no list, the same view, still leased.
        assert c.files(v) is v and c.lease == v.generation
        assert c.release() == v.generation and c.lease is None


def test_a_lease_keeps_a_retired_slot_until_released_or_closed(
    real_mount: Callable[..., RealMount],
) -> None:
    m = real_mount(per_class=6, mini_epochs=3, rf=1)
    with metfs.Client(m.socket) as a, metfs.Client(m.socket) as b:
        with pytest.raises(metfs.MetfsError) as e:
            a.release()
        assert e.value.code == "no_lease", e.value
        va = a.files(direct=True)
        with pytest.raises(metfs.MetfsError) as e:
            a.release(generation=va.generation + 5)
        assert e.value.code == "no_lease" and str(va.generation) in e.value.message
        assert a.lease == va.generation
        # B advances: A's view retires, and A's lease (kept by the refused release) holds it.
        assert b.advance(wait=True).advanced
        st = b.status()
        assert st.generation == va.generation + 1
        assert _draining(b).get(va.generation) == 1, st.raw["draining"]
        assert st.cache_bytes is not None and st.budget_bytes is not None
        assert st.cache_bytes <= st.budget_bytes
        for rel, direct in zip(va.files, va.direct_paths, strict=True):
            assert _read(direct) == _read(os.path.join(m.source, rel)), rel
        # The release lets it go: the slot is evicted.
        assert a.release() == va.generation and a.lease is None
        assert va.generation not in _wait_gone(b, va.generation)

        # Closing the connection ends a lease as well.
        vb = a.files(direct=True)
        assert vb.generation == va.generation + 1 and a.lease == vb.generation
        assert b.advance(wait=True).advanced
        assert _draining(b).get(vb.generation) == 1
        a.close()
        assert vb.generation not in _wait_gone(b, vb.generation)
        # A closed client reconnects at its next request, without a lease.
        assert a.files().direct_root is None and a.lease is None


def test_passes_direct_with_loader_workers_reads_every_file_across_switches(
    real_mount: Callable[..., RealMount],
) -> None:
    import torch.utils.data

    from metfs.torch import MetDataset

    m = real_mount(per_class=6, mini_epochs=3, rf=1)
    source = {rel: _read(os.path.join(m.source, rel)) for rel in m.source_files}
    with metfs.Client(m.socket) as c:
        ds = MetDataset(c, lambda path: (path, _read(path)), direct=True)
        run = metfs.passes(c, epochs=2, block=True, direct=True)
        views = []
        for p in run:
            assert p.view is not None and p.view.direct_root is not None
            assert c.lease == p.generation
            ds.set_view(p.view)
            loader = torch.utils.data.DataLoader(
                ds, batch_size=4, num_workers=2, collate_fn=list, shuffle=True
            )
            read = dict(item for batch in loader for item in batch)
            root = p.view.direct_root + "/"
            assert sorted(read) == sorted(p.paths)
            for path, data in read.items():
                assert path.startswith(root) and data == source[path[len(root) :]], path
            views.append(p.generation)
        # One pass per mini-epoch (rf 1), each on a new view: 6 views, 5 switches between.
        assert run.done and len(set(views)) == len(views) == 6
        # The last decision advanced; the loop let the view it left go.
        assert c.lease is None
        assert _wait_gone(c, views[-1]) == {}


def test_met_dataset_direct_with_persistent_workers_follows_the_view(
    real_mount: Callable[..., RealMount],
) -> None:
    from metfs.torch import MetDataset, met_loader

    m = real_mount(per_class=6, mini_epochs=3, rf=4)
    source = {rel: _read(os.path.join(m.source, rel)) for rel in m.source_files}
    with metfs.Client(m.socket) as c, metfs.Client(m.socket) as other:
        ds = MetDataset(c, lambda path: (path, _read(path)), direct=True)
        loader = met_loader(
            ds, batch_size=5, num_workers=2, persistent_workers=True, collate_fn=list
        )
        generations = []
        for _ in range(4):
            read = dict(item for batch in loader for item in batch)
            view = ds.view  # refreshed by the sampler when the pass began
            assert view.direct_root is not None and c.lease == view.generation
            assert sorted(read) == sorted(view.direct_paths) and len(read) == len(view)
            root = view.direct_root + "/"
            for path, data in read.items():
                assert data == source[path[len(root) :]], path
            generations.append(view.generation)
            # Another client moves the view on; this one's lease keeps the old slot until
            # the next pass's refresh moves the lease.
            assert other.advance(wait=True).advanced
            assert _draining(other).get(view.generation) == 1
        assert generations == list(range(generations[0], generations[0] + 4))
