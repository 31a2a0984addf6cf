"""End-to-end tests of the core: a POSIX capacity tier, a real FUSE mount, double-buffered
staging, fixed rf through the control socket."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from conftest import footprint, is_mounted, make_tree, read_view, wait_for


def parse_size(s: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, m in units.items():
        if s.endswith(u):
            return int(float(s[: -len(u)]) * m)
    return int(s)


class Sampler(threading.Thread):
    """Samples the cache directory's on-disk footprint while a test runs."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.max = 0
        self.samples = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.max = max(self.max, footprint(self.path))
            self.samples += 1
            time.sleep(0.01)


def run_epochs(m, files: dict[str, bytes], rf: int, until: tuple[int, int]) -> tuple[dict, Counter]:
    """Reads every file of the view each pass (checking bytes) until the view reaches `until`."""
    seen: dict[tuple[int, int], set[str]] = {}
    passes: Counter = Counter()
    while True:
        f = m.files()
        key = (f["epoch"], f["mini_epoch"])
        if key >= until:
            return seen, passes
        view = read_view(m.mountpoint)
        assert set(view) == set(f["files"]), "listing differs from the view's file list"
        for rel, data in view.items():
            assert data == files[rel], f"bytes of {rel} differ from the tier"
        seen.setdefault(key, set()).update(view)
        passes[key] += 1
        r = m.pass_end(metrics={"loss": 1.0 / (1 + sum(passes.values()))})
        assert r["decision"] in ("repeat", "advance", "wait")


READ_PATHS = ["cached", "passthrough", "pread"]


@pytest.mark.parametrize("read_path", READ_PATHS)
def test_epoch_through_the_mount(mounts, dataset, make_tier, read_path):
    src, files = dataset
    budget = "6MiB"
    m = mounts(make_tier(src), budget, "--rf", "2", "--read-path", read_path)
    sampler = Sampler(m.cache)
    sampler.start()
    try:
        m.mount()
        st = m.status()
        nm = st["mini_epochs"]
        assert nm >= 3, st
        assert st["read_path"] == read_path, st
        for key in (
            "epoch",
            "mini_epoch",
            "mini_epochs",
            "pass",
            "rf",
            "generation",
            "next_ready",
            "cache_bytes",
            "budget_bytes",
            "tier_bytes_read",
            "view_files",
        ):
            assert key in st, key
        seen, passes = run_epochs(m, files, rf=2, until=(1, 1))
    finally:
        sampler.stop.set()
        sampler.join()
    epoch0 = [seen[(0, k)] for k in range(nm)]
    union = set().union(*epoch0)
    assert union == set(files), "an epoch must cover every file"
    assert sum(len(s) for s in epoch0) == len(files), "every file in exactly one mini-epoch"
    for k in range(nm):
        assert passes[(0, k)] >= 2, f"mini-epoch {k} got {passes[(0, k)]} passes, rf is 2"
    assert (1, 0) in seen, "the run continues into the next epoch"
    assert sampler.samples > 10
    assert sampler.max <= parse_size(budget), f"cache held {sampler.max} bytes, budget {budget}"
    st = m.status()
    assert st["tier_bytes_read"] <= 2 * sum(len(v) for v in files.values())


@pytest.mark.parametrize("read_path", READ_PATHS)
def test_handle_opened_before_a_switch_reads_old_bytes(mounts, dataset, make_tier, read_path):
    src, files = dataset
    m = mounts(
        make_tier(src), "6MiB", "--rf", "1", "--compose", "sequential", "--read-path", read_path
    )
    m.mount()
    rel = next(r for r in m.files()["files"] if len(files[r]) > 100)
    fh = open(m.mountpoint / rel, "rb")
    head = fh.read(50)
    m.wait_next_ready()
    r = m.pass_end()
    assert r["decision"] == "advance", r
    assert r["generation"] == 2
    assert rel not in m.files()["files"]
    assert not (m.mountpoint / rel).exists(), "a lookup after the switch sees the new view"
    assert head + fh.read() == files[rel], "the old handle keeps reading the old bytes"
    assert m.status()["draining_slots"] == 1
    fh.close()
    wait_for(lambda: m.status()["draining_slots"] == 0, what="the old slot to be evicted")


