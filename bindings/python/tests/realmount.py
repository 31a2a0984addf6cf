"""A real metfs daemon on a real FUSE mount, for the integration tests.

:func:`metfs_binary` builds the daemon (``cargo build -p metfs``) or takes ``METFS_BIN``.
:class:`RealMount` makes a dataset with ``scripts/make_dataset.py``, mounts it with
``metfs mount`` and always unmounts in :meth:`RealMount.close`, falling back to a lazy unmount
and stopping the daemon it started if ``metfs umount`` does not clean up.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Self

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))

_built: dict[str, str] = {}


def metfs_binary() -> str:
    """Path of the metfs binary: ``METFS_BIN``, else built once with ``cargo build -p metfs``."""
    env = os.environ.get("METFS_BIN")
    if env:
        if not os.access(env, os.X_OK):
            raise RuntimeError(f"METFS_BIN={env} is not an executable file")
        return env
    if "bin" not in _built:
        proc = subprocess.run(
            ["cargo", "build", "-p", "metfs"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"cargo build -p metfs failed:\n{proc.stdout[-4000:]}")
        _built["bin"] = os.path.join(REPO, "target", "debug", "metfs")
    return _built["bin"]


def dataset_module() -> ModuleType:
    """``scripts/make_dataset.py`` imported as a module."""
    if "make_dataset" in sys.modules:
        return sys.modules["make_dataset"]
    path = os.path.join(REPO, "scripts", "make_dataset.py")
    spec = importlib.util.spec_from_file_location("make_dataset", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["make_dataset"] = mod
    spec.loader.exec_module(mod)
    return mod


def is_mounted(mountpoint: str) -> bool:
    """Whether ``mountpoint`` appears in /proc/self/mounts."""
    target = os.path.realpath(mountpoint)
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 1 and parts[1].replace("\\040", " ") == target:
                return True
    return False


def _daemon_pids(mountpoint: str) -> list[int]:
    """Pids of metfs processes whose command line names this (unique, per-test) mountpoint."""
    pids = []
    target = os.path.realpath(mountpoint).encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if args and os.path.basename(args[0]) == b"metfs" and b"mount" in args and target in args:
            pids.append(int(entry))
    return pids


class RealMount:
    """A dataset on a local "capacity tier" directory, mounted by a real metfs daemon."""

    def __init__(
        self,
        root: str,
        *,
        per_class: int = 30,
        classes: int = 10,
        mini_epochs: int = 3,
        rf: int = 2,
        budget: str | None = None,
        seed: int = 1,
        compose: str = "random",
        extra_args: list[str] | None = None,
        val: bool = False,
    ) -> None:
        self.bin = metfs_binary()
        self.root = root
        self.source = os.path.join(root, "source")
        self.cache = os.path.join(root, "cache")
        self.mountpoint = os.path.join(root, "mnt")
        self.val = os.path.join(root, "val") if val else None
        self.socket = os.path.join(root, "ctl.sock")
        os.makedirs(self.cache, exist_ok=True)
        os.makedirs(self.mountpoint, exist_ok=True)
        ds = dataset_module()
        self.stats = ds.make_dataset(
            self.source, classes, per_class, seed, self.val, val_per_class=10
        )
        self.source_files = sorted(
            os.path.relpath(os.path.join(d, f), self.source)
            for d, _, fs in os.walk(self.source)
            for f in fs
        )
        if budget is None:
            # Room for two mini-epochs of the largest plausible size (files differ in size, so
            # the planner's mini-epochs do not split bytes perfectly evenly), plus metadata.
            per_mini = self.stats["train_bytes"] // mini_epochs
            budget = str(4 * per_mini + (8 << 20))
        self.args = [
            self.bin,
            "mount",
            "--source",
            self.source,
            "--cache",
            self.cache,
            "--budget",
            budget,
            "--mini-epochs",
            str(mini_epochs),
            "--rf",
            str(rf),
            "--compose",
            compose,
            "--seed",
            str(seed),
            "--socket",
            self.socket,
            *(extra_args or []),
            self.mountpoint,
        ]
        self.log_path = os.path.join(root, "mount.log")
        self._mounted = False
        #: Whether ``metfs mount`` succeeded.
        self.mount_ok = False
        #: ``(exit code, output)`` of ``metfs umount``, once :meth:`close` ran it.
        self.umount_result: tuple[int, str] | None = None
        #: Whether something was still mounted or running after ``metfs umount`` returned.
        self.leftovers: list[str] = []

    def mount(self, timeout: float = 120.0) -> None:
        """Runs ``metfs mount`` (returns once mini-epoch 0 is staged)."""
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "info")
        with open(self.log_path, "ab") as log:
            proc = subprocess.run(
                self.args,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                timeout=timeout,
                check=False,
            )
        self._mounted = True  # even a failed mount may have left something to clean up
        if proc.returncode != 0:
            raise RuntimeError(f"`{' '.join(self.args)}` exited {proc.returncode}:\n{self.log()}")
        if not is_mounted(self.mountpoint):
            raise RuntimeError(f"metfs mount returned 0 but {self.mountpoint} is not mounted")
        self.mount_ok = True

    def log(self) -> str:
        """The output of ``metfs mount`` (and of the daemon, if it writes there)."""
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-8000:]
        except OSError:
            return ""

    def close(self) -> None:
        """Unmounts and stops the daemon; never raises, always leaves no mount behind."""
        if not self._mounted:
            return
        self._mounted = False
        if not is_mounted(self.mountpoint) and not _daemon_pids(self.mountpoint):
            return  # already gone (e.g. the test shut the daemon down)
        try:
            proc = subprocess.run(
                [self.bin, "umount", self.mountpoint],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=60,
                check=False,
            )
            self.umount_result = (proc.returncode, proc.stdout)
        except (OSError, subprocess.TimeoutExpired) as e:
            self.umount_result = (-1, str(e))
        end = time.monotonic() + 10
        while time.monotonic() < end and (
            is_mounted(self.mountpoint) or _daemon_pids(self.mountpoint)
        ):
            time.sleep(0.1)
        if is_mounted(self.mountpoint):
            self.leftovers.append(f"{self.mountpoint} still mounted 10 s after metfs umount")
            subprocess.run(["umount", "-l", self.mountpoint], check=False)
        for pid in _daemon_pids(self.mountpoint):
            self.leftovers.append(f"daemon pid {pid} still running 10 s after metfs umount")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def __enter__(self) -> Self:
        try:
            self.mount()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def view_files(self) -> list[str]:
        """The files the mount shows now, relative, sorted (read through the mount)."""
        return sorted(
            os.path.relpath(os.path.join(d, f), self.mountpoint)
            for d, _, fs in os.walk(self.mountpoint)
            for f in fs
        )
