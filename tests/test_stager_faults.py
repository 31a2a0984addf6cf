"""End-to-end tests of staging under faults of the tier and of the node, on real mounts: a
source outage, a full cache, FIFOs, a cache path too long, a cache that must stay private, a
tmp/ that is a symlink, a kill during the first staging and a copy corrupted in place.

The promise under test: a fault never drops a sample. Only a sample that is itself unservable is
left out, with its reason; anything else stops the slot, which the daemon stages again later
while the current view keeps serving.
"""

from __future__ import annotations

import os
import pwd
import re
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

from conftest import is_mounted, make_tree, read_view, rpc, wait_for


def staging(m) -> dict:
    return m.status()["staging"]


def advance_and_check(m, files: dict[str, bytes], expected_count: int) -> None:
    """Advances to the staged successor and checks that its view holds every planned sample
    with the tier's bytes."""
    r = m.pass_end()
    assert r["decision"] == "advance", r
    view = read_view(m.mountpoint)
    assert len(view) == expected_count, f"{len(view)} of {expected_count} samples in the view"
    for k, v in view.items():
        assert files[k] == v, k


def test_source_outage_during_staging_loses_no_sample(mounts, tmp_path):
    src = tmp_path / "tier"
    files = make_tree(src, n=400, max_size=16 * 1024)
    # `auto` pacing trickles the successor in at 256 KiB/s (about 8 s for its ~2 MiB), so the
    # outage lands mid-staging; the slot has far more samples than are fetched at once.
    m = mounts(src, "6MiB", "--rf", "1", "--compose", "sequential", "--prefetch-rate", "auto")
    m.mount()
    wait_for(lambda: staging(m)["state"] == "staging", timeout=10, what="the successor's staging")
    st = staging(m)
    away = tmp_path / "tier-away"
    src.rename(away)  # the whole source disappears for 5 s
    wait_for(lambda: staging(m).get("retries", 0) > 0, timeout=5, what="status to report retries")
    assert "missing" in staging(m)["last_retry_error"]
    time.sleep(4)
    away.rename(src)
    m.wait_next_ready(timeout=120)
    s = m.status()
    assert not s["failed_samples"], s["failed_samples"]
    advance_and_check(m, files, st["files_total"])
    log = (m.cache / "metfs.log").read_text()
    assert "source directory" in log and "is missing" in log, "the outage is reported"
    assert "the tier recovered" in log


@pytest.fixture
def tmpfs(tmp_path):
    made: list[Path] = []

    def make(path: Path, size: str) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs: {r.stderr}")
        made.append(path)
        return path

    yield make
    for p in made:
        subprocess.run(["umount", "-l", str(p)], capture_output=True)


def fill(path: Path) -> None:
    """Writes to `path` until its file system is full."""
    with open(path, "wb") as f:
        block = b"\0" * 65536
        try:
            while True:
                f.write(block)
                f.flush()
        except OSError:
            pass


def test_full_cache_stops_the_slot_and_resumes_when_space_returns(tmpfs, mounts, tmp_path):
    src = tmp_path / "tier"
    files = make_tree(src, n=160, max_size=32 * 1024)
    cache = tmpfs(tmp_path / "cache", "64m")
    m = mounts(
        src,
        "3MiB",
        "--rf",
        "1",
        "--compose",
        "sequential",
        "--prefetch-rate",
        "auto",
        "--log-file",
        str(tmp_path / "metfs.log"),
        cache=cache,
    )
    m.mount()
    wait_for(lambda: staging(m)["state"] == "staging", timeout=10, what="the successor's staging")
    total = staging(m)["files_total"]
    ballast = cache / "ballast"
    fill(ballast)
    wait_for(
        lambda: staging(m)["state"] == "failed", timeout=60, what="staging to fail on the full disk"
    )
    s = m.status()
    assert "No space left" in s["last_error"], s["last_error"]
    assert not s["failed_samples"], "no sample is dropped for a full disk"
    assert not s["next_ready"]
    # The current view keeps serving: the job is told to wait (a bonus pass), not advanced.
    assert m.pass_end()["decision"] == "wait"
    log = (tmp_path / "metfs.log").read_text()
    assert "out of space" in log, log[-2000:]
    ballast.unlink()
    m.wait_next_ready(timeout=120)
    assert not m.status()["failed_samples"]
    advance_and_check(m, files, total)


