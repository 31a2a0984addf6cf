"""The wheel as a user gets it: `scripts/wheel.sh`'s `dist/metfs-*.whl` installed into a fresh
virtual environment, run from a PATH without cargo or rustc.

`scripts/test.sh` builds the wheel and names it in ``METFS_WHEEL``. Without it these tests are
skipped, unless ``METFS_REQUIRE_SERVERS`` is set (as the test command sets it), where a missing
wheel fails: the test command can never skip them silently.

What is checked: the binary and the package carry one version; a mount of a small dataset and
a pass loop with ``import metfs`` from the environment (not from this tree); the HDF5 container
test's case with the wheel's binary, whose HDF5 is linked statically; the demo from the
installed wheel; and a clear error, never a panic, on a node without FUSE in its kernel or
without ``fusermount3`` for an ordinary user.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

from conftest import ROOT, Mount, is_mounted, make_tree

WHEEL = os.environ.get("METFS_WHEEL")
USER = "metfs-user"

if not WHEEL:
    if os.environ.get("METFS_REQUIRE_SERVERS", "0") not in ("", "0"):
        raise RuntimeError(
            "METFS_WHEEL is unset: scripts/test.sh builds the wheel (scripts/wheel.sh) and names it there"
        )
    pytest.skip(
        "no wheel: METFS_WHEEL is unset (scripts/wheel.sh builds one)", allow_module_level=True
    )


def run(
    cmd: list[str],
    env: dict[str, str],
    ok: bool = True,
    timeout: float = 600,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    if ok:
        assert r.returncode == 0, (
            f"{cmd}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        )
    return r


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh virtual environment (no system site packages) with the wheel installed, plus
    what the checks below need from PyPI: pytest, numpy and h5py."""
    d = tmp_path_factory.mktemp("wheel") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(d)], check=True)
    pip = [str(d / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, str(WHEEL)], check=True)
    subprocess.run([*pip, "pytest", "numpy", "h5py", "scikit-learn"], check=True)
    yield d


def plain_env(venv: Path, **extra: str) -> dict[str, str]:
    """The environment a user of the wheel has: the venv first, then the system; no cargo."""
    env = {
        "PATH": f"{venv / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "VIRTUAL_ENV": str(venv),
        **extra,
    }
    for tool in ("cargo", "rustc"):
        assert shutil.which(tool, path=env["PATH"]) is None, f"{tool} is on the wheel's PATH"
    return env


def test_binary_and_package_share_one_version(venv: Path) -> None:
    env = plain_env(venv)
    exe = shutil.which("metfs", path=env["PATH"])
    assert exe == str(venv / "bin" / "metfs"), exe
    out = run(["metfs", "--version"], env).stdout.strip()
    code = "import metfs, sys; print(metfs.__version__); print(metfs.__file__)"
    version, where = run(["python", "-c", code], env, cwd=venv).stdout.split()
    assert out == f"metfs {version}", (out, version)
    assert where.startswith(str(venv)), f"metfs imported from {where}, not the environment"
    # HDF5 is inside the binary: nothing of the system's libhdf5 is linked.
    ldd = run(["ldd", str(venv / "bin" / "metfs")], env, ok=False).stdout
    assert "hdf5" not in ldd, ldd


PASS_LOOP = textwrap.dedent(
    """
    import hashlib, json, os, sys
    import metfs
    assert metfs.__file__.startswith(sys.prefix), metfs.__file__
    client = metfs.Client(sys.argv[1])
    seen = {}
    for p in metfs.passes(client, epochs=2):
        for rel, path in zip(p.files, p.paths, strict=True):
            with open(path, "rb") as f:
                seen[rel] = hashlib.sha256(f.read()).hexdigest()
        p.report(loss=1.0 / (1 + len(seen)))
    print(json.dumps(seen))
    """
)


def test_mount_and_pass_loop_from_the_wheel(venv: Path, tmp_path: Path) -> None:
    env = plain_env(venv)
    files = make_tree(tmp_path / "tier", n=120)
    mnt = tmp_path / "mnt"
    m = Mount(
        tmp_path / "tier", tmp_path / "cache", mnt, metfs="metfs", env=env, budget="2MiB", rf=2
    )
    m.mount()
    try:
        script = tmp_path / "loop.py"
        script.write_text(PASS_LOOP)
        out = run(["python", str(script), m.socket], env, cwd=tmp_path).stdout
        seen = json.loads(out.strip().splitlines()[-1])
        assert seen == {k: hashlib.sha256(v).hexdigest() for k, v in files.items()}, (
            "every sample, its bytes"
        )
    finally:
        m.close()
    assert not is_mounted(mnt)


