"""End-to-end tests of the FUSE view under load: retired views drain while many readers read
across switches, concurrent opens, and quiet answers to requests a read-only fs does not serve."""

from __future__ import annotations

import os
import random
import shutil as sh
import stat
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from conftest import Mount, make_tree, wait_for


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
    threads = [
        threading.Thread(target=reader_loop, args=(m.mountpoint, stop, errors), daemon=True)
        for _ in range(64)
    ]
    for t in threads:
        t.start()
    try:
        for i in range(8):
            try:
                r = m.rpc({"op": "advance", "wait": True}, timeout=30)
            except TimeoutError as e:
                raise AssertionError(f"advance {i} hangs: {m.status()}") from e
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
    except AssertionError as e:
        raise AssertionError(f"stuck: {m.status()}") from e


@pytest.mark.parametrize("path", ["pread", "cached"])
def test_reads_the_daemon_serves_are_spliced_and_exact(mounts, tmp_path, path):
    """Reads the daemon serves are answered by splice from the slot file (no copy in the
    daemon): 16 threads read files of sizes around page and request edges, whole and at odd
    offsets, with O_DIRECT where the kernel takes it (requests of any offset and size), and
    every byte is the source's; the status counts every byte served as spliced."""
    src = tmp_path / "tier"
    src.mkdir()
    sizes = [0, 1, 4095, 4096, 4097, 131071, 131072, 131073, 3 * (1 << 20) + 123, 5 << 20]
    want = {f"f{i:02d}-{n}": os.urandom(n) for i, n in enumerate(sizes)}
    for n, b in want.items():
        (src / n).write_bytes(b)
    m = mounts(src, "64MiB", "--rf", "1000", "--read-path", path)
    m.mount()
    assert m.status()["read_path"] == path
    failures: list[str] = []

    def worker(k: int) -> None:
        rng = random.Random(k)
        for n, b in want.items():
            p = m.mountpoint / n
            with open(p, "rb", buffering=0) as f:
                got = b"".join(
                    iter(lambda: f.read(rng.choice([4096, 65536, 131072, 1 << 20])), b"")
                )
            if got != b:
                failures.append(f"{n}: whole read differs")
            fd = os.open(p, os.O_RDONLY)
            try:
                for _ in range(4):
                    off = rng.randrange(0, len(b) + 2)
                    size = rng.randrange(1, 300_000)
                    if os.pread(fd, size, off) != b[off : off + size]:
                        failures.append(f"{n}: pread({size}, {off}) differs")
            finally:
                os.close(fd)
            if k == 0:
                try:
                    fd = os.open(p, os.O_RDONLY | os.O_DIRECT)
                except OSError:
                    continue  # a kernel without O_DIRECT on this mount
                try:
                    off = 4096 * rng.randrange(0, 4) + 7
                    if os.pread(fd, 100_003, off) != b[off : off + 100_003]:
                        failures.append(f"{n}: O_DIRECT pread differs")
                finally:
                    os.close(fd)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[:5]
    st = m.status()
    assert st["daemon_bytes_read"] >= sum(sizes), st
    assert st["daemon_bytes_spliced"] == st["daemon_bytes_read"], st


