"""`metfs doctor` end to end: each check's failure provoked on this machine, the all-ok case,
and bad input read as `metfs mount` reads it (exit status 2, the mount's message).

Failures that depend on the node's state (no `fusermount3`, an unopenable `/dev/fuse`, a full
cache) are made in a private mount namespace (`unshare --mount`, root), so the host's
`/dev/fuse` and `fusermount3` are never touched and every mount goes with the namespace, also
when a test fails. The ordinary user is `metfs-user`, created as scripts/test.sh creates it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

from conftest import ROOT, Garage, make_tree

USER = "metfs-user"
CHECKS = [
    "fuse-kernel",
    "fusermount3",
    "dev-fuse",
    "passthrough",
    "cache",
    "cache-fs",
    "cache-space",
    "tier",
    "python",
]
PACKAGE = ROOT / "bindings" / "python" / "src"

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (namespaces, runuser)")


def doctor(
    metfs: str, *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [metfs, "doctor", *args],
        capture_output=True,
        text=True,
        env=env if env is not None else os.environ.copy(),
        timeout=timeout,
    )


def checks(out: str) -> dict[str, dict[str, str]]:
    report = json.loads(out)
    assert [c["name"] for c in report["checks"]] == CHECKS, report
    return {c["name"]: c for c in report["checks"]}


def package_env() -> dict[str, str]:
    """This tree's Python package on PYTHONPATH: the binary's version."""
    return dict(os.environ, PYTHONPATH=str(PACKAGE))


@pytest.fixture
def places(tmp_path: Path) -> tuple[Path, Path]:
    src = tmp_path / "src"
    make_tree(src, n=40)
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    return src, cache


@root_only
def test_all_ok_as_root(metfs: str, places: tuple[Path, Path]) -> None:
    src, cache = places
    common = ["--source", str(src), "--cache", str(cache), "--budget", "8MiB"]
    common += ["--python", sys.executable]
    r = doctor(metfs, *common, "--json", env=package_env())
    assert r.returncode == 0, r.stdout + r.stderr
    found = checks(r.stdout)
    for name in ("fuse-kernel", "dev-fuse", "cache", "cache-space", "tier", "python"):
        assert found[name]["status"] == "ok", found[name]
        assert found[name]["fix"] is None
    assert re.search(r"listed all \d+ entries \(40 files\) in [\d.]+ ms", found["tier"]["found"]), (
        found["tier"]
    )
    assert found["fusermount3"]["status"] == "ok"
    assert "not needed" in found["fusermount3"]["found"]
    assert all(c["status"] != "fail" for c in found.values())
    # The text: a header, one line per check, the verdict.
    r = doctor(metfs, *common, env=package_env())
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == len(CHECKS) + 2, r.stdout
    assert lines[0].startswith("metfs ") and "doctor, as root (uid 0)" in lines[0]
    for line, name in zip(lines[1:-1], CHECKS, strict=True):
        assert line.split()[0] in ("ok", "warn"), line
        assert line.split()[1] == f"{name}:", line
    assert lines[-1].startswith("a mount would work"), r.stdout
    # The same settings from a config file and the environment.
    conf = places[1].parent / "m.toml"
    conf.write_text(f"source = '{src}'\nbudget = '8MiB'\n")
    env = dict(package_env(), METFS_CACHE=str(cache))
    r = doctor(metfs, "--config", str(conf), "--python", sys.executable, "--json", env=env)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_mount_from_a_catalog_file_is_checked_without_a_listing(
    metfs: str, places: tuple[Path, Path], tmp_path: Path
) -> None:
    """With `--catalog FILE` the tier check reads the file as the mount does (format, source,
    staleness) and lists nothing: a stale catalog, a truncated one and one of another source
    fail naming the file."""
    src, cache = places
    cat = tmp_path / "catalog.bin"
    r = subprocess.run(
        [metfs, "catalog", str(src), "-o", str(cat)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stdout + r.stderr
    common = ["--source", str(src), "--cache", str(cache), "--budget", "8MiB"]
    common += ["--python", sys.executable, "--json"]
    r = doctor(metfs, *common, "--catalog", str(cat), env=package_env())
    assert r.returncode == 0, r.stdout + r.stderr
    tier = checks(r.stdout)["tier"]
    assert tier["status"] == "ok", tier
    assert f"catalog file {cat}: 40 samples" in tier["found"], tier
    assert "not listed" in tier["found"] and "listed all" not in tier["found"], tier
    # Another source: refused with the file named, and the way to make it again.
    other = tmp_path / "other"
    make_tree(other, n=5)
    r = doctor(metfs, *common[2:], "--source", str(other), "--catalog", str(cat), env=package_env())
    assert r.returncode == 1, r.stdout + r.stderr
    tier = checks(r.stdout)["tier"]
    assert tier["status"] == "fail" and str(cat) in tier["found"], tier
    assert "metfs catalog" in tier["fix"], tier
    # Stale: the source's root changed since the catalog was made.
    (src / "new file.bin").write_bytes(b"x")
    r = doctor(metfs, *common, "--catalog", str(cat), env=package_env())
    assert r.returncode == 1, r.stdout + r.stderr
    tier = checks(r.stdout)["tier"]
    assert tier["status"] == "fail" and str(cat) in tier["found"], tier
    # Truncated.
    cut = tmp_path / "cut.bin"
    cut.write_bytes(cat.read_bytes()[:40])
    r = doctor(metfs, *common, "--catalog", str(cut), env=package_env())
    assert r.returncode in (1, 2), r.stdout + r.stderr
    assert str(cut) in r.stdout + r.stderr, r.stdout + r.stderr


def test_a_python_without_the_package_is_a_warning(metfs: str, places: tuple[Path, Path]) -> None:
    src, cache = places
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = doctor(
        metfs,
        *("--source", str(src), "--cache", str(cache), "--budget", "8MiB"),
        *("--python", sys.executable, "--json"),
        env=env,
    )
    py = checks(r.stdout)["python"]
    assert py["status"] == "warn", py
    assert "not installed" in py["found"] and "pip install" in py["fix"], py


def test_a_python_package_of_another_version_fails(
    metfs: str, places: tuple[Path, Path], tmp_path: Path
) -> None:
    src, cache = places
    other = tmp_path / "site"
    shutil.copytree(PACKAGE / "metfs", other / "metfs")
    init = other / "metfs" / "__init__.py"
    # A real package whose version differs: its last word on __version__.
    init.write_text(init.read_text() + '\n__version__ = "0.0.1"\n')
    r = doctor(
        metfs,
        *("--source", str(src), "--cache", str(cache), "--budget", "8MiB"),
        *("--python", sys.executable, "--json"),
        env=dict(os.environ, PYTHONPATH=str(other)),
    )
    assert r.returncode == 1, r.stdout + r.stderr
    py = checks(r.stdout)["python"]
    assert py["status"] == "fail", py
    assert "metfs 0.0.1" in py["found"] and str(other) in py["found"], py
    assert "pip install" in py["fix"], py


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_s3_endpoint_fails_naming_it(metfs: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    endpoint = f"http://127.0.0.1:{free_port()}"
    env = dict(
        os.environ,
        METFS_ENDPOINT=endpoint,
        AWS_ACCESS_KEY_ID="doctor-key",
        AWS_SECRET_ACCESS_KEY="doctor-secret-key-0",
    )
    t0 = time.monotonic()
    r = doctor(
        metfs,
        *("--source", "s3://bucket/prefix", "--cache", str(cache), "--budget", "8MiB"),
        *("--allow-http", "--region", "garage", "--timeout", "3", "--json"),
        env=env,
    )
    took = time.monotonic() - t0
    assert r.returncode == 1, r.stdout + r.stderr
    tier = checks(r.stdout)["tier"]
    assert tier["status"] == "fail", tier
    assert endpoint in tier["found"] and "s3://bucket/prefix" in tier["found"], tier
    assert "--endpoint" in tier["fix"], tier
    assert took < 20, took


def test_an_s3_tier_lists_through_the_projects_s3_tier(
    metfs: str, garage: Garage, tmp_path: Path
) -> None:
    local = tmp_path / "data"
    make_tree(local, n=12)
    prefix = f"doctor{abs(hash(str(tmp_path))) % 10**8}"
    garage.upload(local, prefix)
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    s3 = ["--endpoint", garage.endpoint, "--region", "garage", "--allow-http", "--json"]
    common = ["--cache", str(cache), "--budget", "8MiB", *s3]
    r = doctor(metfs, "--source", f"s3://metfs/{prefix}", *common, env=garage.env)
    tier = checks(r.stdout)["tier"]
    assert tier["status"] == "ok", tier
    assert f"s3://metfs/{prefix} at {garage.endpoint}" in tier["found"], tier
    assert "the prefix holds objects" in tier["found"], tier
    # An empty prefix: a mount would find no samples.
    r = doctor(metfs, "--source", f"s3://metfs/{prefix}-none", *common, env=garage.env)
    assert r.returncode == 1, r.stdout + r.stderr
    tier = checks(r.stdout)["tier"]
    assert tier["status"] == "fail" and "no objects" in tier["found"], tier


def mount_error(metfs: str, args: list[str], tmp_path: Path) -> str:
    """The first line of what `metfs mount` says of these settings (it must refuse them)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir(exist_ok=True)
    r = subprocess.run([metfs, "mount", *args, str(mnt)], capture_output=True, text=True)
    if r.returncode == 0:
        subprocess.run([metfs, "umount", str(mnt)], capture_output=True)
    assert r.returncode != 0, r.stdout + r.stderr
    return r.stderr.strip().splitlines()[0]


