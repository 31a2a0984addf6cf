#!/usr/bin/env python3
"""Preprocessed mini-epochs against decoding in the reader, side by side in one run.

    python3 benches/transform_bench.py
    python3 benches/transform_bench.py --quick    # 16 JPEGs of 256x256, one repetition

A dataset of JPEGs (generated, reproducible: smooth colour fields with noise, 768x768,
quality 90) is read over one epoch of mini-epochs with rf = 4 passes each, two ways:

* ``reader``: the mount shows the JPEGs and the reader decodes and resizes each sample (PIL,
  to 224x224 RGB with LANCZOS) at every pass, the pipeline a job runs without MET's
  preprocessing;
* ``transform``: the mount runs the same decode-and-resize once per sample during staging
  (``--transform``, one worker, ``metfs.transform``) and the reader loads the staged array
  (``np.load``) at every pass.

Each run is timed from ``metfs mount`` to the end of the last pass (staging of the first
mini-epoch included, so the transform's cost is counted), samples/s = samples read over all
passes / that time. Runs alternate (reader, transform, ...) so machine noise hits both alike;
medians and the ratio are printed. Needs root (FUSE). METFS_BIN picks the binary (default
target/debug/metfs); METFS_BENCH_REPS (default 3), METFS_BENCH_FILES (default 240).
Needs Pillow (pip install Pillow) and numpy.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

import benchlib
from benchlib import med, rpc_ok

METFS = benchlib.metfs_bin()
REPS = int(os.environ.get("METFS_BENCH_REPS", "3"))
FILES = int(os.environ.get("METFS_BENCH_FILES", "240"))
RF = 4
MINI_EPOCHS = 4
SIDE = 768
OUT = 224

PREP = """
import io
import numpy as np
from PIL import Image
import metfs.transform

@metfs.transform.transform
def prep(data: bytes, path: str) -> bytes:
    img = Image.open(io.BytesIO(data)).convert("RGB").resize((224, 224), Image.LANCZOS)
    buf = io.BytesIO()
    np.save(buf, np.asarray(img))
    return buf.getvalue()
"""


def decode(data: bytes) -> np.ndarray[Any, np.dtype[np.uint8]]:
    img = Image.open(io.BytesIO(data)).convert("RGB").resize((OUT, OUT), Image.LANCZOS)
    return np.asarray(img)


def make_dataset(root: Path) -> int:
    rng = np.random.default_rng(1)
    yy, xx = np.mgrid[0:SIDE, 0:SIDE].astype(np.float32) / SIDE
    total = 0
    for i in range(FILES):
        a, b, c = rng.uniform(0, 6, 3)
        base = np.stack(
            [np.sin(a * xx + b * yy), np.cos(b * xx - c * yy), np.sin(c * (xx + yy))], -1
        )
        img = (
            ((base * 0.5 + 0.5) * 200 + rng.normal(0, 12, (SIDE, SIDE, 3)))
            .clip(0, 255)
            .astype(np.uint8)
        )
        p = root / f"class{i % 10}" / f"img{i:05d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img).save(p, quality=90)
        total += p.stat().st_size
    return total


def run(work: Path, src: Path, transform: bool, budget: str, growth: float) -> tuple[float, int]:
    """One epoch at rf = 4 from mount to the last pass: (seconds, samples read)."""
    mnt = work / "mnt"
    m = benchlib.Mount(
        src,
        work / "cache",
        mnt,
        metfs=METFS,
        env=benchlib.python_env(),
        budget=budget,
        rf=RF,
        history=work / "hist.json",
        compose="sequential",
        mini_epochs=MINI_EPOCHS,
    )
    if transform:
        m.settings.update(
            transform=f"python3 {work / 'prep.py'}", transform_workers=1, transform_growth=growth
        )
    m.prepare(fresh=True)
    sock = m.socket
    t0 = time.perf_counter()
    m.mount()
    read = 0
    try:
        nm = rpc_ok(sock, {"op": "status"})["mini_epochs"]
        for k in range(nm):
            files = rpc_ok(sock, {"op": "files"})["files"]
            for p in range(RF):
                for rel in files:
                    data = (mnt / rel).read_bytes()
                    arr = np.load(io.BytesIO(data)) if transform else decode(data)
                    assert arr.shape == (OUT, OUT, 3)
                    read += 1
                if k + 1 < nm or p + 1 < RF:
                    # After the rf-th pass, wait for the next mini-epoch if it is not staged.
                    r = rpc_ok(sock, {"op": "pass_end", "block": True})
                    want = "advance" if p + 1 == RF else "repeat"
                    assert r["decision"] == want, r
        secs = time.perf_counter() - t0
        failed = rpc_ok(sock, {"op": "status"}).get("transform_failed")
        assert not failed, f"{failed} samples failed to transform"
    finally:
        m.close()
    return secs, read


def main() -> int:
    global REPS, FILES, SIDE
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="16 JPEGs of 256x256, one repetition")
    if ap.parse_args().quick:
        REPS, FILES, SIDE = 1, 16, 256
    benchlib.build()
    with tempfile.TemporaryDirectory(prefix="metfs-transform-bench-") as d:
        work = Path(d)
        src = work / "src"
        size = make_dataset(src)
        (work / "prep.py").write_text(PREP)
        # The same plan on both sides: MINI_EPOCHS mini-epochs, in a budget that holds two of
        # the transformed ones (each sample planned at `growth` times its JPEG, which covers
        # its array) with room to spare, plus metadata.
        smallest = min(p.stat().st_size for p in src.rglob("*.jpg"))
        npy = OUT * OUT * 3 + 128  # an .npy header is 128 bytes
        growth = float(np.ceil(2 * npy / smallest) / 2)
        budget = f"{int(2 * size * growth / MINI_EPOCHS * 1.5) // 1024 + 8192}KiB"
        print(
            f"dataset: {FILES} JPEGs {SIDE}x{SIDE}, {size / 2**20:.1f} MiB; rf = {RF}; "
            f"{MINI_EPOCHS} mini-epochs; transform growth {growth}; budget {budget}",
            flush=True,
        )
        results: dict[str, list[float]] = {"reader": [], "transform": []}
        for rep in range(REPS):
            for name in results:
                secs, read = run(work, src, name == "transform", budget, growth)
                results[name].append(read / secs)
                print(
                    f"rep {rep} {name:9s} {read} samples in {secs:6.2f} s = {read / secs:7.1f} samples/s",
                    flush=True,
                )
        m = {k: med(v) for k, v in results.items()}
        print(
            f"median samples/s: reader decodes every pass {m['reader']:.1f}, "
            f"--transform {m['transform']:.1f}, ratio {benchlib.ratio(m['transform'], m['reader'])}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