def test_fifo_named_in_a_manifest_is_left_out_and_mount_returns(mounts, tmp_path):
    src = tmp_path / "tier"
    files = make_tree(src, n=20, max_size=4096)
    os.mkfifo(src / "pipe")
    man = tmp_path / "manifest.csv"
    rows = ["path,size"] + [f'"{k}",{len(v)}' for k, v in files.items()] + ["pipe,100"]
    man.write_text("\n".join(rows) + "\n")
    m = mounts(src, "16MiB", "--manifest", str(man))
    t = time.time()
    m.mount()  # used to block forever opening the FIFO
    assert time.time() - t < 60
    s = m.status()
    assert any(f["path"] == "pipe" and "FIFO" in f["reason"] for f in s["failed_samples"]), s[
        "failed_samples"
    ]
    view = read_view(m.mountpoint)
    assert view == files


TEST_USER = "metfs-stager-test"


@pytest.fixture(scope="module")
def other_user():
    try:
        pwd.getpwnam(TEST_USER)
    except KeyError:
        r = subprocess.run(
            ["useradd", "--no-create-home", "--shell", "/bin/sh", TEST_USER],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            pytest.skip(f"cannot create a user: {r.stderr}")
    return TEST_USER


def test_cache_never_exposes_protected_source_files(mounts, tmp_path, other_user):
    src = tmp_path / "tier"
    src.mkdir()
    (src / "public.bin").write_bytes(b"p" * 100)
    secret = src / "secret.bin"
    secret.write_bytes(b"s" * 100)
    secret.chmod(0o600)
    (src / "private").mkdir(mode=0o700)
    (src / "private" / "inner.bin").write_bytes(b"i" * 100)
    (src / "private").chmod(0o700)
    # Every directory on the way is traversable, so only metfs's own modes protect the cache.
    os.chmod(tmp_path, 0o755)
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o755)
    cache.chmod(0o755)
    m = mounts(src, "16MiB", cache=cache)
    m.mount()
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700, "the cache directory is made private"
    assert "private (0700)" in (cache / "metfs.log").read_text(), "tightening it is reported"
    slots = cache / "slots"
    staged = [p for p in slots.rglob("*")]
    assert any(p.name == "secret.bin" for p in staged)
    for p in [slots, cache / "tmp", *staged]:
        mode = stat.S_IMODE(p.lstat().st_mode)
        assert mode & 0o077 == 0, f"{p} is mode {mode:o}"
    # As another user: nothing staged can be read, whatever the path.
    for p in staged:
        if p.is_file():
            r = subprocess.run(
                ["runuser", "-u", other_user, "--", "cat", str(p)], capture_output=True
            )
            assert r.returncode != 0 and not r.stdout, f"{other_user} read {p}"
    # A shared sticky directory is refused rather than locked down.
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    m2 = mounts(src, "16MiB", cache=shared, name="shared")
    r = m2.mount(check=False)
    assert r.returncode != 0 and "shared" in r.stderr, r.stderr
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777


def test_tmp_cleanup_never_follows_symlinks(mounts, tmp_path):
    src = tmp_path / "tier"
    files = make_tree(src, n=20, max_size=4096)
    victim = tmp_path / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / "precious").write_text("keep me")
    (victim / "sub" / "precious").write_text("keep me")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "tmp").symlink_to(victim)
    m = mounts(src, "16MiB", cache=cache)
    m.mount()
    assert (victim / "precious").read_text() == "keep me"
    assert (victim / "sub" / "precious").read_text() == "keep me"
    assert not (cache / "tmp").is_symlink()
    m.umount()
    # Symlinks inside tmp/, to a file and to a directory.
    (cache / "tmp" / "f").symlink_to(victim / "precious")
    (cache / "tmp" / "d").symlink_to(victim)
    m.mount()
    assert (victim / "precious").read_text() == "keep me"
    assert (victim / "sub" / "precious").read_text() == "keep me"
    for name in ("f", "d"):
        assert not os.path.lexists(cache / "tmp" / name), f"tmp/{name} is removed"
    assert read_view(m.mountpoint) == files


def test_a_path_too_long_for_the_cache_leaves_only_that_sample_out(mounts, tmp_path):
    src = tmp_path / "t"
    files = make_tree(src, n=20, max_size=4096)
    # About 3,800 bytes below the source: fine there, and its directory fits below the cache
    # too, but not the file's whole path (the rename into the slot fails).
    deep = "/".join(["d" * 200] * 18)
    (src / deep).mkdir(parents=True)
    name = "x" * 195 + ".bin"
    (src / deep / name).write_bytes(b"deep")
    cache = tmp_path / ("c" * 250)
    cache.mkdir(parents=True)
    sock = str(tmp_path / "s.sock")  # a socket path under the cache would be too long
    m = mounts(src, "16MiB", "--socket", sock, cache=cache)
    m.mount()
    r = rpc(sock, {"op": "status"})
    assert r["ok"], r
    assert any(name in f["path"] and "too long" in f["reason"] for f in r["failed_samples"]), r[
        "failed_samples"
    ]
    assert read_view(m.mountpoint) == files
    subprocess.run([m.bin, "umount", str(m.mountpoint)], capture_output=True, timeout=60)