def test_hdf5_containers_with_the_wheels_binary(venv: Path) -> None:
    """The HDF5 container test's case, its files written and read back by h5py from the
    environment, served by the wheel's statically linked HDF5."""
    env = plain_env(venv, METFS_BIN=str(venv / "bin" / "metfs"), PYTHONDONTWRITEBYTECODE="1")
    # A short base directory: the mount's control socket must fit in sun_path.
    base = Path(tempfile.mkdtemp(prefix="mw."))
    try:
        r = run(
            [
                "python",
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                f"--basetemp={base / 'p'}",
                str(ROOT / "tests" / "test_hdf5.py::test_container_mode_rows_per_mini_epoch"),
            ],
            env,
            ok=False,
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout[-4000:] + r.stderr[-2000:]


def test_demo_runs_from_the_installed_wheel(venv: Path, tmp_path: Path) -> None:
    env = plain_env(
        venv,
        METFS_DEMO_DIR=str(tmp_path / "demo"),
        EPOCHS="1",
        PER_CLASS="40",
        BUDGET="2MiB",
        RF="2",
    )
    r = run([str(ROOT / "scripts" / "demo.sh"), "--installed"], env, ok=False)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    assert f"== metfs: {venv / 'bin' / 'metfs'}" in r.stdout, r.stdout[:2000]
    assert not is_mounted(tmp_path / "demo" / "mnt")


def private_copy(venv: Path) -> Path:
    """The wheel's binary where an ordinary user can run it (pytest's directories are root's)."""
    d = Path(tempfile.mkdtemp(prefix="metfs-wheel-bin."))
    d.chmod(0o755)
    shutil.copy2(venv / "bin" / "metfs", d / "metfs")
    (d / "metfs").chmod(0o755)
    return d


def mount_in_namespace(setup: str, mount: str) -> subprocess.CompletedProcess[str]:
    """Runs `setup` then `mount` in a private mount namespace, so that what `setup` hides from
    the node (a file bound over another) is hidden from this command only."""
    script = f"set -e\n{setup}\n{mount}\n"
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.skipif(
    os.geteuid() != 0, reason="hiding FUSE from the node takes root (a mount namespace)"
)
def test_a_kernel_without_fuse_is_named_not_a_panic(venv: Path) -> None:
    bindir = private_copy(venv)
    work = Path(tempfile.mkdtemp(prefix="metfs-nofuse."))
    try:
        (work / "src").mkdir()
        (work / "src" / "a").write_bytes(b"x" * 100)
        (work / "mnt").mkdir()
        (work / "cache").mkdir()
        (work / "filesystems").write_text("nodev\tsysfs\nnodev\tproc\n\text4\n")
        r = mount_in_namespace(
            f"mount --bind {work / 'filesystems'} /proc/filesystems",
            f"{bindir / 'metfs'} mount --source {work / 'src'} --cache {work / 'cache'} --budget 1MiB {work / 'mnt'}",
        )
        assert r.returncode != 0, r.stdout
        assert "this kernel offers no FUSE (fuse is not in /proc/filesystems)" in r.stderr, r.stderr
        assert "modprobe fuse" in r.stderr and "panicked" not in r.stderr, r.stderr
    finally:
        shutil.rmtree(bindir)
        shutil.rmtree(work)


@pytest.mark.skipif(
    os.geteuid() != 0, reason="hiding fusermount3 from the node takes root (a mount namespace)"
)
def test_a_user_without_fusermount3_is_told_which_package(venv: Path) -> None:
    if subprocess.run(["id", "-u", USER], capture_output=True).returncode != 0:
        pytest.skip(f"no user {USER} (scripts/test.sh makes it)")
    bindir = private_copy(venv)
    work = Path(tempfile.mkdtemp(prefix="metfs-nohelper."))
    try:
        work.chmod(0o755)
        (work / "src").mkdir()
        (work / "src" / "a").write_bytes(b"x" * 100)
        (work / "mnt").mkdir()
        (work / "cache").mkdir()
        blank = work / "blank"
        blank.write_bytes(b"")
        blank.chmod(0o644)
        subprocess.run(["chown", "-R", USER, str(work)], check=True)
        helpers = [
            p
            for p in ("/usr/bin/fusermount3", "/usr/bin/fusermount", "/usr/sbin/fusermount3")
            if os.path.exists(p)
        ]
        assert helpers, "fuse3 is installed by the test command"
        hide = "\n".join(f"mount --bind {blank} {h}" for h in helpers)
        r = mount_in_namespace(
            hide,
            f"runuser -u {USER} -- env -i PATH=/usr/bin:/bin HOME={work} {bindir / 'metfs'} mount "
            f"--source {work / 'src'} --cache {work / 'cache'} --budget 1MiB {work / 'mnt'}",
        )
        assert r.returncode != 0, r.stdout
        assert "no fusermount3 found" in r.stderr and "apt-get install fuse3" in r.stderr, r.stderr
        assert "panicked" not in r.stderr, r.stderr
    finally:
        shutil.rmtree(bindir)
        shutil.rmtree(work)
