"""Stress: `kill -9` of the daemon at random points of staging (the very first one included),
switching and draining. After each kill a remount must serve a correct view within the budget
and fetch from the tier only what was not complete in the cache at the kill."""

from __future__ import annotations

import hashlib
import zlib
import os
import random
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from conftest import is_mounted, make_tree
from stresslib import (
    DEADLINE_S,
    KILLS,
    BudgetSampler,
    Ledger,
    advance_wait,
    median,
    p_max,
    sha256_tree,
    wait_ready,
    write_result,
)

BUDGET = 6 << 20
PHASES = ["first-staging", "staging", "switching", "draining"]


def slot_name(epoch: int, mini_epoch: int) -> str:
    return f"e{epoch:06d}-m{mini_epoch:05d}"


def complete_files(cache: Path) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """(slot, relative path) of every file in a slot directory, as two sets: the copies the stager
    finished (made read-only once whole, before they are journaled), and the copies it was still
    writing, which only a slot not yet complete may hold (its copies are written in place, and
    nothing reads it before it is complete)."""
    done, writing = set(), set()
    slots = cache / "slots"
    if slots.is_dir():
        for d in slots.iterdir():
            if d.is_dir():
                for p in d.rglob("*"):
                    if p.is_file():
                        key = (d.name, str(p.relative_to(d)))
                        (done if p.stat().st_mode & 0o777 == 0o400 else writing).add(key)
    return done, writing


def journaled(cache: Path, slot: str, ids: list[str], src: Path) -> set[str]:
    """The samples slot `slot`'s journal vouches for (a `failed` line withdraws one). Sample ids
    are the catalog's: its paths in byte order. Each line's CRC is checked against the source,
    so a wrong id-to-path mapping fails here instead of passing unseen."""
    journal = cache / "slots" / f"{slot}.journal"
    out: set[str] = set()
    if not journal.exists():
        return out
    for line in journal.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "failed":
            out.discard(ids[int(parts[1])])
        elif len(parts) == 2 and parts[0].isdigit():
            rel = ids[int(parts[0])]
            assert zlib.crc32((src / rel).read_bytes()) == int(parts[1], 16), (
                f"{slot}: journal line {line!r} is not {rel}"
            )
            out.add(rel)
    return out


def slot_is_complete(cache: Path, slot: str) -> bool:
    journal = cache / "slots" / f"{slot}.journal"
    return journal.exists() and "complete" in journal.read_text().split("\n")


def wait_pid_gone(pid: int, timeout: float = 10) -> None:
    t = time.monotonic()
    while Path(f"/proc/{pid}").exists() and time.monotonic() - t < timeout:
        time.sleep(0.01)