@pytest.mark.parametrize("case", ["no-source", "no-cache", "budget", "unknown-key"])
def test_bad_input_gives_the_mounts_error_and_status_2(
    metfs: str, places: tuple[Path, Path], tmp_path: Path, case: str
) -> None:
    src, cache = places
    args = ["--source", str(src), "--cache", str(cache), "--budget", "8MiB"]
    if case == "no-source":
        args[1] = str(tmp_path / "nowhere")
    elif case == "no-cache":
        args[3] = str(tmp_path / "no-cache")
    elif case == "budget":
        args[5] = "lots"
    else:
        conf = tmp_path / "bad.toml"
        conf.write_text("budgte = '1GiB'\n")
        args += ["--config", str(conf)]
    r = doctor(metfs, *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == "", r.stdout
    got = r.stderr.strip().splitlines()[0]
    want = mount_error(metfs, args, tmp_path)
    if case == "no-source":
        assert f"source {args[1]}: cannot open the source directory" in got, got
        # The mount says it while preparing, after FUSE's checks (which stop an ordinary user
        # first where /dev/fuse is root's): the message is the tier's own.
        if os.geteuid() == 0:
            assert want == f"metfs: preparing the mount: {got.removeprefix('metfs: ')}", (
                want,
                got,
            )
    else:
        assert got == want, (got, want)
    if case == "no-cache":
        assert "does not exist" in got, got
    if case == "unknown-key":
        assert "unknown field `budgte`" in got, got


@pytest.fixture
def user_dir() -> Iterator[Path]:
    """A directory the ordinary user owns, outside root's private pytest directory, with the
    binary copied in; the user created as scripts/test.sh creates it."""
    if subprocess.run(["id", "-u", USER], capture_output=True).returncode != 0:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER],
            check=True,
        )
    d = Path(tempfile.mkdtemp(prefix="metfs-doctor-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def as_user_in_namespace(
    metfs: str, d: Path, setup: str, doctor_args: list[str]
) -> subprocess.CompletedProcess[str]:
    """Runs `setup` (shell, as root) in a private mount namespace, then the doctor there as
    the ordinary user with a plain PATH."""
    shutil.copy(metfs, d / "metfs")
    src = d / "src"
    make_tree(src, n=10)
    cache = d / "cache"
    cache.mkdir(mode=0o700)
    subprocess.run(["chown", "-R", USER, str(src), str(cache)], check=True)
    cmd = [str(d / "metfs"), "doctor", "--source", str(src), "--cache", str(cache)]
    cmd += ["--budget", "1MiB", "--python", "/bin/false", "--json", *doctor_args]
    run = "runuser -u {} -- env -i PATH=/usr/bin:/bin {}".format(USER, shlex.join(cmd))
    script = f"set -e\nmount --make-rprivate /\n{setup}\n{run}"
    return subprocess.run(
        ["unshare", "--mount", "sh", "-c", script], capture_output=True, text=True, timeout=60
    )


def fuse_node(d: Path, mode: str) -> str:
    """Shell that puts a FUSE device node of `mode` (root's) over /dev/fuse, from a tmpfs (which
    allows device nodes wherever the host's /tmp does not)."""
    node = d / "dev"
    return (
        f"mkdir -p {node} && mount -t tmpfs -o size=64k,mode=0755 none {node}\n"
        f"mknod -m {mode} {node}/fuse c 10 229 && mount --bind {node}/fuse /dev/fuse"
    )


@root_only
def test_no_fusermount3_fails_for_an_ordinary_user(metfs: str, user_dir: Path) -> None:
    # Both fusermount3 and its fusermount link resolve to /usr/bin/fusermount3 (/bin is a link
    # to /usr/bin on Debian 12): covered by a character device, it is not an executable file.
    helper = shutil.which("fusermount3") or "/usr/bin/fusermount3"
    setup = fuse_node(user_dir, "0666")
    if Path(helper).exists():
        setup += f"\nmount --bind /dev/null {os.path.realpath(helper)}"
    r = as_user_in_namespace(metfs, user_dir, setup, [])
    assert r.returncode == 1, r.stdout + r.stderr
    found = checks(r.stdout)
    fm = found["fusermount3"]
    assert fm["status"] == "fail", fm
    assert "none found" in fm["found"] and "is not root" in fm["found"], fm
    assert "apt-get install fuse3" in fm["fix"] and "dnf install fuse3" in fm["fix"], fm
    # Only the helper is missing: the device of this namespace opens.
    assert found["dev-fuse"]["status"] == "ok", found["dev-fuse"]
    assert found["passthrough"]["status"] == "warn", found["passthrough"]
    assert "no CAP_SYS_ADMIN" in found["passthrough"]["found"]


@root_only
def test_a_dev_fuse_the_user_cannot_open_fails_with_the_group_fix(
    metfs: str, user_dir: Path
) -> None:
    # A 0600 root node, as on this machine, also where the host's /dev/fuse is 0666.
    r = as_user_in_namespace(metfs, user_dir, fuse_node(user_dir, "0600"), [])
    assert r.returncode == 1, r.stdout + r.stderr
    found = checks(r.stdout)
    dev = found["dev-fuse"]
    assert dev["status"] == "fail", dev
    assert "mode 0600, group root" in dev["found"] and "Permission denied" in dev["found"], dev
    assert f"usermod -aG fuse {USER}" in dev["fix"], dev
    assert "chgrp fuse /dev/fuse; chmod 0660 /dev/fuse" in dev["fix"], dev
    assert found["tier"]["status"] == "ok", found["tier"]
    assert found["cache"]["status"] == "ok", found["cache"]


@root_only
def test_a_cache_on_a_full_tmpfs_fails_against_the_budget(metfs: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_tree(src, n=10)
    fs = tmp_path / "small"
    fs.mkdir()
    cache = fs / "cache"
    # The tmpfs lives and dies with the namespace: nothing is left mounted on the host.
    script = (
        "set -e\nmount --make-rprivate /\n"
        f"mount -t tmpfs -o size=1m,mode=0700 none {fs}\n"
        f"mkdir -m 0700 {cache}\n"
        f"dd if=/dev/zero of={fs}/fill bs=64k 2>/dev/null || true\n"
        + shlex.join(
            [metfs, "doctor", "--source", str(src), "--cache", str(cache), "--budget", "2MiB"]
            + ["--python", sys.executable, "--json"]
        )
    )
    r = subprocess.run(["unshare", "--mount", "sh", "-c", script], capture_output=True, text=True)
    assert r.returncode == 1, r.stdout + r.stderr
    found = checks(r.stdout)
    space = found["cache-space"]
    assert space["status"] == "fail", space
    assert "for a budget of 2.00 MiB" in space["found"], space
    assert "free space there" in space["fix"] and "node-local" in space["fix"], space
    assert found["cache-fs"]["status"] == "ok", found["cache-fs"]
    assert found["cache-fs"]["found"].startswith("tmpfs"), found["cache-fs"]
    # Gone with the namespace.
    assert not any(str(fs) in line for line in Path("/proc/mounts").read_text().splitlines())


@root_only
def test_the_ordinary_users_view_of_this_node(metfs: str, user_dir: Path) -> None:
    """No namespace: the node as it is, for the ordinary user; every check reports."""
    shutil.copy(metfs, user_dir / "metfs")
    src = user_dir / "src"
    make_tree(src, n=10)
    cache = user_dir / "cache"
    cache.mkdir(mode=0o700)
    subprocess.run(["chown", "-R", USER, str(src), str(cache)], check=True)
    cmd = [str(user_dir / "metfs"), "doctor", "--source", str(src), "--cache", str(cache)]
    cmd += ["--budget", "1MiB", "--json"]
    r = subprocess.run(
        ["runuser", "-u", USER, "--", "env", "-i", "PATH=/usr/bin:/bin", *cmd],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode in (0, 1), r.stdout + r.stderr
    found = checks(r.stdout)
    assert json.loads(r.stdout)["user"] == USER
    # An ordinary user never has passthrough here, and a refused device is never ok.
    assert found["passthrough"]["status"] == "warn", found["passthrough"]
    assert found["fusermount3"]["status"] == "ok", found["fusermount3"]
    failed = [c for c in found.values() if c["status"] == "fail"]
    assert r.returncode == (1 if failed else 0), r.stdout
    if found["dev-fuse"]["status"] == "fail":
        assert f"usermod -aG fuse {USER}" in found["dev-fuse"]["fix"], found["dev-fuse"]