@pytest.mark.skipif(os.geteuid() != 0, reason="sets a system limit and runs the daemon as a user")
def test_a_user_over_the_pipe_limit_gets_copied_replies(metfs):
    """Splicing needs pipes that hold a 128 KiB reply. A user whose pipes already take their
    share of `pipe-user-pages-soft` gets pipes of one page that cannot be grown: the daemon
    says its replies are copied, and every read is still served, exact."""
    user = "metfs-user"
    ok = subprocess.run(
        ["runuser", "-u", user, "--", "test", "-r", "/dev/fuse", "-a", "-w", "/dev/fuse"],
        capture_output=True,
    )
    if ok.returncode != 0:
        pytest.skip(f"no user {user} who may open /dev/fuse (scripts/test.sh makes one)")
    base = Path(tempfile.mkdtemp(prefix="metfs-pipes-"))
    for sub in ("src", "cache", "mnt"):
        (base / sub).mkdir()
    want = {f"f{i}": os.urandom((1 << 20) + 777 * i) for i in range(6)}
    for n, b in want.items():
        (base / "src" / n).write_bytes(b)
    sh.chown(base, user)
    for p in base.rglob("*"):
        sh.chown(p, user)
    limit = Path("/proc/sys/fs/pipe-user-pages-soft")
    old = limit.read_text()
    mnt = base / "mnt"
    m = Mount(
        base / "src",
        base / "cache",
        mnt,
        metfs=metfs,
        user=user,
        budget="64MiB",
        mini_epochs=1,
        read_path="pread",
        history=base / "h.json",
    )
    limit.write_text("16\n")
    try:
        m.mount()
        for n in want:
            r = subprocess.run(
                ["runuser", "-u", user, "--", "cmp", str(base / "src" / n), str(mnt / n)],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert r.returncode == 0, f"{n}: {r.stdout}{r.stderr}"
        st = m.rpc({"op": "status"}, timeout=10)
        assert st["daemon_bytes_read"] >= sum(len(b) for b in want.values()), st
        assert st["daemon_bytes_spliced"] == 0, st
        assert "read replies are copied, not spliced" in (base / "cache" / "metfs.log").read_text()
    finally:
        limit.write_text(old)
        m.close()
        sh.rmtree(base, ignore_errors=True)


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
    m = mounts(
        src,
        "8MiB",
        "--rf",
        "1000",
        "--compose",
        "sequential",
        "--read-path",
        "passthrough",
        "--fuse-threads",
        "64",
    )
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

        def worker(barrier: threading.Barrier, names: list[str]) -> None:
            barrier.wait()
            for j in range(400):
                n = names[j % len(names)]
                try:
                    with open(m.mountpoint / n, "rb") as f:
                        if f.read() != want[n]:
                            failures.append(f"{n}: wrong bytes")
                except OSError as e:
                    failures.append(f"{n}: {e}")

        threads = [threading.Thread(target=worker, args=(barrier, names)) for _ in range(16)]
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
    device, not a bare "Permission denied".

    The device is one this test controls, so the case runs wherever udev makes /dev/fuse 0666
    (most hosts) as well: in a private mount namespace, a node of the same device (c 10 229),
    root's only (0600), is bound over /dev/fuse. Root opens that node there, so the user is
    refused by its mode, not by a node that does not work."""
    import pwd

    user = "nobody"
    d = Path(tempfile.mkdtemp(prefix="metfs-nofuse-"))
    try:
        for sub in ("src", "cache", "mnt", "dev"):
            (d / sub).mkdir()
        (d / "src" / "f").write_bytes(b"x" * 100)
        uid = pwd.getpwnam(user).pw_uid
        for p in [d, *d.iterdir(), d / "src" / "f"]:
            os.chown(p, uid, -1)
        mount = Mount(d / "src", d / "cache", d / "mnt", metfs=metfs, budget="4MiB").command()
        # A tmpfs of the namespace's own holds the node: the test's directory may be on a
        # file system mounted nodev, where no device node opens.
        script = "\n".join(
            [
                "set -e",
                f"mount -t tmpfs -o size=64k,mode=0755 metfs-test-dev {d / 'dev'}",
                f"mknod -m 0600 {d / 'dev' / 'fuse'} c 10 229",
                f"mount --bind {d / 'dev' / 'fuse'} /dev/fuse",
                "stat -c '%a %u %t:%T' /dev/fuse",
                "exec 3<>/dev/fuse",
                "exec 3>&-",
                f"exec runuser -u {user} -- " + " ".join(f"'{a}'" for a in mount),
            ]
        )
        r = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            capture_output=True,
            text=True,
            timeout=60,
        )
        # The node was in place, root's only, and opened by root; then the user's mount failed.
        assert r.stdout.startswith("600 0 a:e5\n"), (r.stdout, r.stderr)
        assert r.returncode != 0, (r.stdout, r.stderr)
        assert "/dev/fuse" in r.stderr and "fusermount3" in r.stderr, r.stderr
    finally:
        sh.rmtree(d, ignore_errors=True)


def test_requests_a_read_only_fs_does_not_serve_are_answered_quietly(mounts, tmp_path):
    """Python's open() sends an ioctl, `ls -l` a getxattr: each is answered as a read-only
    filesystem without extended attributes answers (ENOTTY, ENODATA, an empty list), and
    nothing per request reaches the log."""
    import errno
    import fcntl
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
    grown = after[len(before) :]
    assert len(grown) <= 2, f"the log grew by {len(grown)} lines: {grown[:5]}"


def test_stat_through_the_view_mirrors_the_source(mounts, tmp_path):
    """Mode (write bits cleared), mtime, ctime, size and type of every file and directory in
    the view are the source's, so `rsync -t` between the view and a copy of the source finds
    nothing to transfer."""
    import stat

    src = tmp_path / "tier"
    make_tree(src, n=60, max_size=4096)
    modes = [0o644, 0o600, 0o640, 0o444, 0o755]
    for i, p in enumerate(sorted(q for q in src.rglob("*") if q.is_file())):
        p.chmod(modes[i % len(modes)])
        os.utime(
            p,
            ns=(
                1_600_000_000_000_000_000 + i * 1_000_003,
                1_500_000_000_000_000_000 + i * 7_000_001,
            ),
        )
    (src / "cat").chmod(0o750)
    for d in [src, *[q for q in src.rglob("*") if q.is_dir()]]:
        os.utime(d, ns=(1_400_000_000_123_456_789, 1_400_000_000_123_456_789))
    copy = tmp_path / "copy"
    sh.copytree(src, copy, symlinks=True, copy_function=sh.copy2)
    for d in [copy, *[q for q in copy.rglob("*") if q.is_dir()]]:
        os.utime(d, ns=(1_400_000_000_123_456_789, 1_400_000_000_123_456_789))
    m = mounts(src, "6MiB", "--rf", "1000")
    m.mount()
    checked = 0
    for dirpath, dirnames, filenames in os.walk(m.mountpoint):
        rel = os.path.relpath(dirpath, m.mountpoint)
        for name in [".", *dirnames, *filenames]:
            v = os.stat(os.path.join(dirpath, name))
            s = os.stat(src / rel / name)
            where = os.path.join(rel, name)
            assert stat.S_IFMT(v.st_mode) == stat.S_IFMT(s.st_mode), where
            assert stat.S_IMODE(v.st_mode) == stat.S_IMODE(s.st_mode) & ~0o222, (
                where,
                oct(v.st_mode),
                oct(s.st_mode),
            )
            assert v.st_mtime_ns == s.st_mtime_ns, where
            assert v.st_ctime_ns == s.st_ctime_ns, where
            assert (v.st_uid, v.st_gid) == (s.st_uid, s.st_gid), where
            if stat.S_ISREG(s.st_mode):
                assert v.st_size == s.st_size, where
            checked += 1
    assert checked > 20
    r = subprocess.run(
        ["rsync", "-rtn", "--itemize-changes", f"{m.mountpoint}/", f"{copy}/"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "", f"rsync would transfer:\n{r.stdout[:2000]}"


OTHER_USER = "metfs-user"


def allow_other_setup(tmp_path: Path, prefix: str) -> tuple[int, Path, Path, Path, Path]:
    """A second user (created if missing) and, for a mount another user can reach, a 0755
    directory outside the test's private tmp_path holding `src` (0755) and `mnt`; the cache
    stays in tmp_path. Returns (the user's uid, base, src, mnt, cache)."""
    if subprocess.run(["id", "-u", OTHER_USER], capture_output=True).returncode != 0:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER_USER],
            check=True,
        )
    uid = int(subprocess.run(["id", "-u", OTHER_USER], capture_output=True, text=True).stdout)
    base = Path(tempfile.mkdtemp(prefix=prefix))
    base.chmod(0o755)
    src, mnt, cache = base / "src", base / "mnt", tmp_path / "cache"
    for d in (src, mnt, cache):
        d.mkdir()
    src.chmod(0o755)
    return uid, base, src, mnt, cache


