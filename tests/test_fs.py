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


@pytest.mark.skipif(os.geteuid() != 0, reason="passthrough needs CAP_SYS_ADMIN")
def test_concurrent_first_opens_share_one_backing_file(mounts, tmp_path):
    """16 threads opening the same files at once on passthrough (root only): every open
    succeeds and reads the source's bytes. All threads open file j at their j-th step, so each
    file's first opens, where its backing file is registered with the kernel, coincide; two
    registrations for one inode made the kernel fail the later open with EIO. Many FUSE
    threads and three views make such coinciding first opens frequent."""
    src = tmp_path / "tier"
    src.mkdir()
    want = {f"f{i:04d}": os.urandom(64 + i % 512) for i in range(1200)}
    for n, b in want.items():
        (src / n).write_bytes(b)
    m = mounts(src, "8MiB", "--rf", "1000", "--compose", "sequential", "--read-path", "passthrough",
               "--fuse-threads", "64")
    m.mount()
    assert m.status()["read_path"] == "passthrough"
    failures: list[str] = []
    opens = 0
    for view in range(3):
        if view:
            r = m.rpc({"op": "advance", "wait": True}, timeout=60)
            assert r["ok"], r
        names = sorted(m.files()["files"])
        assert len(names) >= 100, len(names)
        barrier = threading.Barrier(16)

        def worker() -> None:
            barrier.wait()
            for j in range(400):
                n = names[j % len(names)]
                try:
                    with open(m.mountpoint / n, "rb") as f:
                        if f.read() != want[n]:
                            failures.append(f"{n}: wrong bytes")
                except OSError as e:
                    failures.append(f"{n}: {e}")

        threads = [threading.Thread(target=worker) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        opens += 16 * 400
    assert not failures, f"{len(failures)} of {opens} opens failed, e.g. {failures[:3]}"
    assert m.status()["read_path"] == "passthrough"


@pytest.mark.skipif(os.geteuid() != 0, reason="runs a command as another user")
def test_mount_without_access_to_dev_fuse_says_why(metfs, tmp_path):
    """A user who may not open /dev/fuse cannot mount FUSE at all (fusermount3 opens the device
    with the user's rights too): the mount fails before staging with a reason naming the
    device, not a bare "Permission denied"."""
    import pwd
    import shutil as sh
    import subprocess
    import tempfile

    user = "nobody"
    if os.stat("/dev/fuse").st_mode & 0o006 == 0o006:
        pytest.skip("/dev/fuse is open to every user here")
    d = Path(tempfile.mkdtemp(prefix="metfs-nofuse-"))
    try:
        for sub in ("src", "cache", "mnt"):
            (d / sub).mkdir()
        (d / "src" / "f").write_bytes(b"x" * 100)
        uid = pwd.getpwnam(user).pw_uid
        for p in [d, *d.iterdir(), d / "src" / "f"]:
            os.chown(p, uid, -1)
        r = subprocess.run(["runuser", "-u", user, "--", metfs, "mount", "--source", str(d / "src"),
                            "--cache", str(d / "cache"), "--budget", "4MiB", str(d / "mnt")],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0
        assert "/dev/fuse" in r.stderr and "fusermount3" in r.stderr, r.stderr
    finally:
        sh.rmtree(d, ignore_errors=True)


def test_requests_a_read_only_fs_does_not_serve_are_answered_quietly(mounts, tmp_path):
    """Python's open() sends an ioctl, `ls -l` a getxattr: each is answered as a read-only
    filesystem without extended attributes answers (ENOTTY, ENODATA, an empty list), and
    nothing per request reaches the log."""
    import errno
    import fcntl
    import subprocess
    import termios

    src = tmp_path / "tier"
    make_tree(src, n=40, max_size=4096)
    m = mounts(src, "4MiB", "--rf", "1000")
    m.mount()
    m.wait_next_ready()
    log = m.cache / "metfs.log"
    time.sleep(0.5)
    before = log.read_text(errors="replace").splitlines()
    files = [os.path.join(d, n) for d, _, ns in os.walk(m.mountpoint) for n in ns]
    assert files
    for i in range(200):
        with open(files[i % len(files)], "rb") as f:
            f.read(1)
    r = subprocess.run(["ls", "-lR", str(m.mountpoint)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    with open(files[0], "rb") as f:
        with pytest.raises(OSError) as e:
            fcntl.ioctl(f.fileno(), termios.TCGETS, bytes(64))
        assert e.value.errno == errno.ENOTTY
        with pytest.raises(OSError) as e:
            os.getxattr(files[0], "user.x")
        assert e.value.errno == errno.ENODATA
        assert os.listxattr(files[0]) == []
        os.fsync(f.fileno())
    assert os.access(files[0], os.R_OK) and not os.access(files[0], os.W_OK)
    time.sleep(0.5)
    after = log.read_text(errors="replace").splitlines()
    grown = after[len(before):]
    assert len(grown) <= 2, f"the log grew by {len(grown)} lines: {grown[:5]}"
