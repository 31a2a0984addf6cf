#!/usr/bin/env python3
"""Writes HDF5 test inputs with h5py and checks files staged by metfs against their sources.

h5py bundles its own HDF5 build, different from the system libhdf5 the Rust crate links, so
files written here and read back here exercise compatibility in both directions.

Commands:
  persample DIR                 per-sample files with labels (and bad ones), see `persample`
  containers DIR                container files (good and bad), see `containers`
  check SRC OUT ROWS_JSON       OUT holds exactly rows ROWS_JSON (a JSON list file) of SRC
  bench-make PATH MIB           a ~MIB MiB chunked float32 container for the benchmark
  bench-h5py SRC ROWS_JSON OUT  the h5py way of staging: fancy indexing, then write
  bench-rows N K SEED OUT       K random rows of N, ascending, as a JSON list
  bench-verify SRC OUT ROWS_JSON  spot-check a staged benchmark file (metfs_index, 256 rows)
"""

import json
import sys

import h5py
import numpy as np


def persample(d):
    """a: int dataset; b: string attribute; c: fixed-length bytes dataset; d: float32
    attribute; e: no label; f: label of shape (3,); g: bool dataset; h: nested dataset
    meta/label; notes.txt: not HDF5."""
    with h5py.File(f"{d}/a.h5", "w") as f:
        f["x"] = np.zeros((4, 4), "f4")
        f["label"] = np.int64(3)
    with h5py.File(f"{d}/b.h5", "w") as f:
        f["x"] = np.zeros((4, 4), "f4")
        f.attrs["label"] = "cat"
    with h5py.File(f"{d}/c.h5", "w") as f:
        f["label"] = np.bytes_(b"dog")
    with h5py.File(f"{d}/d.h5", "w") as f:
        f.attrs["label"] = np.float32(0.1)
    with h5py.File(f"{d}/e.h5", "w") as f:
        f["x"] = np.zeros(3)
    with h5py.File(f"{d}/f.h5", "w") as f:
        f["label"] = np.arange(3)
    with h5py.File(f"{d}/g.h5", "w") as f:
        f["label"] = np.bool_(True)
    with h5py.File(f"{d}/h.h5", "w") as f:
        f["meta/label"] = np.uint16(7)
        f.attrs["label"] = "not this one"
    with open(f"{d}/notes.txt", "w") as f:
        f.write("not an HDF5 file\n")


def write_container(path, n, seed):
    rng = np.random.default_rng(seed)
    with h5py.File(path, "w") as f:
        f.attrs["title"] = "test container"
        f.attrs["version"] = np.int32(2)
        f.attrs["mean"] = np.arange(3, dtype="f8")
        img = f.create_dataset(
            "images",
            data=rng.standard_normal((n, 8, 8), dtype="f4"),
            chunks=(16, 8, 8),
            compression="gzip",
            compression_opts=4,
            shuffle=True,
        )
        img.attrs["units"] = "px"
        img.attrs["scale"] = np.float32(0.5)
        lab = f.create_dataset(
            "labels", data=(np.arange(n) % 7).astype("i8"), chunks=(64,), compression="gzip"
        )
        lab.attrs["classes"] = 7
        f.create_dataset("rgb", data=rng.integers(0, 255, (n, 3), dtype="u1"))
        g = f.create_group("grp/sub")
        f["grp"].attrs["kind"] = "features"
        g.create_dataset("feat", data=rng.standard_normal((n, 5)), chunks=(100, 5), fillvalue=-1.0)
        f.create_dataset(
            "names",
            data=[f"sample-{i}" + "x" * (i % 13) for i in range(n)],
            dtype=h5py.string_dtype(),
            chunks=(128,),
        )
        f.create_dataset("fixed", data=np.array([b"r%05d" % i for i in range(n)], dtype="S8"))
        # Chunked across the trailing dimensions too (a row spans 4 chunks), uncompressed.
        f.create_dataset(
            "tiles", data=rng.standard_normal((n, 8, 8), dtype="f4"), chunks=(32, 4, 4)
        )
        f.create_dataset("be", data=np.arange(n, dtype=">i4"))
        pairs = np.zeros(n, dtype=[("a", "<i2"), ("b", "<f8")])
        pairs["a"], pairs["b"] = np.arange(n), np.arange(n) / 3
        f.create_dataset("pairs", data=pairs, chunks=(50,), compression="gzip", shuffle=True)
        f.create_dataset(
            "class_names", data=[f"class{i}" for i in range(7)], dtype=h5py.string_dtype()
        )
        f["meta_scalar"] = np.int64(42)


