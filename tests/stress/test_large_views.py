"""Stress at scale: many readers through switches of views of many small files (issue 31:
500,000 files per view in `scripts/stress.sh --view-files 500000`; a few thousand in the test
command's brief run).

The source's files are generated from their index (`reader.content`), so every byte a reader gets can
be checked without a table of a million digests in each of 32 reader processes. The cache lives
on a tmpfs of its own, one and a half budgets in size, whose used bytes are sampled every 10 ms:
walking a cache of a million files for its footprint would take seconds per sample. The
guarantees are the readers test's: no byte differs from the source, no error but ENOENT across
a switch (and the rare by-design ESTALE), no stuck switch or drain, the budget held.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from reader import (
    PER_DIR,
    GeneratedDigests,
    collect,
    content,
    new_counters,
    rel_of,
    stop_readers,
    stream_loop,
)
from stresslib import (
    DEADLINE_S,
    READERS,
    STRESS_DIR,
    advance_wait,
    env_int,
    median,
    p_max,
    wait_drained,
    write_result,
)

# Files per view: the source holds two views' worth.
VIEW_FILES = env_int("METFS_STRESS_VIEW_FILES", 4_000)
SWITCHES = env_int("METFS_STRESS_LARGE_SWITCHES", 3)
# Each file's footprint on the tmpfs: one page (1-4 KiB files).
FOOTPRINT = 4096


def make_source(root: Path, n: int) -> None:
    for d in range((n + PER_DIR - 1) // PER_DIR):
        (root / f"d{d:05d}").mkdir(parents=True, exist_ok=True)
    for i in range(n):
        with open(root / rel_of(i), "wb") as f:
            f.write(content(i))


class UsedSampler(threading.Thread):
    """Samples the used bytes of the cache's own file system every 10 ms."""

    def __init__(self, path: Path, budget: int) -> None:
        super().__init__(daemon=True)
        self.path, self.budget = path, budget
        self.max = self.samples = 0
        self.over: list[tuple[float, int]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        while not self._halt.is_set():
            st = os.statvfs(self.path)
            used = (st.f_blocks - st.f_bfree) * st.f_frsize
            self.samples += 1
            self.max = max(self.max, used)
            if used > self.budget and len(self.over) < 100:
                self.over.append((round(time.monotonic() - t0, 3), used))
            time.sleep(0.01)

    def __enter__(self) -> UsedSampler:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._halt.set()
        self.join()


@pytest.fixture
def cache_fs(tmp_path: Path):
    if os.geteuid() != 0:
        pytest.skip("needs root: the cache gets a tmpfs of its own")
    d = tmp_path / "cachefs"
    d.mkdir()
    budget = 2 * VIEW_FILES * FOOTPRINT * 5 // 4 + (64 << 20)
    size = budget * 3 // 2
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "metfs-stress", str(d)], check=True
    )
    try:
        yield d, budget
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def test_readers_across_switches_of_large_views(cache_fs, mounts, tmp_path):
    # cache_fs first: its tmpfs is set up before, and unmounted after, the mount of metfs.
    cache_dir, budget = cache_fs
    src = tmp_path / "tier"
    t = time.monotonic()
    make_source(src, 2 * VIEW_FILES)
    made_s = time.monotonic() - t
    m = mounts(
        src,
        str(budget),
        "--mini-epochs",
        "2",
        "--rf",
        "1",
        "--read-path",
        "cached",
        cache=cache_dir / "cache",
    )
    digests = GeneratedDigests()
    n_proc = READERS // 2
    n_thr = READERS - n_proc
    stop_file = tmp_path / "stop"
    # Staging a view of half a million files takes minutes with 64 readers on two cores.
    deadline = max(DEADLINE_S, VIEW_FILES / 500)
    # Readers read a view while it is current: 1 s at the test command's size, 10 s at 500,000.
    dwell = max(1.0, VIEW_FILES / 50_000)
    switch_secs: list[float] = []
    result: dict[str, Any] = {
        "view_files": VIEW_FILES,
        "readers_threads": n_thr,
        "readers_processes": n_proc,
        "switches": SWITCHES,
        "dwell_s": dwell,
        "source_made_s": round(made_s, 1),
    }
    with UsedSampler(cache_dir, budget) as used:
        t = time.monotonic()
        m.mount()
        result["mount_s"] = round(time.monotonic() - t, 1)
        st = m.status()
        assert st["view_files"] >= VIEW_FILES * 9 // 10, st["view_files"]
        stop = threading.Event()
        counters = [new_counters() for _ in range(n_thr)]
        threads = [
            threading.Thread(
                target=stream_loop,
                args=(str(m.mountpoint), digests, stop.is_set, 3000 + i, counters[i]),
                daemon=True,
            )
            for i in range(n_thr)
        ]
        for th in threads:
            th.start()
        outs = [tmp_path / f"reader-{i}.json" for i in range(n_proc)]
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(STRESS_DIR / "reader.py"),
                    str(m.mountpoint),
                    "generated",
                    str(outs[i]),
                    str(stop_file),
                    str(i),
                ]
            )
            for i in range(n_proc)
        ]
        try:
            for _ in range(SWITCHES):
                time.sleep(dwell)  # let the readers into the current view before it switches
                secs, _ = advance_wait(m, deadline)
                switch_secs.append(secs)
        finally:
            stop_readers(stop, threads, procs, stop_file, deadline)
        total = collect(counters, outs)
        assert not any(th.is_alive() for th in threads), "a reader thread is stuck in a read"
        result["drain_after_stop_s"] = wait_drained(m, deadline)
        st = m.status()
    result.update(
        {
            "files_read": total["files"],
            "bytes_checked": total["bytes"],
            "enoent_across_switch": total["enoent"],
            "errors": total["errors"],
            "mismatches": len(total["mismatches"]),
            "switch_s_median": median(switch_secs),
            "switch_s_max": p_max(switch_secs),
            "generation": st["generation"],
            "budget": budget,
            "used_max": used.max,
            "used_samples": used.samples,
            "over_budget": used.over[:5],
        }
    )
    write_result("large-views", result)
    assert not total["mismatches"], f"bytes read differ from the source: {total['mismatches']}"
    assert not total["unknown"], f"files read that are not in the source: {total['unknown']}"
    stale_kinds = ("open ESTALE",)
    others = {k: v for k, v in total["errors"].items() if k not in stale_kinds}
    assert not others, f"read errors other than ENOENT across a switch: {total['errors']}"
    # The by-design ESTALE of a walk that straddles two switches (see test_readers.py).
    estale = sum(total["errors"].get(k, 0) for k in stale_kinds)
    assert estale * 2_000 <= max(total["files"], 10_000), (
        f"ESTALE on {estale} of {total['files']} opens"
    )
    assert total["files"] > 0
    assert st["generation"] == 1 + SWITCHES
    assert not used.over, (
        f"the cache's file system held more than the budget of {budget}: {used.over[:5]}"
    )