def test_umount_and_mount_resume_without_refetching(mounts, dataset, make_tier):
    src, files = dataset
    m = mounts(make_tier(src), "6MiB", "--rf", "1")
    m.mount()
    for _ in range(2):
        m.wait_next_ready()
        assert m.pass_end()["decision"] == "advance"
    m.wait_next_ready()
    before = m.status()
    pid = m.pid()
    m.umount()
    assert not is_mounted(m.mountpoint)
    wait_for(lambda: not Path(f"/proc/{pid}").exists(), what="the daemon to exit")
    m.mount()
    after = m.status()
    assert (after["epoch"], after["mini_epoch"]) == (before["epoch"], before["mini_epoch"])
    assert after["tier_bytes_read"] == 0, "the current slot is reused, not refetched"
    m.wait_next_ready()
    assert m.status()["tier_bytes_read"] == 0, "the staged successor is reused too"
    view = read_view(m.mountpoint)
    assert view and all(files[k] == v for k, v in view.items())


@pytest.mark.parametrize("how", ["fusermount3 -u", "umount -l"])
def test_an_unmount_from_outside_ends_the_daemon(mounts, dataset, how):
    """`fusermount3 -u` (a user) or `umount -l` (an admin, an epilog) ends the mount without
    the daemon's socket: the daemon must still exit and free its cache for the next mount,
    not linger holding the cache's lock."""
    if how.startswith("umount") and os.geteuid() != 0:
        pytest.skip("umount needs root")
    src, files = dataset
    m = mounts(src, "6MiB", "--rf", "1")
    m.mount()
    m.wait_next_ready()
    before = m.status()
    pid = m.pid()
    name = min(m.files()["files"])
    if how == "umount -l":
        # Detached, not gone: a file open in it is still served until it is closed.
        with open(m.mountpoint / name, "rb") as fh:
            subprocess.run(["umount", "-l", str(m.mountpoint)], check=True)
            assert not is_mounted(m.mountpoint)
            time.sleep(0.5)
            assert Path(f"/proc/{pid}").exists(), "the daemon serves the open file"
            assert fh.read() == files[name]
    else:
        subprocess.run(["fusermount3", "-u", str(m.mountpoint)], check=True)
        assert not is_mounted(m.mountpoint)
    wait_for(lambda: not Path(f"/proc/{pid}").exists(), what="the daemon to exit")
    assert "unmounted from outside" in m.log()
    assert not Path(m.socket).exists()
    m.mount()
    after = m.status()
    assert (after["epoch"], after["mini_epoch"]) == (before["epoch"], before["mini_epoch"])
    view = read_view(m.mountpoint)
    assert view and all(files[k] == v for k, v in view.items())


def footprint_once(path: Path) -> int:
    """Bytes the files under `path` take on disk, each inode once (a hard link is one file)."""
    seen: set[int] = set()
    total = 0
    for dirpath, _, filenames in os.walk(path):
        for name in filenames:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:
                continue
            if st.st_ino not in seen:
                seen.add(st.st_ino)
                total += st.st_blocks * 512
    return total


def test_samples_on_the_node_are_never_fetched_again(mounts, dataset):
    """The whole dataset fits one slot: every successor is the same samples, taken from the
    current slot (hard links), so the tier is read once, also across a restart."""
    src, files = dataset
    total = sum(len(v) for v in files.values())
    budget = "24MiB"
    m = mounts(src, budget, "--rf", "1")
    m.mount()
    assert m.status()["mini_epochs"] == 1
    for _ in range(3):
        m.wait_next_ready()
        st = m.status()
        # Linked files are counted once: the budget's count matches the disk, not twice.
        assert (
            footprint_once(m.cache / "slots")
            <= st["cache_bytes"]
            < footprint_once(m.cache / "slots") + (1 << 20)
        ), st
        assert footprint_once(m.cache) <= parse_size(budget)
        assert m.pass_end()["decision"] == "advance"
        view = read_view(m.mountpoint)
        assert view and all(files[k] == v for k, v in view.items())
    m.wait_next_ready()
    st = m.status()
    assert st["epoch"] == 3
    assert st["tier_bytes_read"] == total, "samples already on the node were fetched again"
    assert st["reused_bytes"] == 4 * total
    # A restart whose successor slot is gone takes it from the current slot again.
    m.umount()
    succ = st["staging"]["slot"]
    shutil.rmtree(m.cache / "slots" / succ)
    (m.cache / "slots" / f"{succ}.journal").unlink()
    m.mount()
    m.wait_next_ready()
    st = m.status()
    assert (st["tier_bytes_read"], st["reused_bytes"]) == (0, total), st
    assert m.pass_end()["decision"] == "advance"
    view = read_view(m.mountpoint)
    assert set(view) == set(files) and all(files[k] == v for k, v in view.items())


