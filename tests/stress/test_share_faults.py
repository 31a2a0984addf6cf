"""Stress: a shared mount (`--share`) whose staggered jobs switch views continuously while
reader threads walk every job's directory, the tier goes away for a few seconds and the cache
disk fills up. Each job must still read its dataset exactly once per epoch with the source's
bytes, no reader may ever see wrong bytes, the daemon stays up, and the budget holds at every
sample of the cache's size on disk, while kept slots are trimmed sample by sample to make room
(`Store::room_for`)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Self

from conftest import is_mounted, wait_for
from stresslib import OUTAGE_S, READERS, BudgetSampler, write_result
from test_dds_mount import make_dataset
from test_faults import alive, fill
from test_share import check_epochs, finish, start_job

BUDGET = 4 << 20


class JobReaders:
    """Threads that walk the shared mount's job directories and read every file they find,
    checking its bytes against the source. A file that vanishes under them (its view retired by
    a switch mid-walk) is an expected miss; wrong bytes never are."""

    def __init__(self, mnt: Path, digests: dict[str, str], n: int) -> None:
        self.mnt, self.digests = mnt, digests
        self.ok = self.misses = 0
        self.wrong: list[str] = []
        self.other_errors: list[str] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(n)]

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                jobs = os.listdir(self.mnt)
            except OSError:
                jobs = []
            if not jobs:
                time.sleep(0.01)
            for job in jobs:
                for dirpath, _, files in os.walk(self.mnt / job):
                    for name in files:
                        p = Path(dirpath) / name
                        rel = str(p.relative_to(self.mnt / job))
                        try:
                            data = p.read_bytes()
                        except OSError as e:
                            with self.lock:
                                if e.errno in (errno.ENOENT, errno.ESTALE):
                                    self.misses += 1
                                else:
                                    self.other_errors.append(f"{rel}: {e}")
                            continue
                        good = hashlib.sha256(data).hexdigest() == self.digests.get(rel)
                        with self.lock:
                            if good:
                                self.ok += 1
                            else:
                                self.wrong.append(rel)

    def __enter__(self) -> Self:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)


class DiskSampler(threading.Thread):
    """Samples the cache file system's used bytes (`statvfs`) while nothing else writes to it:
    unlike a walk of the cache directory, this sees files deleted but still held open, which
    take space all the same."""

    def __init__(self, disk: Path) -> None:
        super().__init__(daemon=True)
        self.disk = disk
        self.max = 0
        self.paused = threading.Event()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            if not self.paused.is_set():
                st = os.statvfs(self.disk)
                used = (st.f_blocks - st.f_bfree) * st.f_frsize
                if not self.paused.is_set():
                    self.max = max(self.max, used)
            time.sleep(0.02)


def test_shared_store_under_readers_outage_and_full_disk(mounts: Any, tmp_path: Path) -> None:
    src = tmp_path / "src"
    digests = make_dataset(src, 400)
    dpath = tmp_path / "digests.json"
    dpath.write_text(json.dumps(digests))
    disk = tmp_path / "small-disk"
    disk.mkdir()
    # A filesystem a little bigger than the budget, filled up by another process later.
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(disk)], check=True)
    cache = disk / "cache"
    cache.mkdir()
    # Shares for 4 jobs, 3 jobs: the fourth share keeps retired slots, trimmed to make room.
    m = mounts(
        src,
        str(BUDGET),
        "--share",
        "--share-jobs",
        "4",
        "--rf",
        "1",
        "--rf-policy",
        "fixed",
        "--share-idle-secs",
        "120",
        name="s",
        cache=cache,
    )
    away = tmp_path / "src-away"
    readers = min(READERS, 16)
    disk_use = DiskSampler(disk)
    disk_use.start()
    try:
        with BudgetSampler(m.cache, BUDGET) as budget:
            m.mount()
            pid = m.pid()
            with JobReaders(m.mountpoint, digests, readers) as rd:
                # The jobs train until the faults are over (the stop file), whatever an epoch
                # takes: on an idle machine a job's three epochs took 3 s, and the jobs had left
                # before the last one joined.
                stop_file = tmp_path / "stop"
                jobs = {"a": start_job(m, tmp_path, "a", dpath, epochs=3, stop=stop_file)}
                for name in ("b", "c"):
                    wait_for(
                        lambda: (
                            len(m.status()["jobs"] or []) == len(jobs)
                            and all((j["mini_epoch"] or 0) >= 2 for j in m.status()["jobs"])
                        ),
                        # Generous: a busy machine (a disk-bound neighbour, another build)
                        # stages these views several times slower than an idle one.
                        360,
                        "the jobs a few views in",
                    )
                    jobs[name] = start_job(m, tmp_path, name, dpath, epochs=2, stop=stop_file)
                wait_for(lambda: len(m.status()["jobs"] or []) == 3, 360, "three jobs")
                # The tier goes away while the jobs switch (each switch stages a view).
                errors_seen: set[str] = set()

                def note_errors(secs: float) -> None:
                    # What `status` reports while a fault lasts.
                    t = time.monotonic()
                    while time.monotonic() - t < secs:
                        e = m.status()["last_error"]
                        if e:
                            errors_seen.add(e[:200])
                        time.sleep(0.1)

                def views() -> dict[str, tuple[int, int]]:
                    # Each job's position (jobs between views report no mini-epoch of theirs).
                    return {
                        j["name"]: (j["epoch"], j["mini_epoch"])
                        for j in m.status()["jobs"] or []
                        if j["mini_epoch"] is not None
                    }

                v0 = views()
                src.rename(away)
                try:
                    note_errors(OUTAGE_S)
                    v1 = views()
                finally:
                    away.rename(src)
                assert alive(pid), f"the daemon died in the tier outage; log:\n{m.log()}"
                # The same time with the tier back, for comparison: the views the jobs switched
                # to during the outage are those staged before it (then they make bonus passes).
                time.sleep(OUTAGE_S)
                v2 = views()
                # Then the cache disk fills up.
                filler = disk / "filler"
                disk_use.paused.set()
                filled = fill(filler)
                try:
                    note_errors(OUTAGE_S)
                finally:
                    filler.unlink()
                    disk_use.paused.clear()
                assert alive(pid), f"the daemon died on a full disk; log:\n{m.log()}"
                stop_file.touch()
                results = {n: finish(p, tmp_path, n, m, timeout=600) for n, p in jobs.items()}
            st = m.status()
        # An outage is reported once in the log (not per sample), and in `status` if it outlasts
        # the stager's retries.
        warnings = [
            line[-300:] for line in m.log().splitlines() if "WARN" in line or "ERROR" in line
        ]
        result = {
            "log_warnings": warnings[-8:],
            "positions_before_outage": v0,
            "positions_after_outage": v1,
            "positions_3s_later": v2,
            "readers": readers,
            "reads_checked": rd.ok,
            "reads_missed_in_switches": rd.misses,
            "wrong_bytes": len(rd.wrong),
            "other_errors": rd.other_errors[:5],
            "outage_s": OUTAGE_S,
            "filler_bytes": filled,
            "errors_reported": sorted(errors_seen),
            "trimmed_samples": st["trimmed_samples"],
            "tier_bytes_read": st["tier_bytes_read"],
            "reused_bytes": st["reused_bytes"],
            **budget.summary(),
        }
        disk_use.stop.set()
        disk_use.join()
        result["disk_used_max_bytes"] = disk_use.max
        write_result("share-faults", result)
        assert not rd.wrong, f"readers saw wrong bytes: {rd.wrong[:5]}"
        assert not rd.other_errors, rd.other_errors[:5]
        assert rd.ok > 0, "the readers read nothing"
        for n, res in results.items():
            check_epochs(res, set(digests), 3 if n == "a" else 2, at_least=True)
        assert st["trimmed_samples"] > 0, "no kept slot was trimmed"
        budget.check()
        # Deleted files still held open (a descriptor cache) would show here and not above.
        assert disk_use.max <= BUDGET, (
            f"the cache's file system held {disk_use.max} bytes, over the budget of {BUDGET}"
        )
    finally:
        disk_use.stop.set()
        if is_mounted(m.mountpoint):
            subprocess.run(
                [m.bin, "umount", str(m.mountpoint)], capture_output=True, timeout=120, check=False
            )
        if is_mounted(m.mountpoint):
            subprocess.run(["umount", "-l", str(m.mountpoint)], capture_output=True, check=False)
        try:
            os.kill(m.pid(), signal.SIGKILL)
        except (OSError, ValueError):
            pass
        subprocess.run(["umount", "-l", str(disk)], capture_output=True, check=False)
