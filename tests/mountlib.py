"""One real metfs mount, for the end-to-end tests (tests/, bindings/python/tests/) and the
benchmarks (benches/): the command line built from keyword settings, the mount, the wait until
the daemon is ready, the control socket, the logs, and a cleanup that leaves nothing behind.

    from mountlib import Mount

    with Mount(src, cache, mnt, budget="8MiB", mini_epochs=2, read_path="pread") as m:
        m.status()["epoch"]

A setting `mini_epochs=2` is the flag `--mini-epochs 2`; `True` is the bare flag, `False` or
`None` leaves it out, a list repeats it. Flags given as strings (`args`) follow the settings.
`metfs mount` returns once the first mini-epoch is staged and the daemon serves the mount (its
own answer that it is ready); `mount()` then checks that the mountpoint is mounted.

`tests/` has this directory on `sys.path` from the repository's root conftest.py; the benchmarks
and bindings/python/tests put it there as they do for the rest of `tests/`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket as socketlib
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Union

ROOT = Path(__file__).resolve().parents[1]

#: A setting's value: a flag's argument, `True` for a bare flag, `False`/`None` for none, a
#: list for a repeated flag.
Setting = Union[str, int, float, Path, bool, None, Sequence[Union[str, int, float, Path]]]


def metfs_bin() -> str:
    """The metfs binary under test: `METFS_BIN`, else the debug build."""
    return os.environ.get("METFS_BIN") or str(ROOT / "target" / "debug" / "metfs")


def flags(settings: Mapping[str, Setting]) -> list[str]:
    """Command-line flags of keyword settings, in their order: `mini_epochs=2` is
    `--mini-epochs 2`, `allow_other=True` is `--allow-other`, `False`/`None` is nothing and a
    list repeats the flag."""
    out: list[str] = []
    for key, value in settings.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
        elif isinstance(value, (str, int, float, Path)):
            out += [flag, str(value)]
        else:
            for v in value:
                out += [flag, str(v)]
    return out


def _unescape(field: str) -> str:
    """A path as /proc's mount tables write it (space, tab, newline, backslash in octal)."""
    for code, ch in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, ch)
    return field


def is_mounted(path: str | Path) -> bool:
    """Whether `path` is a mount point, from /proc/self/mountinfo (a dead FUSE mount, or another
    user's, cannot even be stat'ed, by root neither)."""
    want = {os.path.abspath(path), os.path.realpath(path)}
    with open("/proc/self/mountinfo") as f:
        return any(_unescape(line.split(" ")[4]) in want for line in f)


def rpc(sock: str | Path, req: Mapping[str, Any], timeout: float = 120) -> dict[str, Any]:
    """One request on a daemon's control socket and its reply."""
    with socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(sock))
        s.sendall((json.dumps(req) + "\n").encode())
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            buf += chunk
    out: dict[str, Any] = json.loads(buf)
    return out


def daemon_pids(mountpoint: str | Path) -> list[int]:
    """Pids of metfs processes whose command line names this (unique, per-test) mountpoint."""
    pids = []
    targets = {os.fsencode(os.path.abspath(mountpoint)), os.fsencode(os.path.realpath(mountpoint))}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if (
            args
            and os.path.basename(args[0]) == b"metfs"
            and b"mount" in args
            and targets.intersection(args)
        ):
            pids.append(int(entry))
    return pids