def test_kill9_during_staging_then_mount_resumes(mounts, tmp_path):
    src = tmp_path / "tier"
    files = make_tree(src, n=120, max_size=64 * 1024)
    # A slow tier (paced staging) so that the kill lands in the middle of a slot: at 256 KiB/s
    # a slot of ~1.7 MB takes ~7 s, time enough for the status polls on a busy machine (at
    # 1 MiB/s the loaded test command once saw the slot complete before the kill).
    m = mounts(src, "6MiB", "--rf", "1", "--compose", "sequential", "--prefetch-rate", "256KiB/s")
    m.mount()
    wait_for(lambda: m.status()["staging"].get("files_done", 0) >= 3, what="staging to start")
    st = m.status()["staging"]
    assert st["state"] == "staging", st
    slot_dir = m.cache / "slots" / st["slot"]
    os.kill(m.pid(), signal.SIGKILL)
    time.sleep(0.3)
    # Every copy the stager finished (read-only once whole) is equal to the tier's; the slot is
    # not complete, so it may also hold copies still being written (owner-writable), which
    # nothing reads and the resume replaces.
    staged = {
        str(p.relative_to(slot_dir)): p.read_bytes()
        for p in slot_dir.rglob("*")
        if p.is_file() and p.stat().st_mode & 0o777 == 0o400
    }
    assert staged, "some files were staged before the kill"
    assert len(staged) < st["files_total"], "the kill interrupted staging"
    for rel, data in staged.items():
        assert data == files[rel], f"{rel} is partial or wrong"
    # Mount again over the dead mount: the stale mount is detached, staging resumes.
    m.mount()
    view = read_view(m.mountpoint)
    assert view and all(files[k] == v for k, v in view.items())
    m.wait_next_ready(timeout=120)
    refetched = m.status()["tier_bytes_read"]
    slot_bytes = st["bytes_total"]
    assert refetched < slot_bytes, f"resumed staging refetched {refetched} of {slot_bytes} bytes"
    assert m.pass_end()["decision"] == "advance"
    view = read_view(m.mountpoint)
    assert view and all(files[k] == v for k, v in view.items())


def caches_dropped() -> int:
    """How many times the kernel's entries and inodes have been dropped on this machine
    (`drop_slab` in /proc/vmstat: `echo 2|3 > /proc/sys/vm/drop_caches`, which the cold-read
    benchmarks run by the test command on another worker do)."""
    for line in Path("/proc/vmstat").read_text().splitlines():
        name, _, value = line.partition(" ")
        if name == "drop_slab":
            return int(value)
    return 0


@pytest.mark.parametrize("prime", [True, False])
def test_a_new_view_is_listed_for_the_kernel_so_opens_need_no_lookup(mounts, dataset, prime):
    """After the mount and after each switch the daemon lists the view through the mount
    (`prime_entries`), so that the kernel holds every entry before a reader opens a file: opening
    every file of the view then costs the daemon no lookup. Off, every open of a new file does.

    A view during which something dropped the machine's caches (a benchmark's cold read on the
    other worker drops every entry the kernel holds) proves nothing either way: it is not
    counted, and the next view is measured instead."""
    src, files = dataset
    m = mounts(src, "6MiB", "--rf", "1", f"--prime-entries={str(prime).lower()}")
    m.mount()
    measured = 0
    for _ in range(8):  # the mount's view, then views after switches
        dropped = caches_dropped()
        st = m.status()
        if prime:
            generation = st["generation"]
            wait_for(
                lambda g=generation: m.status()["primed_generation"] == g,
                what="the view to be listed",
            )
            st = m.status()
            # Every file and directory of the view, and the view's top level.
            assert st["primed_entries"] >= st["view_files"], st
        before = st["daemon_lookups"]
        view = m.files()["files"]
        assert view
        for rel in view:
            assert (m.mountpoint / rel).read_bytes() == files[rel]
        looked_up = m.status()["daemon_lookups"] - before
        if caches_dropped() == dropped:
            measured += 1
            if prime:
                assert looked_up == 0, f"{looked_up} lookups for {len(view)} files of a listed view"
            else:
                assert looked_up >= len(view), f"{looked_up} lookups for {len(view)} files"
                assert m.status()["primed_generation"] == 0
        if measured == 2:
            break
        m.wait_next_ready()
        m.rpc({"op": "advance", "wait": True})
    assert measured == 2, "the machine's caches were dropped during every view"


