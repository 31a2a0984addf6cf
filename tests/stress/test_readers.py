"""Stress: many concurrent readers (threads and processes) through view switches on every read
path, with every byte read checked against the source, a deadline on every switch and drain,
the budget sampled every 10 ms, and exactly-once coverage of every epoch the switches cross."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from conftest import make_tree
from reader import merge, new_counters, start_burst, collect, start_threads, stop_readers
from stresslib import (
    DEADLINE_S,
    READERS,
    STRESS_DIR,
    SWITCHES,
    BudgetSampler,
    Ledger,
    StuckView,
    advance_wait,
    median,
    p_max,
    sha256_tree,
    wait_drained,
    write_result,
)

BUDGET = 8 << 20
# Threads that open one file all at once, besides the readers.
BURST = 8


@pytest.mark.parametrize("read_path", ["cached", "passthrough", "pread"])
def test_concurrent_readers_across_switches(mounts, tmp_path, read_path):
    src = tmp_path / "tier"
    # About four budget halves of data: every slot near its share of the budget.
    make_tree(src, n=240, seed=13, max_size=96 * 1024)
    hashes, _ = sha256_tree(src)
    hashes_file = tmp_path / "hashes.json"
    hashes_file.write_text(json.dumps(hashes))
    m = mounts(src, str(BUDGET), "--rf", "1", "--read-path", read_path)
    n_proc = READERS // 2
    n_thr = READERS - n_proc
    stop_file = tmp_path / "stop"
    switch_secs: list[float] = []
    result = {
        "read_path": read_path,
        "readers_threads": n_thr,
        "readers_processes": n_proc,
        "burst_threads": BURST,
        "switches": SWITCHES,
    }
    with BudgetSampler(m.cache, BUDGET) as budget:
        m.mount()
        st = m.status()
        assert st["read_path"] == read_path
        nm = st["mini_epochs"]
        ledger = Ledger(m, set(hashes))
        ledger.record()
        stop, threads, counters = start_threads(str(m.mountpoint), hashes, n_thr, seed=1000)
        burst_stop, burst_threads, burst = start_burst(str(m.mountpoint), hashes, BURST, seed=2000)
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(STRESS_DIR / "reader.py"),
                    str(m.mountpoint),
                    str(hashes_file),
                    str(tmp_path / f"reader-{i}.json"),
                    str(stop_file),
                    str(i),
                ]
            )
            for i in range(n_proc)
        ]
        stuck: StuckView | None = None
        try:
            for _ in range(SWITCHES):
                time.sleep(0.2)  # let the readers into the current view before it switches
                secs, _ = advance_wait(m)
                switch_secs.append(secs)
                ledger.record()
        except StuckView as e:
            stuck = e
        finally:
            burst_stop.halt()
            stop_readers(stop, threads + burst_threads, procs, stop_file, DEADLINE_S)
        if stuck is not None:
            # Does the view drain once nobody reads any more?
            result.update(
                {
                    "stuck_after_switches": len(switch_secs),
                    "stuck": str(stuck)[:6000],
                    "switch_s_median": median(switch_secs),
                }
            )
            try:
                result["drain_after_stop_s"] = wait_drained(m)
            except StuckView as e:
                result["still_stuck_after_stop"] = str(e)[:6000]
            write_result(f"readers-{read_path}", result)
            raise stuck
        total = new_counters()
        for c in counters:
            merge(total, c)
        burst_opens = burst["files"]
        merge(total, burst)
        for i in range(n_proc):
            out = tmp_path / f"reader-{i}.json"
            assert out.exists(), f"reader process {i} wrote no result"
            merge(total, json.loads(out.read_text()))
        assert not any(t.is_alive() for t in threads + burst_threads), (
            "a reader thread is stuck in a read"
        )
        result["drain_after_stop_s"] = wait_drained(m)
        st = m.status()
    result.update(budget.summary())
    result.update(
        {
            "burst_same_file_opens": burst_opens,
            "files_read": total["files"],
            "bytes_checked": total["bytes"],
            "enoent_across_switch": total["enoent"],
            "errors": total["errors"],
            "mismatches": len(total["mismatches"]),
            "switch_s_median": median(switch_secs),
            "switch_s_max": p_max(switch_secs),
            "generation": st["generation"],
            "daemon_opens": st["daemon_opens"],
        }
    )
    write_result(f"readers-{read_path}", result)
    assert not total["mismatches"], f"bytes read differ from the source: {total['mismatches']}"
    assert not total["unknown"], f"files read that are not in the source: {total['unknown']}"
    # ESTALE at open is allowed below, whether a reader thread or a burst thread met it.
    stale_kinds = ("open ESTALE", "burst open ESTALE")
    others = {k: v for k, v in total["errors"].items() if k not in stale_kinds}
    assert not others, f"read errors other than ENOENT across a switch: {total['errors']}"
    assert total["files"] > 0
    views_union = set().union(*ledger.views.values())
    assert total["read"] <= views_union, "a file was read that no view listed"
    budget.check()
    assert st["generation"] == 1 + SWITCHES
    if SWITCHES >= nm - 1:
        result.update(ledger.check(nm, st["failed_samples"]))
        write_result(f"readers-{read_path}", result)
    # A lookup that misses in a retired view answers ESTALE, so the kernel walks the path again
    # in the current view (docs/READ_PATHS.md); only a walk that straddles a second switch gets
    # ESTALE back. With a switch every 0.2 s that was at most 4 in 2 x 10^5 opens on a quiet
    # machine; on a loaded one walks are slower and straddle more (2 in 12,881 in the test
    # command's brief run under stress-ng); in training, switches are minutes apart. Were the
    # retry not happening, every open racing a switch would fail: thousands, not a few, so 1 in
    # 2,000 still tells them apart. Burst threads open paths from a walk up to 50 turns old,
    # which can be several switches old: the same by-design ESTALE, against the same allowance.
    estale = sum(total["errors"].get(k, 0) for k in stale_kinds)
    assert estale * 2_000 <= max(total["files"], 10_000), (
        f"ESTALE on {estale} of {total['files']} opens"
    )


def test_direct_readers_across_switches(mounts, tmp_path):
    """Readers of the slot files themselves (`files` with `direct`), each under its connection's
    lease, across switches: every file listed is there and whole (no error of any kind, ENOENT
    included, since the lease keeps the slot), every byte matches the source, the budget holds
    with leases delaying evictions, and each reader follows the view as it moves."""
    src = tmp_path / "tier"
    make_tree(src, n=240, seed=13, max_size=96 * 1024)
    hashes, _ = sha256_tree(src)
    hashes_file = tmp_path / "hashes.json"
    hashes_file.write_text(json.dumps(hashes))
    m = mounts(src, str(BUDGET), "--rf", "1")
    n_proc = READERS // 2
    n_thr = READERS - n_proc
    stop_file = tmp_path / "stop"
    switch_secs: list[float] = []
    leases_seen = 0
    result: dict = {
        "read_path": "direct",
        "readers_threads": n_thr,
        "readers_processes": n_proc,
        "switches": SWITCHES,
    }
    with BudgetSampler(m.cache, BUDGET) as budget:
        m.mount()
        ledger = Ledger(m, set(hashes))
        ledger.record()
        stop, threads, counters = start_threads(
            str(m.mountpoint), hashes, n_thr, seed=3000, direct_socket=m.socket
        )
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(STRESS_DIR / "reader.py"),
                    str(m.mountpoint),
                    str(hashes_file),
                    str(tmp_path / f"reader-{i}.json"),
                    str(stop_file),
                    str(4000 + i),
                    m.socket,
                ]
            )
            for i in range(n_proc)
        ]
        try:
            for _ in range(SWITCHES):
                time.sleep(0.2)
                secs, _ = advance_wait(m)
                switch_secs.append(secs)
                ledger.record()
                leases_seen = max(leases_seen, sum(d["leases"] for d in m.status()["draining"]))
        finally:
            stop_readers(stop, threads, procs, stop_file, DEADLINE_S)
        total = collect(counters, [tmp_path / f"reader-{i}.json" for i in range(n_proc)])
        assert not any(t.is_alive() for t in threads), "a direct reader thread is stuck"
        # Every reader is gone, and with it its connection and lease.
        result["drain_after_stop_s"] = wait_drained(m)
        st = m.status()
    result.update(budget.summary())
    result.update(
        {
            "files_read": total["files"],
            "bytes_checked": total["bytes"],
            "errors": total["errors"],
            "mismatches": len(total["mismatches"]),
            "views_followed": total["views"],
            "leases_on_retired_views_max": leases_seen,
            "switch_s_median": median(switch_secs),
            "switch_s_max": p_max(switch_secs),
            "generation": st["generation"],
        }
    )
    write_result("readers-direct", result)
    assert not total["mismatches"], f"bytes read differ from the source: {total['mismatches']}"
    assert not total["unknown"], f"files read that are not in the source: {total['unknown']}"
    assert not total["errors"], f"direct reads failed under a lease: {total['errors']}"
    assert total["files"] > 0
    assert total["read"] <= set().union(*ledger.views.values()), (
        "a file was read that no view listed"
    )
    # Each reader saw the first view; most of them saw several.
    assert total["views"] > READERS, total["views"]
    budget.check()
    assert st["generation"] == 1 + SWITCHES
    assert not st["draining"], st["draining"]
