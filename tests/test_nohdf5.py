"""A metfs built without the `hdf5` cargo feature (`cargo build -p metfs --no-default-features`):
it links no libhdf5, serves ordinary datasets as before, and refuses the HDF5 settings with an
error naming the feature. The test command builds that binary, copies it to target/nohdf5-bin
and passes it in METFS_NOHDF5_BIN."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import is_mounted, make_tree

NOHDF5 = os.environ.get("METFS_NOHDF5_BIN")
pytestmark = pytest.mark.skipif(
    not NOHDF5,
    reason="METFS_NOHDF5_BIN unset: build with `cargo build -p metfs --no-default-features`",
)


@pytest.fixture
def metfs() -> str:
    """The `mounts` fixture mounts with this binary instead of the default build."""
    assert NOHDF5
    return NOHDF5


def linked(binary: str) -> str:
    return subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout


def test_links_no_libhdf5(metfs):
    assert "libhdf5" not in linked(metfs)
    # The default build does link it: what this test tells apart.
    default = os.environ.get(
        "METFS_BIN", str(Path(__file__).resolve().parents[1] / "target/debug/metfs")
    )
    if os.path.exists(default):
        assert "libhdf5" in linked(default)


def test_hdf5_settings_name_the_feature(mounts, tmp_path):
    src = tmp_path / "tier"
    src.mkdir()
    (src / "a.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(100))
    for name, args, key in (
        ("container", ["--hdf5-container"], "hdf5_container"),
        ("label", ["--label-hdf5", "label"], "label_hdf5"),
    ):
        m = mounts(src, "8MiB", *args, name=name)
        r = m.mount(check=False)
        assert r.returncode != 0, (name, r.stdout)
        assert "built without the `hdf5` feature" in r.stderr and key in r.stderr, (name, r.stderr)
        assert not is_mounted(m.mountpoint), name


def test_ordinary_dataset_mounts(mounts, tmp_path):
    src = tmp_path / "tier"
    files = make_tree(src, n=40)
    m = mounts(src, "4MiB", "--mini-epochs", "2")
    m.mount()
    shown = m.files()["files"]
    assert shown, "the first mini-epoch is served"
    for rel in shown:
        assert (m.mountpoint / rel).read_bytes() == files[rel]
    m.umount()