def test_cli_status_pass_end_advance(mounts, dataset, metfs):
    src, files = dataset
    m = mounts(src, "6MiB", "--rf", "2")
    m.mount()
    out = subprocess.run(
        [metfs, "status", "--json", "--socket", m.socket],
        capture_output=True,
        text=True,
        check=True,
    )
    st = json.loads(out.stdout)
    assert st["generation"] == 1 and st["rf"] == 2
    out = subprocess.run(
        [metfs, "pass-end", "--socket", m.socket, "--metric", "loss=0.5"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout)["decision"] == "repeat"
    out = subprocess.run(
        [metfs, "advance", "--wait", "--socket", m.socket],
        capture_output=True,
        text=True,
        check=True,
    )
    d = json.loads(out.stdout)
    assert d["decision"] == "advance" and d["generation"] == 2
    out = subprocess.run(
        [metfs, "pass-end", "--socket", m.socket, "--metric", "loss=abc"],
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0 and "abc" in out.stderr
    out = subprocess.run(
        [metfs, "status"],
        capture_output=True,
        text=True,
        env={**os.environ, "METFS_SOCKET": m.socket},
    )
    assert out.returncode == 0 and "generation 2" in out.stdout
    for sub in ("mount", "umount", "status", "pass-end", "advance", "files"):
        h = subprocess.run([metfs, sub, "--help"], capture_output=True, text=True)
        assert h.returncode == 0 and "Usage" in h.stdout


def test_mount_is_read_only(mounts, dataset):
    src, files = dataset
    m = mounts(src, "6MiB")
    m.mount()
    rel = m.files()["files"][0]
    with pytest.raises(OSError):
        open(m.mountpoint / rel, "r+b")
    with pytest.raises(OSError):
        (m.mountpoint / "new").write_bytes(b"x")
    with pytest.raises(OSError):
        os.unlink(m.mountpoint / rel)
    assert (src / rel).read_bytes() == files[rel], "the source is never written"
    mode = os.stat(m.socket).st_mode & 0o777
    assert mode == 0o600, oct(mode)


# ---- bad input ---------------------------------------------------------------------------


def test_budget_too_small_names_the_file(mounts, tmp_path):
    src = tmp_path / "tier"
    make_tree(src, n=20, max_size=1024)
    (src / "huge file.bin").write_bytes(os.urandom(3 << 20))
    m = mounts(src, "4MiB")
    r = m.mount(check=False)
    assert r.returncode != 0
    assert "huge file.bin" in r.stderr and "at least" in r.stderr, r.stderr
    assert not is_mounted(m.mountpoint)


def test_missing_source(mounts, tmp_path):
    m = mounts(tmp_path / "no-such-dir", "4MiB")
    r = m.mount(check=False)
    assert r.returncode != 0 and "no-such-dir" in r.stderr, r.stderr


def test_missing_cache_dir(metfs, tmp_path, dataset):
    src, _ = dataset
    (tmp_path / "mnt").mkdir()
    r = subprocess.run(
        [
            metfs,
            "mount",
            "--source",
            str(src),
            "--cache",
            str(tmp_path / "nocache"),
            "--budget",
            "4MiB",
            str(tmp_path / "mnt"),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0 and "nocache" in r.stderr, r.stderr


def test_mountpoint_not_empty(mounts, dataset):
    src, _ = dataset
    m = mounts(src, "6MiB")
    m.mountpoint.mkdir(parents=True)
    (m.mountpoint / "precious").write_text("keep me")
    r = m.mount(check=False)
    assert r.returncode != 0 and "not empty" in r.stderr, r.stderr
    assert (m.mountpoint / "precious").read_text() == "keep me"


def test_bad_config_value_names_the_key(mounts, dataset, tmp_path):
    src, _ = dataset
    m = mounts(src, "lots-of-bytes")
    r = m.mount(check=False)
    assert r.returncode != 0 and "budget" in r.stderr, r.stderr
    cfg = tmp_path / "metfs.toml"
    cfg.write_text('budgte = "1GiB"\n')
    m = mounts(src, "6MiB", "--config", str(cfg), name="cfg")
    r = m.mount(check=False)
    assert r.returncode != 0 and "budgte" in r.stderr, r.stderr


def test_settings_layers_file_env_flags(mounts, dataset, tmp_path):
    """A real mount takes each setting from the highest layer that sets it: flags over METFS_*
    variables over the config file; METFS_SOCKET (a client's variable) never moves the socket."""
    src, _ = dataset
    cfg = tmp_path / "metfs.toml"
    cfg.write_text('rf = 8\nread_path = "cached"\n[control]\nmax_connections = 0\n')
    env = {
        **os.environ,
        "METFS_RF": "3",
        "METFS_READ_PATH": "passthrough",
        "METFS_CONTROL_MAX_CONNECTIONS": "16",
        "METFS_SOCKET": str(tmp_path / "elsewhere.sock"),
    }
    m = mounts(src, "6MiB", "--config", str(cfg), "--read-path", "pread", name="layers")
    m.env = env
    m.mount()
    st = m.status()  # at CACHE/metfs.sock
    assert (st["rf"], st["read_path"]) == (3, "pread"), st
    assert not (tmp_path / "elsewhere.sock").exists()
    # A value that does not fit is refused, naming the setting and the variable it came from.
    m.umount()
    bad = mounts(src, "6MiB", "--config", str(cfg), name="bad")
    bad.env = {**env, "METFS_CONTROL_MAX_CONNECTIONS": "0"}
    r = bad.mount(check=False)
    assert (
        r.returncode != 0
        and "control.max_connections" in r.stderr
        and "METFS_CONTROL_MAX_CONNECTIONS" in r.stderr
    ), r.stderr


def test_symlink_out_of_the_source_is_not_served(mounts, tmp_path):
    src = tmp_path / "tier"
    files = make_tree(src, n=30, max_size=1024)
    secret = tmp_path / "secret.txt"
    secret.write_text("not part of the dataset")
    (src / "cat" / "leak.bin").symlink_to(secret)
    target = sorted(p for p in (src / "dog").iterdir() if p.is_file())[0]
    (src / "cat" / "alias.bin").symlink_to(target)
    (src / "cat" / "dirlink").symlink_to(src / "dog")
    m = mounts(src, "6MiB", "--mini-epochs", "1")
    m.mount()
    view = m.files()["files"]
    assert "cat/leak.bin" not in view
    assert "cat/alias.bin" in view, "a symlink inside the source is served"
    assert (m.mountpoint / "cat" / "alias.bin").read_bytes() == target.read_bytes()
    assert set(view) == set(files) | {"cat/alias.bin"}
    assert not (m.mountpoint / "cat" / "leak.bin").exists()
    assert "leak.bin" in m.log() and "outside" in m.log()


def test_socket_rejects_bad_lines_and_stays_up(mounts, dataset):
    src, _ = dataset
    m = mounts(src, "6MiB")
    m.mount()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(m.socket)
        f = s.makefile("rwb")

        def ask(line: bytes) -> dict:
            f.write(line + b"\n")
            f.flush()
            return json.loads(f.readline())

        assert ask(b"{not json")["error"]["code"] == "bad_json"
        assert ask(b'{"op": "format_disk"}')["error"]["code"] == "unknown_op"
        assert ask(b'{"no_op": 1}')["error"]["code"] == "unknown_op"
        assert (
            ask(b'{"op": "pass_end", "metrics": {"loss": "low"}}')["error"]["code"] == "bad_metrics"
        )
        assert ask(b'{"op": "advance", "wait": "soon"}')["error"]["code"] == "bad_request"
        assert ask(b"x" * (2 << 20))["error"]["code"] == "line_too_long"
        assert ask(b"\xff\xfe")["error"]["code"] == "bad_json"
        r = ask(b'{"op": "hello", "version": 1}')
        assert r["ok"] and r["protocol"] == 1
        assert ask(b'{"op": "hello", "version": 99}')["error"]["code"] == "unsupported_version"
        assert ask(b'{"op": "status"}')["ok"], "the connection is still usable"
    assert m.status()["pass"] == 0, "bad requests changed nothing"


def test_a_silent_direct_readers_lease_expires_and_lets_the_slot_go(mounts, dataset, tmp_path):
    """A trainer that holds a lease (`files` with `direct`) and then goes silent (stopped, hung)
    pins its view only until the daemon closes its idle connection: the retired slot then
    drains and the next mini-epoch stages. A reader that keeps asking keeps its lease."""
    src, _ = dataset
    cfg = tmp_path / "idle.toml"
    cfg.write_text("[control]\nidle_timeout_secs = 2\n")
    m = mounts(src, "4MiB", "--rf", "1", "--config", str(cfg))
    m.mount()
    m.wait_next_ready()
    silent = socket.socket(socket.AF_UNIX)
    silent.connect(m.socket)
    silent.sendall(b'{"op": "files", "direct": true}\n')
    buf = b""
    while not buf.endswith(b"\n"):
        buf += silent.recv(1 << 20)
    r = json.loads(buf)
    assert r["ok"] and r["direct_root"], r
    leased = r["generation"]
    first = r["files"][0]
    assert (Path(r["direct_root"]) / first).read_bytes() == (src / first).read_bytes()
    assert m.rpc({"op": "advance", "wait": True}, timeout=60)["decision"] == "advance"
    held = [d for d in m.status()["draining"] if d["generation"] == leased]
    assert held and held[0]["leases"] == 1, m.status()["draining"]
    # The copy is still there while the lease holds.
    assert (Path(r["direct_root"]) / first).read_bytes() == (src / first).read_bytes()
    t = time.monotonic()
    wait_for(
        lambda: not m.status()["draining"], timeout=30, what="the silent reader's lease to expire"
    )
    # The daemon closed the silent connection (2 s idle), which ended the lease.
    silent.settimeout(5)
    assert silent.recv(1) == b""
    assert time.monotonic() - t < 20
    # Forgotten by the view first, then its slot deleted.
    wait_for(
        lambda: not Path(r["direct_root"]).exists(), timeout=30, what="the retired slot's eviction"
    )
    silent.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="connects as a second user")
def test_direct_paths_are_refused_to_a_user_who_cannot_read_the_cache(mounts, dataset, tmp_path):
    """The socket is 0600, so only the daemon's user (or root) connects; were it opened wider,
    a `files` with `direct` from another user is still refused (`not_permitted`, naming the
    mount to read through instead), and takes no lease. Their ordinary `files` is answered."""
    src, _ = dataset
    if subprocess.run(["id", "-u", "nobody"], capture_output=True).returncode != 0:
        pytest.skip("no user nobody")
    m = mounts(src, "4MiB", "--rf", "1")
    m.mount()
    # The socket opened to everyone, outside the (private) cache directory: a hard link in a
    # directory another user can reach.
    sockdir = Path(tempfile.mkdtemp(prefix="metfs-sock-", dir="/tmp"))
    sockdir.chmod(0o755)
    sock = sockdir / "metfs.sock"
    os.link(m.socket, sock)
    os.chmod(sock, 0o666)
    probe = (
        "import json, socket, sys\n"
        "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
        "out = []\n"
        'for req in (b\'{"op": "files", "direct": true}\', b\'{"op": "files"}\'):\n'
        "    s.sendall(req + b'\\n'); buf = b''\n"
        "    while not buf.endswith(b'\\n'): buf += s.recv(1 << 20)\n"
        "    out.append(json.loads(buf))\n"
        "print(json.dumps(out))\n"
    )
    r = subprocess.run(
        ["runuser", "-u", "nobody", "--", "/usr/bin/python3", "-c", probe, str(sock)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    direct, plain = json.loads(r.stdout)
    assert direct["ok"] is False and direct["error"]["code"] == "not_permitted", direct
    assert str(m.mountpoint) in direct["error"]["message"], direct
    assert plain["ok"] is True and plain["files"] and plain.get("direct_root") is None, plain
    assert all(d["leases"] == 0 for d in m.rpc({"op": "status"})["draining"])
    shutil.rmtree(sockdir, ignore_errors=True)