def containers(d):
    """multi.h5 (1003 rows) and second.h5 (257 rows): images float32 (N,8,8) gzip+shuffle
    chunked, labels int64 (N,) gzip, rgb uint8 (N,3) contiguous, grp/sub/feat float64 (N,5)
    chunked with a fill value, names vlen str (N,), fixed |S8 (N,), tiles float32 (N,8,8) in
    (32,4,4) chunks, be big-endian int32 (N,), pairs compound (N,) gzip; side datasets class_names
    (7,) and meta_scalar (); attributes on the root, a group and datasets.
    Bad ones: mismatch.h5 (a: 10 rows, b: 11), refs.h5 (references with a row per sample),
    label2d.h5 (labels of shape (N, 2)), lzf.h5 (lzf filter), fake.h5 (not HDF5),
    reserved.h5 (has metfs_index), tie.h5 (2 datasets of 5 rows, 2 of 6)."""
    write_container(f"{d}/multi.h5", 1003, 1)
    write_container(f"{d}/second.h5", 257, 2)
    with h5py.File(f"{d}/mismatch.h5", "w") as f:
        f["a"] = np.arange(10)
        f["b"] = np.arange(11)
    with h5py.File(f"{d}/refs.h5", "w") as f:
        f["x"] = np.arange(4)
        r = f.create_dataset("r", (4,), dtype=h5py.ref_dtype)
        for i in range(4):
            r[i] = f["x"].ref
    with h5py.File(f"{d}/label2d.h5", "w") as f:
        f["x"] = np.zeros((6, 2))
        f["labels"] = np.zeros((6, 2), "i4")
    with h5py.File(f"{d}/lzf.h5", "w") as f:
        f.create_dataset("x", data=np.arange(100.0), compression="lzf")
    with open(f"{d}/fake.h5", "wb") as f:
        f.write(b"\x89HDF\r\n\x1a\n" + b"\0" * 100)
    with h5py.File(f"{d}/reserved.h5", "w") as f:
        f["x"] = np.arange(4)
        f["metfs_index"] = np.arange(4)
    with h5py.File(f"{d}/tie.h5", "w") as f:
        f["a"] = np.arange(5)
        f["b"] = np.arange(5)
        f["c"] = np.arange(6)
        f["d"] = np.arange(6)


def attrs_equal(a, b, what):
    ka, kb = sorted(a.keys()), sorted(b.keys())
    assert ka == kb, f"{what}: attributes {ka} != {kb}"
    for k in ka:
        va, vb = a[k], b[k]
        assert np.array_equal(np.asarray(va), np.asarray(vb)), (
            f"{what}.attrs[{k}]: {va!r} != {vb!r}"
        )
        assert np.asarray(va).dtype == np.asarray(vb).dtype, f"{what}.attrs[{k}] dtype"