def mini_epoch_staged_line(log: str) -> dict[str, int]:
    lines = [ln for ln in log.splitlines() if "mini-epoch staged" in ln and "next" not in ln]
    assert lines, log[-2000:]
    return {k: int(v) for k, v in re.findall(r"(fetched|resumed|failed)=(\d+)", lines[-1])}


def test_kill_during_the_first_staging_resumes_from_the_journal(mounts, tmp_path):
    src = tmp_path / "tier"
    files = make_tree(src, n=120, max_size=64 * 1024)
    m = mounts(src, "16MiB", "--rf", "1", "--compose", "sequential", "--prefetch-rate", "1MiB/s")
    first = m.spawn(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    journal = m.cache / "slots" / "e000000-m00000.journal"

    def committed() -> int:
        return len(journal.read_text().splitlines()) if journal.exists() else 0

    wait_for(lambda: committed() >= 10, timeout=60, what="the first staging to commit files")
    os.kill(m.pid(), signal.SIGKILL)
    first.communicate(timeout=60)
    assert not is_mounted(m.mountpoint), "the first mount never returned"
    kept = committed()
    total = len(files)
    assert kept < total, "the kill interrupted the first staging"
    log_len = len((m.cache / "metfs.log").read_text())
    m.args = [a for a in m.args if a not in ("--prefetch-rate", "1MiB/s")]
    m.mount()
    counts = mini_epoch_staged_line((m.cache / "metfs.log").read_text()[log_len:])
    assert counts["resumed"] >= kept, counts
    assert counts["fetched"] + counts["resumed"] == total, counts
    assert read_view(m.mountpoint) == files


def test_a_copy_corrupted_in_place_is_not_served_after_a_restart(mounts, tmp_path):
    """A clean unmount seals the slots, so the remount reads none of their copies; the copy
    damaged meanwhile (in place: same inode, same size, its directory untouched) is caught at
    its first open, before any byte is served, and fetched again from the tier. Its hard link
    in the successor slot (staged by linking from the current one) shares the damage, and is
    caught and fetched again when the view reaches it."""
    src = tmp_path / "tier"
    files = make_tree(src, n=30, max_size=8192)
    m = mounts(src, "16MiB")
    m.mount()
    wait_for(lambda: m.status()["next_ready"], timeout=60, what="the successor staged")
    m.umount()
    assert list((m.cache / "slots").glob("*.seal")), "a clean unmount seals the slots"
    slot = m.cache / "slots" / "e000000-m00000"
    rel = next(k for k, v in sorted(files.items()) if len(v) > 100)
    p = slot / rel
    data = bytearray(p.read_bytes())
    data[50] ^= 0xFF
    with open(p, "r+b") as f:  # in place, same size
        f.seek(50)
        f.write(bytes([data[50]]))
    log = m.cache / "metfs.log"
    at = len(log.read_text())
    m.mount()
    assert "resumed from its seal" in log.read_text()[at:]
    assert m.status()["tier_bytes_read"] == 0
    assert (m.mountpoint / rel).read_bytes() == files[rel]
    text = log.read_text()[at:]
    assert "changed on disk while the cache was unmounted" in text, text[-3000:]
    assert "fetched again from the tier" in text
    assert m.status()["tier_bytes_read"] == len(files[rel])
    assert read_view(m.mountpoint) == files
    # The successor's link to the damaged copy.
    assert m.rpc({"op": "advance", "wait": True})["ok"]
    assert read_view(m.mountpoint) == files
    assert m.status()["tier_bytes_read"] == 2 * len(files[rel])
    # Repaired copies are sealed again: the next start resumes without fetching anything.
    m.umount()
    m.mount()
    assert read_view(m.mountpoint) == files
    assert m.status()["tier_bytes_read"] == 0


def test_a_copy_deleted_while_unmounted_is_fetched_again_at_the_remount(mounts, tmp_path):
    """A deletion changes the slot's directory, so its seal does not hold: every copy is
    checked at the remount, as after a crash, and the missing one is staged again."""
    src = tmp_path / "tier"
    files = make_tree(src, n=30, max_size=8192)
    m = mounts(src, "16MiB")
    m.mount()
    m.umount()
    rel = sorted(files)[3]
    (m.cache / "slots" / "e000000-m00000" / rel).unlink()
    log = m.cache / "metfs.log"
    at = len(log.read_text())
    m.mount()
    text = log.read_text()[at:]
    assert re.search(r"seal does not hold.*slot=e000000-m00000", text), text[-3000:]
    assert (
        "resumed from its seal; each copy is checked at its first open slot=e000000-m00000"
        not in text
    )
    assert read_view(m.mountpoint) == files
    # Taken again by a hard link from the successor slot, which holds it too, or fetched.
    assert m.status()["tier_bytes_read"] <= len(files[rel])


def _mounted_containers(mounts, tmp_path):
    """A container-mode mount over fresh HDF5 containers, mounted once and unmounted: the mount
    and the bytes `train.h5` showed."""
    from test_hdf5 import write_containers

    src = tmp_path / "tier"
    write_containers(src)
    m = mounts(src, "12MiB", "--hdf5-container", "--mini-epochs", "2")
    m.mount()
    before = (m.mountpoint / "train.h5").read_bytes()
    m.umount()
    return m, before


def _assert_same_rows(tmp_path, before: bytes, staged) -> None:
    """Restaging writes the same rows, though not byte for byte the same file (HDF5 stamps times
    in its headers): compares what a reader gets."""
    import h5py
    import numpy as np

    ref = tmp_path / "before.h5"
    ref.write_bytes(before)
    with h5py.File(ref, "r") as a, h5py.File(staged, "r") as b:
        for name in ("images", "labels", "rgb", "metfs_index"):
            np.testing.assert_array_equal(a[name][:], b[name][:])


def test_a_container_corrupted_in_place_is_staged_again_after_a_restart(mounts, tmp_path):
    m, before = _mounted_containers(mounts, tmp_path)
    p = m.cache / "slots" / "e000000-m00000" / "train.h5"
    with open(p, "r+b") as f:  # in place, same size, in the middle of the rows' data
        f.seek(len(before) // 2)
        f.write(bytes([before[len(before) // 2] ^ 0xFF]))
    m.mount()
    _assert_same_rows(tmp_path, before, m.mountpoint / "train.h5")


def test_a_journaled_container_missing_from_its_slot_is_staged_again(mounts, tmp_path):
    """A container is journaled before its rename: a kill between the two leaves an entry whose
    file never reached the slot, and an unfinished journal. The remount stages it again."""
    m, before = _mounted_containers(mounts, tmp_path)
    slots = m.cache / "slots"
    (slots / "e000000-m00000" / "train.h5").unlink()
    journal = slots / "e000000-m00000.journal"
    lines = journal.read_text().splitlines()
    assert lines[-1] == "complete" and any(line.startswith("file ") for line in lines), lines
    journal.write_text("\n".join(lines[:-1]) + "\n")
    (slots / "e000000-m00000.seal").unlink(missing_ok=True)
    m.mount()
    _assert_same_rows(tmp_path, before, m.mountpoint / "train.h5")
    assert journal.read_text().splitlines()[-1] == "complete"


def test_full_cache_in_container_mode_drops_no_row(tmpfs, mounts, tmp_path):
    import h5py

    from test_hdf5 import write_containers

    src = tmp_path / "tier"
    data = write_containers(src)
    cache = tmpfs(tmp_path / "cache", "64m")
    # A slow staging rate (each mini-epoch's rows take about 2 s), so that the disk fills while
    # the successor is staged.
    m = mounts(
        src,
        "12MiB",
        "--hdf5-container",
        "--mini-epochs",
        "2",
        "--rf",
        "1",
        "--prefetch-rate",
        "16KiB/s",
        "--log-file",
        str(tmp_path / "metfs.log"),
        cache=cache,
    )
    m.mount()

    def rows() -> dict[str, list[int]]:
        out = {}
        for name in data:
            with h5py.File(m.mountpoint / name, "r") as h:
                out[name] = h["metfs_index"][:].tolist()
        return out

    first = rows()
    ballast = cache / "ballast"
    fill(ballast)
    wait_for(lambda: staging(m)["state"] in ("failed", "ready"), timeout=60, what="staging to end")
    s = m.status()
    assert staging(m)["state"] == "failed", s
    assert "No space left" in s["last_error"] or "out of space" in s["last_error"], s["last_error"]
    assert not s["failed_samples"], s["failed_samples"]
    ballast.unlink()
    m.wait_next_ready(timeout=120)
    assert m.pass_end()["decision"] == "advance"
    second = rows()
    for name, d in data.items():
        assert sorted(first[name] + second[name]) == list(range(len(d["labels"]))), name