@pytest.mark.skipif(os.geteuid() != 0, reason="creates a user and mounts with allow_other")
def test_allow_other_enforces_the_source_modes(metfs, tmp_path):
    """With --allow-other, another user reads only what the source's modes let them read: a
    root-only 0600 file and a file in a 0700 directory give EACCES, a 0644 file reads."""

    user = OTHER_USER
    _, base, src, mnt, cache = allow_other_setup(tmp_path, "metfs-allow-other-")
    (src / "open.bin").write_bytes(b"o" * 100)
    (src / "open.bin").chmod(0o644)
    (src / "secret.bin").write_bytes(b"s" * 100)
    (src / "secret.bin").chmod(0o600)
    (src / "none.bin").write_bytes(b"n" * 100)
    (src / "none.bin").chmod(0o000)
    (src / "private").mkdir()
    (src / "private" / "x.bin").write_bytes(b"x" * 100)
    (src / "private" / "x.bin").chmod(0o644)
    (src / "private").chmod(0o700)
    m = Mount(
        src,
        cache,
        mnt,
        metfs=metfs,
        budget="8MiB",
        mini_epochs=1,
        allow_other=True,
        history=tmp_path / "h.json",
    )
    m.mount(timeout=120)
    try:

        def cat(rel: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                ["runuser", "-u", user, "--", "cat", str(mnt / rel)], capture_output=True, text=True
            )

        assert cat("open.bin").stdout == "o" * 100
        for rel in ("secret.bin", "none.bin", "private/x.bin"):
            r = cat(rel)
            assert r.returncode != 0 and "Permission denied" in r.stderr, (
                rel,
                r.stdout[:20],
                r.stderr,
            )
        # Root still reads everything, as at the source.
        assert (mnt / "secret.bin").read_bytes() == b"s" * 100
    finally:
        m.close()
        sh.rmtree(base, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="creates a user and mounts with allow_other")
