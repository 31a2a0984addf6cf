"""Fixtures: a fake control socket for unit tests, a real metfs mount for integration tests."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))
sys.path.insert(0, HERE)
# The repository's tests/ for mountlib, the one mount fixture of every test and benchmark.
sys.path.append(os.path.join(HERE, "..", "..", "..", "tests"))

os.environ.setdefault("KERAS_BACKEND", "torch")

from fake_daemon import FakeDaemon
from realmount import RealMount


@pytest.fixture
def fake(tmp_path) -> Iterator[FakeDaemon]:  # type: ignore[no-untyped-def]
    """A fake daemon (3 mini-epochs, rf 2, 4 files each) on a fresh socket."""
    d = tempfile.mkdtemp(prefix="metfs-fake")
    daemon = FakeDaemon(os.path.join(d, "s.sock"))
    try:
        yield daemon
    finally:
        daemon.close()
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def real_mount(tmp_path) -> Iterator[Callable[..., RealMount]]:  # type: ignore[no-untyped-def]
    """Factory of real mounts: ``real_mount(mini_epochs=3, rf=2, ...)`` mounts and returns one.

    Every mount made is unmounted at teardown, also when the test failed; teardown then fails
    the test if ``metfs umount`` did not exit 0 or left a mount or daemon behind.
    """
    mounts: list[RealMount] = []

    def make(**kwargs) -> RealMount:  # type: ignore[no-untyped-def]
        root = tempfile.mkdtemp(prefix="metfs-it", dir=str(tmp_path))
        m = RealMount(root, **kwargs)
        mounts.append(m)
        m.mount()
        return m

    try:
        yield make
    finally:
        problems = []
        for m in mounts:
            m.close()
            if m.mount_ok and m.umount_result is not None and m.umount_result[0] != 0:
                problems.append(f"metfs umount {m.mountpoint} failed: {m.umount_result}")
            problems.extend(m.leftovers)
        if problems:
            pytest.fail("cleanup: " + "; ".join(problems), pytrace=False)


@pytest.fixture
def fake_view(tmp_path) -> Iterator[FakeDaemon]:  # type: ignore[no-untyped-def]
    """A fake daemon whose views are real files under a directory (no FUSE).

    3 mini-epochs of 24, 31 and 17 digit samples (classes 0 and 1), rf 2; the files of epochs
    0-2 exist.
    """
    import numpy as np
    from realmount import dataset_module

    ds = dataset_module()
    from sklearn.datasets import load_digits

    digits = load_digits()
    root = tmp_path / "view"
    d = tempfile.mkdtemp(prefix="metfs-fakeview")
    daemon = FakeDaemon(os.path.join(d, "s.sock"), files_per=[24, 31, 17], mountpoint=str(root))
    for epoch in range(3):
        for mini in range(daemon.mini_epochs):
            for i, rel in enumerate(daemon.files_at(epoch, mini)):
                path = root / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                cls = ds.label_of(str(path))
                img = digits.images[digits.target == cls][(epoch * 7 + mini * 3 + i) % 50]
                np.save(path, img.astype(np.float32))
    try:
        yield daemon
    finally:
        daemon.close()
        shutil.rmtree(d, ignore_errors=True)