def check(src_path, out_path, rows_path):
    rows = np.asarray(json.load(open(rows_path)), dtype=np.int64)
    with h5py.File(src_path, "r") as src, h5py.File(out_path, "r") as out:
        idx = out["metfs_index"][:]
        assert idx.dtype == np.uint64, idx.dtype
        assert np.array_equal(idx, rows), f"metfs_index {idx[:10]}... != rows {rows[:10]}..."
        attrs_equal(src.attrs, out.attrs, "/")
        datasets, groups = [], []
        src.visititems(
            lambda name, o: (datasets if isinstance(o, h5py.Dataset) else groups).append(name)
        )
        for g in groups:
            assert g in out, f"group {g} missing"
            attrs_equal(src[g].attrs, out[g].attrs, g)
        # Row datasets: those whose first dimension is that of the largest group (as in
        # the default rule); the tests here use files where that is unambiguous.
        n = src["labels"].shape[0] if "labels" in src else None
        checked = 0
        for name in datasets:
            s = src[name]
            assert name in out, f"dataset {name} missing"
            o = out[name]
            assert o.dtype == s.dtype, f"{name}: dtype {o.dtype} != {s.dtype}"
            attrs_equal(s.attrs, o.attrs, name)
            if s.shape and s.shape[0] == n:
                assert o.shape == (len(rows),) + s.shape[1:], f"{name}: shape {o.shape}"
                want = s[:][rows] if len(rows) else s[:0]
                got = o[:]
                assert np.array_equal(got, want), f"{name}: rows differ"
                assert o.compression == s.compression, f"{name}: {o.compression} != {s.compression}"
                assert o.compression_opts == s.compression_opts, f"{name}: compression opts"
                assert o.shuffle == s.shuffle, f"{name}: shuffle"
                if s.chunks:
                    assert o.chunks is not None, f"{name}: not chunked"
                    assert o.chunks[1:] == s.chunks[1:], f"{name}: chunks {o.chunks}"
                    assert o.chunks[0] == min(s.chunks[0], max(len(rows), 1)), (
                        f"{name}: chunks {o.chunks}"
                    )
                    assert o.fillvalue == s.fillvalue, f"{name}: fill value"
                checked += 1
            else:
                assert np.array_equal(o[()], s[()]), f"side dataset {name} differs"
        assert checked > 0, "no row dataset checked"
    print(f"OK {checked} row datasets, {len(rows)} rows")


def bench_make(path, mib):
    """float32 (N, 128, 128) rows of 64 KiB, chunks of 8 rows (512 KiB), uncompressed: a
    typical image container."""
    row = 128 * 128 * 4
    n = (mib << 20) // row
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        d = f.create_dataset("images", (n, 128, 128), dtype="f4", chunks=(8, 128, 128))
        step = 1024
        for i in range(0, n, step):
            k = min(step, n - i)
            d[i : i + k] = rng.standard_normal((k, 128, 128), dtype="f4")
        f["labels"] = (np.arange(n) % 1000).astype("i8")
    print(n)


def bench_h5py(src_path, rows_path, out_path):
    rows = np.asarray(json.load(open(rows_path)), dtype=np.int64)
    with h5py.File(src_path, "r") as src, h5py.File(out_path, "w") as out:
        for name in ("images", "labels"):
            s = src[name]
            data = s[rows]  # fancy indexing: h5py's way of picking rows
            out.create_dataset(name, data=data, chunks=s.chunks, compression=s.compression)
        out["metfs_index"] = rows.astype("u8")


def bench_rows(n, k, seed, out_path):
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(n, k, replace=False))
    json.dump([int(r) for r in rows], open(out_path, "w"))


def bench_verify(src_path, out_path, rows_path):
    rows = np.asarray(json.load(open(rows_path)), dtype=np.int64)
    with h5py.File(src_path, "r") as src, h5py.File(out_path, "r") as out:
        assert np.array_equal(out["metfs_index"][:], rows), "metfs_index"
        assert out["images"].shape == (len(rows),) + src["images"].shape[1:]
        assert np.array_equal(out["labels"][:], src["labels"][:][rows]), "labels"
        pick = np.sort(
            np.random.default_rng(0).choice(len(rows), min(256, len(rows)), replace=False)
        )
        for i in pick:
            assert np.array_equal(out["images"][i], src["images"][rows[i]]), f"row {i}"
    print("OK")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {
        "persample": lambda: persample(*args),
        "containers": lambda: containers(*args),
        "check": lambda: check(*args),
        "bench-make": lambda: bench_make(args[0], int(args[1])),
        "bench-h5py": lambda: bench_h5py(*args),
        "bench-rows": lambda: bench_rows(int(args[0]), int(args[1]), int(args[2]), args[3]),
        "bench-verify": lambda: bench_verify(*args),
    }[cmd]()
