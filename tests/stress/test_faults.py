"""Stress: tier and node faults while an epoch is staged and served: a source outage (the
source directory renamed away for a few seconds), S3 connection resets and 503 Slow Down through
the fault-injecting proxy, a cache disk that fills up, and faults that last (S3 objects behind
the proxy, POSIX files behind `faultfs` answering EIO, for several mini-epochs). Across the
epoch every sample must appear in exactly one view: a transient fault never drops a sample, silently or not. The daemon
stays up, the current view keeps serving correct bytes, and the budget holds throughout."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

from conftest import ROOT, Mount, Tier, free_port, is_mounted, make_tree
from reader import collect, start_threads, stop_readers
from stresslib import (
    DEADLINE_S,
    OUTAGE_S,
    READERS,
    STRESS_DIR,
    BudgetSampler,
    FaultFs,
    Ledger,
    advance_wait,
    median,
    p_max,
    sha256_tree,
    wait_ready,
    write_result,
)

BUDGET = 6 << 20


def check_view(m: Mount, hashes: dict[str, str]) -> int:
    """Reads the whole current view and checks every file against the source; returns files read."""
    f = m.files()
    for rel in f["files"]:
        got = hashlib.sha256((m.mountpoint / rel).read_bytes()).hexdigest()
        assert got == hashes[rel], f"{rel} differs from the source"
    return len(f["files"])


def run_epoch(m: Mount, ledger: Ledger, hashes: dict[str, str]) -> list[float]:
    """Switches view by view until epoch 1 is reached, reading every view; returns the waits."""
    waits = []
    while True:
        f = ledger.record()
        check_view(m, hashes)
        if f["epoch"] >= 1:
            return waits
        waits.append(wait_ready(m))
        advance_wait(m)


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text()


def test_source_outage_drops_no_sample(mounts, tmp_path):
    src = tmp_path / "tier"
    make_tree(src, n=200, seed=31, max_size=32 * 1024)
    hashes, _ = sha256_tree(src)
    m = mounts(src, str(BUDGET), "--rf", "1", "--mini-epochs", "4", "--prefetch-rate", "1MiB/s")
    away = tmp_path / "tier-away"
    with BudgetSampler(m.cache, BUDGET) as budget:
        m.mount()
        pid = m.pid()
        ledger = Ledger(m, set(hashes))
        # The source goes away while the next mini-epoch is being staged.
        os.rename(src, away)
        try:
            t = time.monotonic()
            errors_seen = set()
            while time.monotonic() - t < OUTAGE_S:
                check_view(m, hashes)  # the current view keeps serving
                st = m.status()
                if st["last_error"]:
                    errors_seen.add(st["last_error"][:200])
                time.sleep(0.2)
        finally:
            os.rename(away, src)
        assert alive(pid), "the daemon died during the outage"
        run_epoch(m, ledger, hashes)
        st = m.status()
    # An outage is reported once in the log (not per sample), and in `status` if it outlasts the
    # retries and fails the slot.
    warnings = [line[-300:] for line in m.log().splitlines() if "WARN" in line or "ERROR" in line]
    result = {
        "outage_s": OUTAGE_S,
        "errors_reported_during_outage": sorted(errors_seen),
        "log_warnings": warnings[-5:],
        **budget.summary(),
    }
    try:
        result.update(ledger.check(st["mini_epochs"], st["failed_samples"]))
    finally:
        result["failed_samples"] = st["failed_samples"][:10]
        result["failed_samples_count"] = len(st["failed_samples"])
        write_result("fault-outage", result)
    budget.check()


def test_s3_resets_and_slowdowns_drop_no_sample(mounts, garage, tmp_path):
    local = tmp_path / "local"
    make_tree(local, n=150, seed=41, max_size=32 * 1024)
    hashes, _ = sha256_tree(local)
    prefix = f"st{abs(hash(str(tmp_path))) % 10**8}"
    garage.upload(local, prefix)
    stats = tmp_path / "proxy.json"
    port = free_port()
    target = garage.endpoint.split("//", 1)[1]
    # Samples are at most 32 KiB: a reset armed within the next 16 KiB lands inside most
    # responses. (Armed further out, it waits for later responses on the same connection, which
    # a pooled client may never send, and a run can end with no reset at all.)
    proxy = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "tests" / "faultproxy.py"),
            "--target",
            target,
            "--port",
            str(port),
            "--seed",
            "11",
            "--slowdown",
            "0.1",
            "--reset",
            "0.1",
            "--reset-within",
            "16384",
            "--max-seconds",
            "600",
            "--stats",
            str(stats),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proxy.stdout.readline().startswith("listening")
        args = ["--endpoint", f"http://127.0.0.1:{port}", "--region", "garage", "--allow-http"]
        m = mounts(
            Tier("s3", f"s3://metfs/{prefix}", args, garage.env),
            str(BUDGET),
            "--rf",
            "1",
            "--mini-epochs",
            "4",
        )
        with BudgetSampler(m.cache, BUDGET) as budget:
            m.mount()
            ledger = Ledger(m, set(hashes))
            run_epoch(m, ledger, hashes)
            st = m.status()
        counts = json.loads(stats.read_text())
        result = {"proxy": counts, **budget.summary()}
        try:
            result.update(ledger.check(st["mini_epochs"], st["failed_samples"]))
        finally:
            result["failed_samples_count"] = len(st["failed_samples"])
            result["failed_samples"] = st["failed_samples"][:10]
            write_result("fault-s3", result)
        assert counts["slowdowns"] > 0 and counts["resets"] > 0, counts
        budget.check()
    finally:
        proxy.send_signal(signal.SIGTERM)
        proxy.wait(timeout=10)


def fill(path: Path) -> int:
    """Writes to `path` until the filesystem is full; returns the bytes written."""
    n = 0
    chunk = b"\0" * 65536
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                n += f.write(chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                break
        # Also the last partial blocks.
        for size in (4096, 512, 1):
            while True:
                try:
                    n += f.write(b"\0" * size)
                except OSError:
                    break
    return n


def test_cache_disk_full_drops_no_sample(mounts, tmp_path):
    src = tmp_path / "tier"
    make_tree(src, n=200, seed=51, max_size=32 * 1024)
    hashes, _ = sha256_tree(src)
    disk = tmp_path / "small-disk"
    disk.mkdir()
    # A filesystem bigger than the budget, filled up by another process while metfs stages.
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)], check=True)
    cache = disk / "cache"
    cache.mkdir()
    m = mounts(
        src,
        str(BUDGET),
        "--rf",
        "1",
        "--mini-epochs",
        "4",
        "--prefetch-rate",
        "1MiB/s",
        cache=cache,
    )
    try:
        with BudgetSampler(m.cache, BUDGET) as budget:
            m.mount()
            pid = m.pid()
            ledger = Ledger(m, set(hashes))
            filler = disk / "filler"
            filled = fill(filler)
            try:
                t = time.monotonic()
                errors_seen = set()
                m.rpc({"op": "advance", "wait": False}, timeout=30)
                while time.monotonic() - t < OUTAGE_S:
                    try:
                        check_view(m, hashes)
                    except OSError as e:
                        raise AssertionError(
                            f"the view stopped serving on a full disk ({e}); daemon alive: "
                            f"{alive(pid)}; log:\n{m.log()}"
                        ) from e
                    st = m.status()
                    if st["last_error"]:
                        errors_seen.add(st["last_error"][:200])
                    time.sleep(0.2)
            finally:
                filler.unlink()
            assert alive(pid), "the daemon died on a full disk"
            run_epoch(m, ledger, hashes)
            st = m.status()
        result = {
            "filler_bytes": filled,
            "full_s": OUTAGE_S,
            "errors_reported_while_full": sorted(errors_seen),
            **budget.summary(),
        }
        try:
            result.update(ledger.check(st["mini_epochs"], st["failed_samples"]))
        finally:
            result["failed_samples_count"] = len(st["failed_samples"])
            result["failed_samples"] = st["failed_samples"][:10]
            write_result("fault-disk-full", result)
        budget.check()
    finally:
        if is_mounted(m.mountpoint):
            subprocess.run([m.bin, "umount", str(m.mountpoint)], capture_output=True, timeout=120)
        if is_mounted(m.mountpoint):
            subprocess.run(["umount", "-l", str(m.mountpoint)], capture_output=True)
        try:
            os.kill(m.pid(), signal.SIGKILL)
        except (OSError, ValueError):
            pass
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_s3_dead_keys_are_deferred_not_waited_on(mounts, garage, tmp_path):
    """A fault that lasts: eight objects answer 503 (a dead replica) for two switches' worth
    of staging, through the proxy. Past the defer bound the views keep advancing without them;
    `status` counts and names them; once the objects answer again each comes back in a later
    view with its bytes; every other sample of epoch 0 is read exactly once; the budget holds."""
    local = tmp_path / "local"
    make_tree(local, n=150, seed=43, max_size=32 * 1024)
    hashes, _ = sha256_tree(local)
    prefix = f"sd{abs(hash(str(tmp_path))) % 10**8}"
    garage.upload(local, prefix)
    # ASCII names, spread over the dataset; the request path carries them percent-encoded.
    plain = sorted(k for k in hashes if k.isascii())
    dead = plain[3::13][:8]
    assert len(dead) == 8, plain
    dead_file = tmp_path / "dead-keys"
    dead_file.write_text("".join(f"{urllib.parse.quote(k)}\n" for k in dead))
    stats = tmp_path / "proxy.json"
    port = free_port()
    target = garage.endpoint.split("//", 1)[1]
    proxy = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "tests" / "faultproxy.py"),
            *("--target", target, "--port", str(port), "--slowdown", "0", "--reset", "0"),
            *("--max-seconds", "600", "--stats", str(stats), "--dead-keys", str(dead_file)),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proxy.stdout.readline().startswith("listening")
        args = ["--endpoint", f"http://127.0.0.1:{port}", "--region", "garage", "--allow-http"]
        # The S3 client's own retries of one request, short: the test's bounds are the
        # stager's (a second of retries, deferring after two of failures).
        config = tmp_path / "s3-retries.toml"
        config.write_text("[s3.retry]\nmax_retries = 2\nretry_timeout_ms = 1000\n")
        m = mounts(
            Tier("s3", f"s3://metfs/{prefix}", args, garage.env),
            str(BUDGET),
            *("--rf", "1", "--mini-epochs", "4", "--config", str(config)),
            *("--stager-retry-secs", "1", "--stager-defer-after-secs", "2"),
        )
        seen: dict[str, int] = {}
        came_back: dict[str, int] = {}
        deferred_max, switches, t_repaired = 0, 0, None
        with BudgetSampler(m.cache, BUDGET) as budget:
            m.mount()
            while True:
                f = m.files()
                check_view(m, hashes)
                st = m.status()
                deferred_max = max(deferred_max, st["deferred_samples"])
                for rel in f["files"]:
                    if rel in dead:
                        came_back[rel] = came_back.get(rel, 0) + 1
                    elif f["epoch"] == 0:
                        seen[rel] = seen.get(rel, 0) + 1
                if switches == 2 and t_repaired is None:
                    dead_file.write_text("")  # repaired
                    t_repaired = time.monotonic()
                # A sample deferred again while still dead counts as a deferral twice and as
                # recovered once: done when nothing is carried after the repair.
                if f["epoch"] >= 1 and t_repaired is not None and st["deferred_samples"] == 0:
                    break
                assert switches < 12, (
                    "the dead keys never came back: "
                    f"{ {k: st[k] for k in ('deferred_samples', 'deferrals', 'recovered_samples')} } "
                    f"{came_back} {st['failed_samples'][:10]}"
                )
                wait_ready(m)
                advance_wait(m)
                switches += 1
            st = m.status()
        counts = json.loads(stats.read_text())
        result = {
            "proxy": counts,
            "dead_keys": len(dead),
            "deferred_max": deferred_max,
            "deferrals": st["deferrals"],
            "recovered": st["recovered_samples"],
            "still_deferred": st["deferred_samples"],
            "switches": switches,
            "wrong_bytes": 0,
            **budget.summary(),
        }
        write_result("fault-dead-keys", result)
        assert counts["dead_key_503s"] > 0, counts
        assert st["deferred_samples"] == 0, st
        assert st["deferrals"] >= st["recovered_samples"] >= 1, st
        others = {k for k in hashes if k not in dead}
        assert set(seen) == others and all(n == 1 for n in seen.values()), "epoch 0 read once"
        deferred = {d for d in dead if came_back.get(d)}
        assert len(deferred) == len(dead), f"every dead key came back: {came_back}"
        assert not any(f["path"] in dead for f in st["failed_samples"]), st["failed_samples"]
        budget.check()
    finally:
        proxy.send_signal(signal.SIGTERM)
        proxy.wait(timeout=10)


def start_process_readers(mnt: Path, hashes: dict[str, str], tmp: Path, n: int) -> list:
    """`n` reader processes (tests/stress/reader.py) of the mount, each checking every file it
    reads against `hashes`, until `tmp/stop` exists."""
    hashes_file = tmp / "hashes.json"
    hashes_file.write_text(json.dumps(hashes))
    return [
        subprocess.Popen(
            [sys.executable, str(STRESS_DIR / "reader.py"), str(mnt), str(hashes_file)]
            + [str(tmp / f"reader-{i}.json"), str(tmp / "stop"), str(5000 + i)]
        )
        for i in range(n)
    ]


def test_posix_dead_files_are_deferred_not_waited_on(mounts, tmp_path):
    """A fault that lasts on a POSIX tier (a Lustre OST down): eight files of the source answer
    EIO to open and read through `faultfs`, a real FUSE file system under the source path, until
    every one has been deferred and the view has advanced at least twice; then the fault ends.
    Readers (half threads, half processes) read the views all along. Past the defer bound the
    views keep advancing without the dead files and never show one; `status` defers exactly the
    dead files and recovers each once; every other sample of epoch 0 is read exactly once; each
    dead file comes back whole in a later view; no reader meets an error or a wrong byte; the
    budget holds."""
    t0 = time.monotonic()
    src = tmp_path / "tier"
    make_tree(src, n=150, seed=47, max_size=32 * 1024)
    hashes, sizes = sha256_tree(src)
    # Spread over the dataset, non-empty (an empty sample is never opened), some with spaces
    # and non-ASCII names: the control file lists them as UTF-8 bytes.
    dead = [k for k in sorted(hashes) if sizes[k] > 0][3::13][:8]
    assert len(dead) == 8, dead
    control = tmp_path / "dead-files"
    control.write_text("".join(f"{k}\n" for k in dead))
    with FaultFs(src, tmp_path / "ost", control, tmp_path / "faultfs.json") as ffs:
        m = mounts(
            ffs.mnt,
            str(BUDGET),
            *("--rf", "1", "--mini-epochs", "4"),
            *("--stager-retry-secs", "1", "--stager-defer-after-secs", "2"),
        )
        try:
            result, budget = run_dead_files(m, hashes, dead, control, tmp_path)
        finally:
            m.close()
        counts = ffs.counts()
    result.update(faultfs=counts, duration_s=round(time.monotonic() - t0, 1))
    write_result("fault-dead-files", result)
    check_dead_files(result, dead)
    budget.check()
    assert counts.get("eio_opens", 0) + counts.get("eio_reads", 0) > 0, counts


def run_dead_files(
    m: Mount, hashes: dict[str, str], dead: list[str], control: Path, tmp: Path
) -> tuple[dict, BudgetSampler]:
    """Mounts `m`, switches view by view with readers running until the fault has ended and
    nothing is carried in epoch 1, and returns what was seen (checked by `check_dead_files`)
    and the budget's samples."""
    seen: dict[str, int] = {}
    came_back: dict[str, int] = {}
    back_after: dict[str, float] = {}
    deferred_names: set[str] = set()
    deferred_max, switches, switches_dead, t_repaired = 0, 0, 0, None
    waits: list[float] = []
    n_proc = READERS // 2
    with BudgetSampler(m.cache, BUDGET) as budget:
        m.mount()
        stop, threads, counters = start_threads(str(m.mountpoint), hashes, READERS - n_proc, 6000)
        procs = start_process_readers(m.mountpoint, hashes, tmp, n_proc)
        try:
            while True:
                f = m.files()
                check_view(m, hashes)
                st = m.status()
                deferred_max = max(deferred_max, st["deferred_samples"])
                deferred_names |= {
                    x["path"] for x in st["failed_samples"] if x["reason"].startswith("deferred")
                }
                for rel in f["files"]:
                    if rel in dead:
                        assert t_repaired is not None, f"{rel} shown while it still fails"
                        came_back[rel] = came_back.get(rel, 0) + 1
                        back_after.setdefault(rel, round(time.monotonic() - t_repaired, 3))
                    elif f["epoch"] == 0:
                        seen[rel] = seen.get(rel, 0) + 1
                # The fault ends once every dead file has been deferred (each is named in
                # `failed_samples`) and the view has moved on at least twice meanwhile.
                if t_repaired is None and switches >= 2 and deferred_names >= set(dead):
                    control.write_text("")
                    t_repaired, switches_dead = time.monotonic(), switches
                if f["epoch"] >= 1 and t_repaired is not None and st["deferred_samples"] == 0:
                    break
                assert switches < 16, (
                    "the dead files never came back: "
                    f"{ {k: st[k] for k in ('deferred_samples', 'deferrals', 'recovered_samples')} } "
                    f"deferred {sorted(deferred_names)}, back {came_back}, {st['failed_samples'][:10]}"
                )
                waits.append(wait_ready(m))
                advance_wait(m)
                switches += 1
        finally:
            stop_readers(stop, threads, procs, tmp / "stop", DEADLINE_S)
        st = m.status()
    total = collect(counters, [tmp / f"reader-{i}.json" for i in range(n_proc)])
    others = set(hashes) - set(dead)
    result = {
        "dead_files": len(dead),
        "deferred_files": sorted(deferred_names),
        "deferred_max": deferred_max,
        "deferrals": st["deferrals"],
        "recovered": st["recovered_samples"],
        "still_deferred": st["deferred_samples"],
        "failed_at_end": [x["path"] for x in st["failed_samples"]],
        "came_back": came_back,
        "recovery_to_return_s": back_after,
        "recovery_to_return_s_median": median(list(back_after.values())),
        "recovery_to_return_s_max": p_max(list(back_after.values())),
        "missing": len(others - set(seen)),
        "read_twice": sorted(k for k, n in seen.items() if n > 1),
        "wrong_bytes": len(total["mismatches"]),
        "switches": switches,
        "switches_while_dead": switches_dead,
        "wait_ready_s_max": p_max(waits),
        "readers": READERS,
        "reader_files_read": total["files"],
        "reader_errors": total["errors"],
        "reader_enoent_across_switch": total["enoent"],
        "reader_unknown": total["unknown"],
        **budget.summary(),
    }
    return result, budget


def check_dead_files(r: dict, dead: list[str]) -> None:
    """The assertions of the POSIX dead-files test on `run_dead_files`'s result."""
    assert r["switches_while_dead"] >= 2, "the view did not advance while the files were dead"
    assert r["deferred_files"] == sorted(dead), "exactly the dead files were deferred"
    assert r["recovered"] == len(dead), r
    assert r["deferrals"] >= len(dead), r
    assert r["still_deferred"] == 0 and not set(r["failed_at_end"]) & set(dead), r
    assert r["missing"] == 0 and not r["read_twice"], "every other sample of epoch 0 read once"
    assert sorted(r["came_back"]) == sorted(dead), f"every dead file came back: {r['came_back']}"
    assert r["wrong_bytes"] == 0 and not r["reader_unknown"], r
    # ESTALE at open across a switch is by design (test_readers.py); nothing else, EIO above
    # all: no view ever showed a file it could not serve.
    others = {k: v for k, v in r["reader_errors"].items() if k != "open ESTALE"}
    assert not others, f"readers met errors: {r['reader_errors']}"
    assert r["reader_errors"].get("open ESTALE", 0) * 2_000 <= max(r["reader_files_read"], 10_000)
    assert r["reader_files_read"] > 0