def test_allow_other_containers_show_the_source_owner_and_mode(metfs, tmp_path):
    """In HDF5 container mode a container is a file the daemon wrote, but the mount shows it as
    the source does: the source's mode without write bits and its owner and group (it showed
    the staged copy's 0400 and the daemon's user, so another user was refused a container the
    source lets them read). Another user reads the 0644 one and is refused the 0600 one."""
    import h5py
    import numpy as np

    user = OTHER_USER
    uid, base, src, mnt, cache = allow_other_setup(tmp_path, "metfs-allow-other-h5-")
    for name, mode, owner in (
        ("open.h5", 0o644, uid),
        ("secret.h5", 0o600, 0),
        ("theirs.h5", 0o640, uid),
    ):
        with h5py.File(src / name, "w") as f:
            f.create_dataset("x", data=np.arange(40, dtype="i4").reshape(20, 2))
        (src / name).chmod(mode)
        os.chown(src / name, owner, 0)
    m = Mount(
        src,
        cache,
        mnt,
        metfs=metfs,
        budget="8MiB",
        hdf5_container=True,
        mini_epochs=1,
        allow_other=True,
        history=tmp_path / "h.json",
    )
    m.mount(timeout=120)
    try:
        for name in ("open.h5", "secret.h5", "theirs.h5"):
            s, v = os.stat(src / name), os.stat(mnt / name)
            assert stat.S_IMODE(v.st_mode) == stat.S_IMODE(s.st_mode) & ~0o222, (
                name,
                oct(v.st_mode),
            )
            assert (v.st_uid, v.st_gid) == (s.st_uid, s.st_gid), name

        def cat(rel: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                ["runuser", "-u", user, "--", "cat", str(mnt / rel)], capture_output=True
            )

        for rel in ("open.h5", "theirs.h5"):
            r = cat(rel)
            assert r.returncode == 0 and r.stdout[:8] == b"\x89HDF\r\n\x1a\n", (rel, r.stderr)
        r = cat("secret.h5")
        assert r.returncode != 0 and b"Permission denied" in r.stderr, r.stderr
        with h5py.File(mnt / "secret.h5", "r") as f:  # root reads it, as at the source
            assert f["x"].shape[1:] == (2,)
    finally:
        m.close()
        sh.rmtree(base, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="creates a user and mounts with allow_other")
