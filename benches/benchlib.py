"""Helpers the benchmarks share: which binaries they run (and building them), the page cache,
the daemon's socket, mounts (tests/mountlib.py's `Mount`, the tests' own), unmounting,
medians, ratios and timing.

The binaries: `METFS_BIN` names the metfs binary under test, and the examples and
`metfs-shuffle` are taken from beside it (`<dir>/examples/<name>`, `<dir>/metfs-shuffle`), as
built by the same `cargo build` (the test command's debug build: a `--quick` run builds
nothing then). Without it, the release build in `target/release`, built first.

    import benchlib                       # beside the script: benches/ is on sys.path
    benchlib.build(bins=["metfs"], examples=["readbench"])
    metfs = benchlib.metfs_bin()
    with benchlib.Mount(src, cache, mnt, metfs=metfs, budget="1GiB") as m: ...
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RELEASE = ROOT / "target" / "release"

# The tests' mount, control socket and mount table (and, for the scripts that run servers, the
# rest of tests/: conftest's Etcd and free ports).
sys.path.insert(0, str(ROOT / "tests"))
import mountlib  # noqa: E402
from mountlib import Mount, is_mounted  # noqa: E402

__all__ = ["Mount", "is_mounted"]


def metfs_bin() -> Path:
    """The metfs binary under test: `METFS_BIN`, else the release build."""
    env = os.environ.get("METFS_BIN")
    return Path(env) if env else RELEASE / "metfs"


def bin_dir() -> Path:
    """The directory of the binaries under test (a Cargo profile's directory)."""
    return metfs_bin().parent


def example_bin(name: str) -> Path:
    """A Cargo example built with the binary under test."""
    return bin_dir() / "examples" / name


def shuffle_bin() -> Path:
    """`metfs-shuffle` (metfs-exchange with its `mpi` feature) beside the binary under test."""
    return bin_dir() / "metfs-shuffle"


def build(
    package: str = "metfs",
    bins: Sequence[str] = ("metfs",),
    examples: Sequence[str] = (),
    features: Sequence[str] = (),
) -> None:
    """Builds what a benchmark runs. With `METFS_BIN` set, only what is missing beside it, in
    that directory's profile (the test command has built everything: nothing runs); else the
    release build (cargo is quick when it is up to date)."""
    cmd = ["cargo", "build", "-q", "-p", package]
    for f in features:
        cmd += ["--features", f]
    for b in bins:
        cmd += ["--bin", b]
    for e in examples:
        cmd += ["--example", e]
    if "METFS_BIN" in os.environ:
        want = [bin_dir() / b for b in bins] + [example_bin(e) for e in examples]
        if all(p.exists() for p in want):
            return
        profile = bin_dir().name
        if bin_dir().parent != ROOT / "target" or profile not in ("debug", "release"):
            missing = ", ".join(str(p) for p in want if not p.exists())
            raise SystemExit(f"not built: {missing} (METFS_BIN={metfs_bin()})")
        if profile == "release":
            cmd.append("--release")
    else:
        cmd.append("--release")
    subprocess.run(cmd, cwd=ROOT, check=True)


def drop_caches(strict: bool = False) -> bool:
    """Writes dirty pages out and drops the page cache (root only). Returns whether it was
    dropped; with `strict`, not being able to is an error."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        if strict:
            raise
        return False


def rpc(sock: str | Path, req: dict[str, Any], timeout: float = 600) -> dict[str, Any]:
    """One request on a daemon's control socket and its reply."""
    return mountlib.rpc(sock, req, timeout)


def rpc_ok(sock: str | Path, req: dict[str, Any], timeout: float = 600) -> dict[str, Any]:
    """`rpc`, with a refusal raised: for a benchmark whose every request must succeed."""
    r = rpc(sock, req, timeout)
    if not r.get("ok"):
        raise RuntimeError(f"metfs {req.get('op')}: {r}")
    return r


def umount(mnt: Path, prefix: Sequence[str] = (), metfs: Path | None = None) -> None:
    """`metfs umount` (run behind `prefix`, e.g. `runuser -u USER --`; `metfs`, else the binary
    under test), then a lazy unmount if that did not do it; nothing when `mnt` is not mounted."""
    if is_mounted(mnt):
        exe = str(metfs or metfs_bin())
        subprocess.run([*prefix, exe, "umount", str(mnt)], capture_output=True)
        if is_mounted(mnt):
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def python_env(**extra: str) -> dict[str, str]:
    """The environment of a Python job that imports `metfs` from this tree."""
    return dict(os.environ, PYTHONPATH=str(ROOT / "bindings" / "python" / "src"), **extra)


def mpi_env() -> dict[str, str]:
    """The environment of `mpirun` on this one machine: as root, more ranks than cores."""
    return dict(
        os.environ,
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMPI_MCA_rmaps_base_oversubscribe="1",
    )


def med(xs: Iterable[float]) -> float:
    return statistics.median(xs)


def ratio(a: float, b: float, digits: int = 2) -> str:
    """`a / b` as `1.23x`; `n/a` when `b` is zero."""
    return f"{a / b:.{digits}f}x" if b else "n/a"


def timed(fn: Callable[[], Any]) -> float:
    """Seconds `fn()` took."""
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def parse_size(s: str) -> int:
    """`8MiB`, `512KiB`, `1GiB` or a number of bytes."""
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, f in units.items():
        if s.endswith(u):
            return int(float(s[: -len(u)]) * f)
    return int(s)
