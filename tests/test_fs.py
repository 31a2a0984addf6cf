"""End-to-end tests of the FUSE view under load: retired views drain while many readers read
across switches, concurrent opens, and quiet answers to requests a read-only fs does not serve."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from conftest import make_tree, wait_for


def reader_loop(mnt: Path, stop: threading.Event, errors: list[str]) -> None:
    """Reads every file of the view, again and again, as a data loader's worker does."""
    while not stop.is_set():
        try:
            for dirpath, _, names in os.walk(mnt):
                for n in names:
                    if stop.is_set():
                        return
                    try:
                        with open(os.path.join(dirpath, n), "rb") as f:
                            f.read()
                    except (FileNotFoundError, OSError) as e:
                        # A file of the old view may vanish between listing and open.
                        if getattr(e, "errno", None) not in (2, 116):
                            errors.append(f"{n}: {e}")
        except OSError as e:
            if e.errno not in (2, 116):
                errors.append(str(e))


@pytest.mark.parametrize("layout", ["flat", "classes"])
def test_retired_views_drain_under_64_readers(mounts, tmp_path, layout):
    src = tmp_path / "tier"
    if layout == "flat":
        # Every sample at the root: each root entry is a file, the race-prone case.
        src.mkdir()
        for i in range(400):
            (src / f"s{i:04d}.bin").write_bytes(os.urandom(2048 + i))
    else:
        make_tree(src, n=400, max_size=8 * 1024)
    m = mounts(src, "2MiB", "--rf", "1000", "--compose", "sequential", "--read-path", "cached")
    m.mount()
    assert m.status()["read_path"] == "cached"
    stop = threading.Event()
    errors: list[str] = []
    threads = [threading.Thread(target=reader_loop, args=(m.mountpoint, stop, errors), daemon=True)
               for _ in range(64)]
    for t in threads:
        t.start()
    try:
        for i in range(8):
            try:
                r = m.rpc({"op": "advance", "wait": True}, timeout=30)
            except TimeoutError:
                raise AssertionError(f"advance {i} hangs: {m.status()}")
            assert r["ok"], r
            time.sleep(0.3)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not errors, errors[:5]
    st = m.status()
    assert st["generation"] >= 9, st

    def drained() -> bool:
        s = m.status()
        return s["draining_slots"] == 0 and s["next_ready"]

    try:
        wait_for(drained, timeout=20, what="retired views to drain once readers stopped")
    except AssertionError:
        raise AssertionError(f"stuck: {m.status()}")
