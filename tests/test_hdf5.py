"""End-to-end tests of HDF5 datasets through a real mount, with files written and read back by
h5py (a different HDF5 build from the one metfs links): container mode (rows of container
files split into mini-epochs) and per-sample files labelled from a scalar dataset."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import h5py
import numpy as np

from conftest import Tier


def write_containers(src: Path) -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(5)
    out = {}
    src.mkdir(parents=True)
    for name, n in (("train.h5", 203), ("sub/extra.h5", 57)):
        p = src / name
        p.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "images": rng.standard_normal((n, 8, 8)).astype("f4"),
            "labels": (np.arange(n) % 4).astype("i8"),
            "rgb": rng.integers(0, 255, (n, 3)).astype("u1"),
        }
        with h5py.File(p, "w") as f:
            f.attrs["description"] = "metfs test container"
            f.create_dataset(
                "images", data=data["images"], chunks=(16, 8, 8), compression="gzip", shuffle=True
            )
            f["images"].attrs["units"] = "sigma"
            f.create_dataset("labels", data=data["labels"], chunks=(32,), compression="gzip")
            f.create_dataset("rgb", data=data["rgb"])
            f["classes"] = np.array([b"a", b"b", b"c", b"d"])
        out[name] = data
    return out


def test_container_mode_rows_per_mini_epoch(mounts, tmp_path):
    src = tmp_path / "tier"
    data = write_containers(src)
    m = mounts(
        src,
        "12MiB",
        "--hdf5-container",
        "--label-dataset",
        "labels",
        "--compose",
        "stratified",
        "--mini-epochs",
        "4",
        "--rf",
        "1",
    )
    m.mount()
    seen: dict[str, Counter] = {name: Counter() for name in data}
    mtimes: dict[str, set[int]] = {name: set() for name in data}
    for k in range(4):
        for name in data:
            mtimes[name].add(os.stat(m.mountpoint / name).st_mtime_ns)
        f = m.files()
        assert (f["epoch"], f["mini_epoch"]) == (0, k)
        assert set(f["files"]) == set(data), f["files"]
        per_class = Counter()
        for name, d in data.items():
            with h5py.File(m.mountpoint / name, "r") as h:
                idx = h["metfs_index"][:]
                assert list(idx) == sorted(idx), "rows keep their source order"
                seen[name].update(idx.tolist())
                assert h["images"].dtype == np.float32 and h["images"].shape[1:] == (8, 8)
                assert h["images"].compression == "gzip" and h["images"].shuffle
                assert h["images"].attrs["units"] == "sigma"
                assert h.attrs["description"] == "metfs test container"
                assert h["rgb"].dtype == np.uint8
                np.testing.assert_array_equal(h["images"][:], d["images"][idx])
                np.testing.assert_array_equal(h["labels"][:], d["labels"][idx])
                np.testing.assert_array_equal(h["rgb"][:], d["rgb"][idx])
                assert list(h["classes"][:]) == [b"a", b"b", b"c", b"d"], "side datasets are copied"
                per_class.update(h["labels"][:].tolist())
        # Stratified: each mini-epoch holds every class in proportion (within one per class and file).
        total = sum(len(d["labels"]) for d in data.values())
        for c in range(4):
            ideal = total / 4 / 4
            assert abs(per_class[c] - ideal) <= 2 + 1, (k, per_class)
        m.wait_next_ready()
        assert m.pass_end()["decision"] == "advance"
    for name, d in data.items():
        n = len(d["labels"])
        assert seen[name] == Counter(range(n)), f"every row of {name} exactly once per epoch"
        # A container's content changes with every mini-epoch, and so does its mtime, so that
        # make, rsync and caches see the change.
        assert len(mtimes[name]) == 4, (name, mtimes[name])


def test_per_sample_files_labelled_from_hdf5(mounts, tmp_path):
    src = tmp_path / "tier"
    src.mkdir()
    for i in range(60):
        with h5py.File(src / f"s{i:03d}.h5", "w") as f:
            f["x"] = np.full((16, 16), i, "f4")
            f["label"] = np.int64(i % 3)
    m = mounts(
        src, "8MiB", "--label-hdf5", "label", "--compose", "stratified", "--mini-epochs", "3"
    )
    m.mount()
    files = m.files()["files"]
    labels = Counter()
    for rel in files:
        with h5py.File(m.mountpoint / rel, "r") as f:
            labels[int(f["label"][()])] += 1
            assert f["x"][0, 0] == int(rel[1:4])
    # Stratified by the HDF5 label: each class within one sample of its ideal 20/3 share.
    assert len(files) == 20 and all(abs(labels[c] - 20 / 3) < 1 for c in range(3)), labels
    # A file without the label: a clear error naming it, before anything is staged.
    with h5py.File(src / "unlabelled.h5", "w") as f:
        f["x"] = np.zeros(3)
    m2 = mounts(src, "8MiB", "--label-hdf5", "label", name="bad")
    r = m2.mount(check=False)
    assert r.returncode != 0 and "unlabelled.h5" in r.stderr, r.stderr


def test_container_bad_input(mounts, tmp_path):
    def expect_error(src: Path, *args: str, name: str, must: tuple[str, ...]) -> None:
        m = mounts(src, "12MiB", "--hdf5-container", *args, name=name)
        r = m.mount(check=False)
        assert r.returncode != 0, name
        for s in must:
            assert s in r.stderr, (name, r.stderr)
        assert not list((m.cache / "slots").glob("*/*")), "nothing is staged"

    notes = tmp_path / "not-hdf5"
    notes.mkdir()
    (notes / "data.h5").write_bytes(b"this is not an HDF5 file")
    expect_error(notes, name="nothdf5", must=("data.h5",))

    mixed = tmp_path / "mixed"
    mixed.mkdir()
    with h5py.File(mixed / "m.h5", "w") as f:
        f["a"] = np.zeros((10, 2))
        f["b"] = np.zeros((12, 2))
    expect_error(mixed, "--hdf5-datasets", "a,b", name="dims", must=("m.h5",))
    expect_error(mixed, "--hdf5-datasets", "a,zzz", name="missing", must=("m.h5", "zzz"))

    m = mounts(
        Tier("s3", "s3://metfs/x", ["--endpoint", "http://127.0.0.1:9", "--allow-http"], None),
        "12MiB",
        "--hdf5-container",
        name="s3",
    )
    r = m.mount(check=False)
    assert r.returncode != 0 and "POSIX" in r.stderr, r.stderr