@pytest.mark.parametrize("mode", ["per-sample", "transform", "shared"])
def test_allow_other_every_mode_shows_the_source_owner_and_mode(metfs, tmp_path, mode):
    """Under --allow-other (as the root node service mounts), each mode shows every file with
    the source's owner, group and mode less write bits, so a second user reads through the
    mount exactly what the source lets them read: their own 0640 file and a 0644 one, not
    root's 0600 one. Container mode has a test of its own above."""
    from test_transform import env_with_package, write_worker

    user = OTHER_USER
    uid, base, src, mnt, cache = allow_other_setup(tmp_path, "metfs-allow-other-modes-")
    (src / "d").mkdir(mode=0o755)
    files = {"d/open.bin": (0o644, 0), "d/theirs.bin": (0o640, uid), "d/secret.bin": (0o600, 0)}
    for rel, (fmode, owner) in files.items():
        (src / rel).write_bytes(rel.encode() * 50)
        (src / rel).chmod(fmode)
        os.chown(src / rel, owner, 0)
    m = Mount(
        src,
        cache,
        mnt,
        metfs=metfs,
        budget="8MiB",
        mini_epochs=1,
        allow_other=True,
        history=tmp_path / "h.json",
    )
    suffix = ""
    if mode == "transform":
        m.settings["transform"] = write_worker(tmp_path / "prep.py", b"T:")
        m.settings["transform_growth"] = 2
        m.env = env_with_package()
        suffix = ".npy"
    elif mode == "shared":
        m.settings.update(share=True, share_jobs=2)
    m.mount(timeout=120)
    try:
        view = mnt
        if mode == "shared":
            assert m.rpc({"op": "hello", "job": "a"})["ok"]
            view = mnt / "a"
            wait_for_path = view / ("d/open.bin" + suffix)
            deadline = time.time() + 60
            while not wait_for_path.exists() and time.time() < deadline:
                time.sleep(0.1)
        for rel in files:
            s, v = os.stat(src / rel), os.stat(view / (rel + suffix))
            assert stat.S_IMODE(v.st_mode) == stat.S_IMODE(s.st_mode) & ~0o222, (
                mode,
                rel,
                oct(v.st_mode),
            )
            assert (v.st_uid, v.st_gid) == (s.st_uid, s.st_gid), (mode, rel)

        def cat(rel: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                ["runuser", "-u", user, "--", "cat", str(view / (rel + suffix))],
                capture_output=True,
            )

        for rel in ("d/open.bin", "d/theirs.bin"):
            r = cat(rel)
            assert r.returncode == 0 and r.stdout == (view / (rel + suffix)).read_bytes(), (
                mode,
                rel,
                r.stderr,
            )
        r = cat("d/secret.bin")
        assert r.returncode != 0 and b"Permission denied" in r.stderr, (mode, r.stderr)
    finally:
        m.close()
        sh.rmtree(base, ignore_errors=True)


def test_a_low_descriptor_limit_does_not_break_reads(metfs, tmp_path):
    """An ordinary user's session starts with a soft limit of 1,024 descriptors; a daemon that
    kept a backing file open per file read ran out (EMFILE on every read and accept). Here the
    limit is 256 and 600 files are read twice on the cached path."""
    import resource

    src = tmp_path / "tier"
    src.mkdir()
    want = {f"f{i:04d}": os.urandom(100 + i) for i in range(600)}
    for n, b in want.items():
        (src / n).write_bytes(b)
    cache, mnt = tmp_path / "cache", tmp_path / "mnt"
    cache.mkdir()
    mnt.mkdir()

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 4096))

    m = Mount(
        src,
        cache,
        mnt,
        metfs=metfs,
        preexec_fn=low_limit,
        budget="16MiB",
        mini_epochs=1,
        read_path="cached",
        history=tmp_path / "h.json",
    )
    m.mount(timeout=120)
    try:
        for _ in range(2):
            for n, b in want.items():
                assert (mnt / n).read_bytes() == b, n
        assert m.rpc({"op": "status"}, timeout=10)["ok"]
    finally:
        m.close()
