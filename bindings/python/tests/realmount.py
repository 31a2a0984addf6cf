"""A real metfs daemon on a real FUSE mount, for the integration tests.

:func:`metfs_binary` builds the daemon (``cargo build -p metfs``) or takes ``METFS_BIN``.
:class:`RealMount` makes a dataset with ``scripts/make_dataset.py`` and mounts it with the
:class:`Mount` that the tests at the repository's root and the benchmarks use (tests/mountlib.py,
which conftest.py puts on ``sys.path``): ``metfs mount``, and in :meth:`RealMount.close`
``metfs umount``, falling back to a lazy unmount and stopping the daemon if that does not clean
up.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from types import ModuleType
from typing import TYPE_CHECKING

from mountlib import Mount, is_mounted
from mountlib import daemon_pids as _daemon_pids

if TYPE_CHECKING:
    from typing import Self

__all__ = ["REPO", "Mount", "RealMount", "_daemon_pids", "dataset_module", "is_mounted"]

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


class RealMount:
    """A dataset on a local "capacity tier" directory, mounted by a real metfs daemon: the
    dataset made here, the mount by tests/mountlib.py's :class:`Mount` (in :attr:`mount_`).

    Paths are strings; :attr:`args` is the whole ``metfs mount`` command line, which a test may
    change (the mountpoint last) before :meth:`mount` runs it again.
    """

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
        self.root = root
        self.source = os.path.join(root, "source")
        self.cache = os.path.join(root, "cache")
        self.mountpoint = os.path.join(root, "mnt")
        self.val = os.path.join(root, "val") if val else None
        self.socket = os.path.join(root, "ctl.sock")
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
        self.log_path = os.path.join(root, "mount.log")
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "info")
        self.mount_ = Mount(
            self.source,
            self.cache,
            self.mountpoint,
            metfs=metfs_binary(),
            env=env,
            log_file=self.log_path,
            args=extra_args or [],
            budget=budget,
            mini_epochs=mini_epochs,
            rf=rf,
            compose=compose,
            seed=seed,
            socket=self.socket,
        )
        self.bin = self.mount_.bin
        self.args = self.mount_.command()

    @property
    def mount_ok(self) -> bool:
        """Whether ``metfs mount`` succeeded."""
        return self.mount_.mount_ok

    @property
    def umount_result(self) -> tuple[int, str] | None:
        """``(exit code, output)`` of ``metfs umount``, once :meth:`close` ran it."""
        return self.mount_.umount_result

    @property
    def leftovers(self) -> list[str]:
        """What was still mounted or running after ``metfs umount`` returned."""
        return self.mount_.leftovers

    def mount(self, timeout: float = 120.0) -> None:
        """Runs :attr:`args` (returns once mini-epoch 0 is staged and the mount served)."""
        r = self.mount_.mount(check=False, timeout=timeout, argv=self.args)
        if r.returncode != 0:
            raise RuntimeError(f"`{' '.join(self.args)}` exited {r.returncode}:\n{self.log()}")
        if not is_mounted(self.mountpoint):
            raise RuntimeError(f"metfs mount returned 0 but {self.mountpoint} is not mounted")

    def log(self) -> str:
        """The output of ``metfs mount`` and the end of the daemon's log."""
        return self.mount_.log()

    def close(self) -> None:
        """Unmounts and stops the daemon; never raises, always leaves no mount behind."""
        self.mount_.close()

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
