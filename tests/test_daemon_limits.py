"""End-to-end tests of the daemon's own promises under hostile conditions: a full cache disk,
the budget at every instant of a switch, a cache inside the source, overflowing manifests, a
corrupt ``state.json``, the control socket's connection cap, and bad CLI input."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import is_mounted, make_tree, read_view, wait_for


@pytest.fixture
def tmpfs(tmp_path):
    """Mounts small tmpfs filesystems; unmounted (lazily) at teardown. Name it before `mounts`
    in a test's arguments, so that the metfs mounts (whose sockets live in the cache) are
    unmounted first."""
    made: list[Path] = []

    def make(name: str, size: str) -> Path:
        p = tmp_path / name
        p.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(p)], check=True)
        made.append(p)
        return p

    yield make
    for p in reversed(made):
        subprocess.run(["umount", "-l", str(p)], capture_output=True)


def fill(path: Path) -> Path:
    """Writes a file in `path` until its filesystem is full."""
    filler = path / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for chunk in (64 << 10, 4096, 512):
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not reaped) counts as dead.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ", 1)[1][0] != "Z"


# ---- a full cache disk (the log on it) ----------------------------------------------------

def test_full_cache_disk_does_not_kill_the_daemon(tmpfs, mounts, tmp_path, metfs):
    src = tmp_path / "tier"
    files = make_tree(src, n=60, max_size=16 * 1024)
    cache = tmpfs("cache", "8m")
    m = mounts(src, "6MiB", "--rf", "1", "--mini-epochs", "3", "--compose", "sequential", cache=cache)
    m.mount()
    pid = m.pid()
    m.wait_next_ready()
    filler = fill(cache)
    # Every one of these logs; with the log file on the full disk, none may be fatal.
    for _ in range(3):
        r = subprocess.run([metfs, "advance", "--socket", m.socket], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        m.status()
        time.sleep(0.3)
    assert alive(pid), "the daemon died on a full cache disk"
    assert is_mounted(m.mountpoint)
    view = read_view(m.mountpoint)
    assert view and all(files[k] == v for k, v in view.items())
    assert set(view) == set(m.files()["files"])
    # Space comes back: the daemon stages and switches again, and logs again.
    filler.unlink()
    gen = m.status()["generation"]
    r = subprocess.run([metfs, "advance", "--wait", "--socket", m.socket], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["generation"] == gen + 1
    view = read_view(m.mountpoint)
    assert view and all(files[k] == v for k, v in view.items())
    assert alive(pid)
    wait_for(lambda: "log lines dropped" in m.log(), timeout=10, what="the log to report its dropped lines")