class Mount:
    """A metfs mount of `source` with its cache in `cache` on `mountpoint`.

    `metfs`: the binary (default `metfs_bin()`). `args`: flags as strings, after the settings.
    `env`: the environment of `metfs mount` and `metfs umount`. `user`: both run as this user
    (`runuser -u USER --`), and the cache and mountpoint are given to them. `owner`: the cache
    and mountpoint are given to this user (default `user`). `fresh`: entering the context
    starts from an empty cache. `log_file`: the output of `metfs mount` is appended there
    instead of being returned. `preexec_fn`: run in the child before `metfs mount` (a resource
    limit). `**settings`: the mount's settings as keywords (see `flags`); `socket` names the
    control socket, else it is `<cache>/metfs.sock`.
    """

    def __init__(
        self,
        source: str | Path | None,
        cache: str | Path,
        mountpoint: str | Path,
        *,
        metfs: str | Path | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        user: str = "",
        owner: str = "",
        fresh: bool = False,
        log_file: str | Path | None = None,
        preexec_fn: Callable[[], None] | None = None,
        **settings: Setting,
    ) -> None:
        self.bin = str(metfs or metfs_bin())
        self.source = None if source is None else str(source)
        self.cache = Path(cache)
        self.mountpoint = Path(mountpoint)
        self.args = list(args)
        self.env = dict(env) if env is not None else None
        self.user = user
        self.owner = owner or user
        self.fresh = fresh
        self.log_file = Path(log_file) if log_file is not None else None
        self.preexec_fn = preexec_fn
        self.settings: dict[str, Setting] = dict(settings)
        #: Whether a `metfs mount` of this object succeeded.
        self.mount_ok = False
        #: `(exit code, output)` of the last `metfs umount` that `close` ran.
        self.umount_result: tuple[int, str] | None = None
        #: What `close` found still mounted or running after `metfs umount`.
        self.leftovers: list[str] = []

    # ---- the command line -------------------------------------------------------------------

    @property
    def prefix(self) -> list[str]:
        return ["runuser", "-u", self.user, "--"] if self.user else []

    def command(self) -> list[str]:
        """`metfs mount` with the source, the cache, the settings, `args` and the mountpoint."""
        where: dict[str, Setting] = {"source": self.source, "cache": self.cache}
        return [
            *self.prefix,
            self.bin,
            "mount",
            *flags(where),
            *flags(self.settings),
            *self.args,
            str(self.mountpoint),
        ]

    @property
    def socket(self) -> str:
        sock = self.settings.get("socket")
        return str(sock) if isinstance(sock, (str, Path)) else str(self.cache / "metfs.sock")

    # ---- mounting ---------------------------------------------------------------------------

    def prepare(self, fresh: bool = False) -> None:
        """Makes the cache and the mountpoint and gives them to `owner`; with `fresh`, unmounts
        and empties the cache first (an earlier run's slots)."""
        if fresh:
            self.close()
            shutil.rmtree(self.cache, ignore_errors=True)
        self.cache.mkdir(parents=True, exist_ok=True)
        if not is_mounted(self.mountpoint):  # a dead mount cannot even be stat'ed
            self.mountpoint.mkdir(parents=True, exist_ok=True)
        if self.owner:
            for d in (self.cache, self.mountpoint):
                subprocess.run(["chown", "-R", self.owner, str(d)], check=True)

    def _ensure_dirs(self) -> None:
        """`prepare` where the cache or the mountpoint is missing."""
        if not self.cache.is_dir() or not (is_mounted(self.mountpoint) or self.mountpoint.is_dir()):
            self.prepare()

    def spawn(self, **kw: Any) -> subprocess.Popen[str]:
        """Starts `metfs mount` and returns at once (a test that kills the daemon while it
        stages the first mini-epoch)."""
        self._ensure_dirs()
        return subprocess.Popen(
            self.command(), env=self.env, preexec_fn=self.preexec_fn, text=True, **kw
        )

    def mount(
        self, check: bool = True, timeout: float = 300, argv: Sequence[str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Runs `metfs mount` (`argv` in place of `command()`), which returns once the first
        mini-epoch is staged and the mount served. With `check`, a failure, or a mountpoint not
        mounted after success, raises with the command's output and the daemon's log."""
        self._ensure_dirs()
        cmd = list(argv) if argv is not None else self.command()
        with contextlib.ExitStack() as stack:
            # Into `log_file` (output and errors), else returned.
            out: Any = subprocess.PIPE
            if self.log_file is not None:
                out = stack.enter_context(open(self.log_file, "ab"))
            r = subprocess.run(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT if self.log_file is not None else subprocess.PIPE,
                text=True,
                env=self.env,
                timeout=timeout,
                preexec_fn=self.preexec_fn,
            )
        r.stdout, r.stderr = r.stdout or "", r.stderr or ""
        if check:
            if r.returncode != 0:
                raise AssertionError(
                    f"`{' '.join(cmd)}` exited {r.returncode}: {r.stderr}\nlog:\n{self.log()}"
                )
            if not is_mounted(self.mountpoint):
                raise AssertionError(
                    f"metfs mount exited 0 but {self.mountpoint} is not mounted\n{self.log()}"
                )
        # The last mount's outcome: a refused remount is not judged by its umount.
        self.mount_ok = r.returncode == 0
        return r

    def umount(self, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """`metfs umount`; with `check`, one that fails raises."""
        r = subprocess.run(
            [*self.prefix, self.bin, "umount", str(self.mountpoint)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
        )
        if check:
            assert r.returncode == 0, r.stderr
        return r

    def daemon_pids(self) -> list[int]:
        """Every metfs process that names this mountpoint, and the daemon's pid from its lock
        file while that process is a metfs."""
        pids = daemon_pids(self.mountpoint)
        try:
            pid = self.pid()
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            if pid not in pids and os.path.basename(argv0) == b"metfs":
                pids.append(pid)
        except (OSError, ValueError):
            pass
        return pids

    def close(self, wait: float = 10) -> None:
        """Unmounts and stops the daemon; never raises, and leaves no mount and no daemon: after
        `metfs umount`, what is left `wait` seconds later is unmounted lazily and killed (and
        named in `leftovers`)."""
        if not is_mounted(self.mountpoint) and not self.daemon_pids():
            return  # already gone (the test unmounted, or shut the daemon down)
        # Not mounted but a daemon left: a mount that was just refused, whose daemon is still
        # on its way out. `metfs umount` would rightly answer "not a metfs mount"; wait for it.
        if is_mounted(self.mountpoint):
            try:
                r = self.umount(check=False)
                self.umount_result = (r.returncode, r.stdout + r.stderr)
            except (OSError, subprocess.TimeoutExpired) as e:
                self.umount_result = (-1, str(e))
        end = time.monotonic() + wait
        while time.monotonic() < end and (is_mounted(self.mountpoint) or self.daemon_pids()):
            time.sleep(0.05)
        if is_mounted(self.mountpoint):
            self.leftovers.append(f"{self.mountpoint} still mounted {wait:.0f} s after umount")
            subprocess.run(["umount", "-l", str(self.mountpoint)], capture_output=True)
        for pid in self.daemon_pids():
            self.leftovers.append(f"daemon pid {pid} still running {wait:.0f} s after umount")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def __enter__(self) -> Mount:
        try:
            if self.fresh:
                self.prepare(fresh=True)
            self.mount()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            print(f"metfs log of {self.mountpoint}:\n{self.log()}", file=sys.stderr)
        self.close()

    # ---- the daemon -------------------------------------------------------------------------

    def log(self) -> str:
        """The end of the daemon's log (and of `log_file`, where `metfs mount` wrote)."""
        out = ""
        for p in (self.log_file, self.cache / "metfs.log"):
            if p is not None and p.exists():
                out += p.read_text(errors="replace")[-8000:]
        return out

    def pid(self) -> int:
        """The daemon's pid, from its lock file."""
        return int((self.cache / "metfs.lock").read_text().strip())

    def rpc(self, req: Mapping[str, Any], timeout: float = 120) -> dict[str, Any]:
        return rpc(self.socket, req, timeout)

    def _ok(self, req: Mapping[str, Any]) -> dict[str, Any]:
        r = self.rpc(req)
        assert r["ok"], r
        return r

    def status(self) -> dict[str, Any]:
        return self._ok({"op": "status"})

    def files(self) -> dict[str, Any]:
        return self._ok({"op": "files"})

    def pass_end(self, **kw: Any) -> dict[str, Any]:
        return self._ok({"op": "pass_end", **kw})

    def wait_next_ready(self, timeout: float | None = 60) -> None:
        """Waits until the next mini-epoch is staged."""
        t = time.monotonic()
        while timeout is None or time.monotonic() - t < timeout:
            if self.status()["next_ready"]:
                return
            time.sleep(0.05)
        raise AssertionError(f"next mini-epoch not staged after {timeout}s: {self.status()}")

    def slot_dir(self, epoch: int | None = None, mini_epoch: int | None = None) -> Path:
        """The cache's slot of a mini-epoch (default: the one the mount shows)."""
        if epoch is None or mini_epoch is None:
            st = self.status()
            epoch, mini_epoch = st["epoch"], st["mini_epoch"]
        return self.cache / "slots" / f"e{epoch:06d}-m{mini_epoch:05d}"