def test_kill9_at_random_points_then_remount(mounts, tmp_path):
    src = tmp_path / "tier"
    make_tree(src, n=160, seed=21, max_size=48 * 1024)
    hashes, sizes = sha256_tree(src)
    ids = sorted(hashes, key=lambda p: p.encode())
    # A paced tier, so that a kill lands inside staging rather than between slots.
    m = mounts(
        src,
        str(BUDGET),
        "--rf",
        "1",
        "--mini-epochs",
        "4",
        "--compose",
        "sequential",
        "--prefetch-rate",
        "4MiB/s",
    )
    rng = random.Random(int(os.environ.get("METFS_STRESS_SEED", "1")))
    remount_s: list[float] = []
    unfinished_left = 0
    ready_s: list[float] = []
    refetched_total = 0
    left_total = 0
    phases_done: dict[str, int] = {}
    ledger = Ledger(m, set(hashes))
    with BudgetSampler(m.cache, BUDGET) as budget:
        for trial in range(KILLS):
            phase = PHASES[trial % len(PHASES)] if trial < len(PHASES) else rng.choice(PHASES)
            if phase == "first-staging":
                if is_mounted(m.mountpoint):
                    m.umount()
                for p in list(m.cache.iterdir()):
                    shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
                proc = m.spawn(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                lock = m.cache / "metfs.lock"
                t = time.monotonic()
                while (
                    not (lock.exists() and lock.read_text().strip()) and time.monotonic() - t < 30
                ):
                    time.sleep(0.005)
                time.sleep(rng.uniform(0, 0.3))
                pid = m.pid()
                os.kill(pid, signal.SIGKILL)
                proc.wait(timeout=DEADLINE_S)
            else:
                if not is_mounted(m.mountpoint):
                    m.mount()
                ledger.record()
                pid = m.pid()
                if phase == "staging":
                    advance_wait(m)
                    ledger.record()
                    time.sleep(rng.uniform(0, 0.3))
                    os.kill(pid, signal.SIGKILL)
                elif phase == "switching":
                    wait_ready(m)
                    th = threading.Thread(
                        target=lambda: _quiet(
                            lambda: m.rpc({"op": "advance", "wait": True}, timeout=30)
                        ),
                        daemon=True,
                    )
                    th.start()
                    time.sleep(rng.uniform(0, 0.02))
                    os.kill(pid, signal.SIGKILL)
                    th.join(timeout=30)
                else:  # draining: a handle held open on the old view across the switch
                    rel = next(f for f in sorted(m.files()["files"]) if sizes[f] > 0)
                    fh = open(m.mountpoint / rel, "rb")
                    fh.read(10)
                    advance_wait(m)
                    ledger.record()
                    time.sleep(rng.uniform(0, 0.1))
                    os.kill(pid, signal.SIGKILL)
                    _quiet(fh.close)
            wait_pid_gone(pid)
            phases_done[phase] = phases_done.get(phase, 0) + 1
            # Every copy the stager finished is whole and equal to the source; a copy it was still
            # writing is only ever in a slot that is not complete.
            complete, writing = complete_files(m.cache)
            vouched = {
                (slot, rel)
                for slot in {x for x, _ in complete | writing}
                for rel in journaled(m.cache, slot, ids, src)
            }
            for slot, rel in complete:
                data = (m.cache / "slots" / slot / rel).read_bytes()
                assert hashlib.sha256(data).hexdigest() == hashes[rel], (
                    f"trial {trial} ({phase}): {slot}/{rel} is partial or wrong"
                )
            for slot, rel in writing:
                assert not slot_is_complete(m.cache, slot), (
                    f"trial {trial} ({phase}): {slot}/{rel} is unfinished in a complete slot"
                )
            unfinished_left = max(unfinished_left, len(writing))
            # Remount over the dead mount: a correct view, then the successor staged.
            t = time.monotonic()
            m.mount()
            remount_s.append(time.monotonic() - t)
            f = ledger.record()
            for rel in f["files"]:
                got = hashlib.sha256((m.mountpoint / rel).read_bytes()).hexdigest()
                assert got == hashes[rel], (
                    f"trial {trial} ({phase}): {rel} differs from the source after the remount"
                )
            listed = {
                str(p.relative_to(m.mountpoint)) for p in m.mountpoint.rglob("*") if p.is_file()
            }
            assert listed == set(f["files"]), (
                f"trial {trial} ({phase}): the listing differs from the view's files"
            )
            ready_s.append(wait_ready(m))
            st = m.status()
            # What the tier had to give: the files of the current and next slots that were not
            # complete in the cache at the kill.
            need = set()
            for slot in {slot_name(st["epoch"], st["mini_epoch"]), st["staging"].get("slot")}:
                if slot and (m.cache / "slots" / slot).is_dir():
                    need |= {
                        (slot, str(p.relative_to(m.cache / "slots" / slot)))
                        for p in (m.cache / "slots" / slot).rglob("*")
                        if p.is_file()
                    }
            # A copy finished but not yet journaled (its batch not yet durable) is fetched again.
            left = sum(sizes[rel] for slot, rel in need - (complete & vouched))
            refetched = st["tier_bytes_read"]
            refetched_total += refetched
            left_total += left
            assert refetched <= left, (
                f"trial {trial} ({phase}): the remount fetched {refetched} bytes from the tier, "
                f"but only {left} bytes were left to stage"
            )
        if is_mounted(m.mountpoint):
            st = m.status()
    write_result(
        "kill9",
        {
            "trials": KILLS,
            "phases": phases_done,
            "remount_s_median": median(remount_s),
            "remount_s_max": p_max(remount_s),
            "next_ready_s_median": median(ready_s),
            "tier_bytes_refetched": refetched_total,
            "tier_bytes_left_at_kills": left_total,
            "unfinished_copies_max": unfinished_left,
            **budget.summary(),
        },
    )
    budget.check()
    if KILLS >= 20:
        ledger.check(st["mini_epochs"], st["failed_samples"], require_epochs=1)


def _quiet(fn):
    try:
        return fn()
    except Exception:  # noqa: BLE001 - the daemon is killed under it on purpose
        return None
