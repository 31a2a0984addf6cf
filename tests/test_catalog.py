"""Catalog files (`metfs catalog SOURCE -o FILE`, `metfs mount --catalog FILE`): one listing per
dataset version, however many nodes mount it.

* A POSIX source whose directories the mounting user cannot list (0311: files readable by
  path) mounts and stages from a catalog made by someone who can, where a mount that lists
  fails.
* An S3 source behind the counting proxy (tests/faultproxy.py) is listed once for four nodes'
  mounts from one catalog, against once per node without it.
* A catalog of another source, a truncated one, one of another format version and a stale
  one are refused at mount with the file and the reason, and nothing is staged.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import test_slurm
from conftest import ROOT, Mount, Tier, free_port, is_mounted, make_tree, read_view
from test_slurm import cluster  # noqa: F401 (the two-node Slurm of test_slurm.py)

USER = "metfs-user"


def catalog(metfs: str, source: str, out: Path, *extra: str, env=None, check=True):
    r = subprocess.run(
        [metfs, "catalog", source, "-o", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    if check:
        assert r.returncode == 0, r.stderr
    return r


@contextmanager
def counting_proxy(
    garage, tmp_path: Path, max_seconds: int
) -> Iterator[tuple[int, Callable[[], int]]]:
    """tests/faultproxy.py in front of the session's Garage with no faults, counting requests:
    its port, and the number of listings it has passed on so far."""
    stats = tmp_path / "proxy.json"
    port = free_port()
    proxy = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "tests" / "faultproxy.py"),
            *("--target", garage.endpoint.split("//", 1)[1], "--port", str(port)),
            *("--slowdown", "0", "--reset", "0", "--max-seconds", str(max_seconds)),
            *("--stats", str(stats)),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )

    def listings() -> int:
        return json.loads(stats.read_text())["listings"] if stats.exists() else 0

    try:
        assert proxy.stdout is not None and proxy.stdout.readline().startswith("listening")
        yield port, listings
    finally:
        proxy.send_signal(signal.SIGTERM)
        proxy.wait(timeout=10)


def staged(cache: Path) -> list[Path]:
    """Every file staged into the cache's slots."""
    slots = cache / "slots"
    return [p for p in slots.rglob("*") if p.is_file()] if slots.exists() else []


def ensure_user() -> None:
    """The ordinary user of the tests, made as scripts/test.sh makes it, allowed /dev/fuse."""
    if subprocess.run(["id", "-u", USER], capture_output=True).returncode != 0:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER],
            check=True,
        )
    ok = ["runuser", "-u", USER, "--", "test", "-r", "/dev/fuse", "-a", "-w", "/dev/fuse"]
    if subprocess.run(ok).returncode != 0:
        if subprocess.run(["getent", "group", "fuse"], capture_output=True).returncode != 0:
            subprocess.run(["groupadd", "--system", "fuse"], check=True)
        subprocess.run(["chgrp", "fuse", "/dev/fuse"], check=True)
        subprocess.run(["chmod", "g+rw", "/dev/fuse"], check=True)
        subprocess.run(["usermod", "-aG", "fuse", USER], check=True)


def as_user(*cmd: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["runuser", "-u", USER, "--", *cmd], capture_output=True, text=True, timeout=timeout
    )


HASH_VIEW = """
import hashlib, json, os, sys
out = {}
for d, _, names in os.walk(sys.argv[1]):
    for n in names:
        p = os.path.join(d, n)
        out[os.path.relpath(p, sys.argv[1])] = hashlib.sha256(open(p, 'rb').read()).hexdigest()
print(json.dumps(out))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a source only its owner can list")
def test_a_user_who_cannot_list_the_source_mounts_from_a_catalog(metfs):
    ensure_user()
    base = Path(tempfile.mkdtemp(prefix="metfs-catalog-"))
    base.chmod(0o755)
    src, cache, mnt = base / "src", base / "cache", base / "mnt"
    files = make_tree(src, n=120)
    cat = base / "dataset.cat"
    out = catalog(metfs, str(src), cat).stdout
    assert "120 samples" in out and "written" in out, out
    # Directories 0311: a path can be followed, no directory can be read; files readable.
    for p in [src, *src.rglob("*")]:
        p.chmod(0o311 if p.is_dir() else 0o644)
    cat.chmod(0o644)
    m = Mount(
        src, cache, mnt, metfs=metfs, user=USER, budget="4MiB", history=cache / "h.json", rf=1
    )
    try:
        assert as_user("ls", str(src)).returncode != 0, "the user must not be able to list"
        r = m.mount(check=False)
        assert r.returncode != 0 and "ermission denied" in r.stderr, r.stderr
        assert not is_mounted(mnt)
        m.settings["catalog"] = cat
        m.mount()
        log = (cache / "metfs.log").read_text()
        assert "the source is not listed" in log, log[-2000:]
        seen: dict[str, str] = {}
        sock = str(cache / "metfs.sock")
        for _ in range(60):
            r = as_user("/usr/bin/python3", "-c", HASH_VIEW, str(mnt))
            assert r.returncode == 0, r.stderr
            view = json.loads(r.stdout)
            assert view, "the first mini-epoch is staged"
            for k, v in view.items():
                assert v == hashlib.sha256(files[k]).hexdigest(), k
            seen |= view
            if len(seen) == len(files):
                break
            r = subprocess.run(
                [metfs, "advance", "--socket", sock, "--wait"], capture_output=True, text=True
            )
            assert r.returncode == 0, r.stderr
        assert set(seen) == set(files), "every sample staged from the catalog"
    finally:
        m.close()
        for p in [src, *src.rglob("*")]:
            if p.is_dir():
                p.chmod(0o755)
        shutil.rmtree(base, ignore_errors=True)


def refused(m, cat: Path, *words: str) -> None:
    r = m.mount(check=False)
    assert r.returncode != 0, "the mount must be refused"
    assert str(cat) in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, r.stderr
    assert not is_mounted(m.mountpoint)
    assert not staged(m.cache), "nothing staged"


def test_a_catalog_of_another_source_truncated_or_of_another_format_is_refused(
    metfs, mounts, tmp_path
):
    a, b = tmp_path / "a", tmp_path / "b"
    make_tree(a, n=40)
    make_tree(b, n=40, seed=9)
    cat = tmp_path / "a.cat"
    catalog(metfs, str(a), cat)
    good = cat.read_bytes()
    refused(mounts(b, "2MiB", "--catalog", str(cat), name="other"), cat, "not this mount", str(a))
    cut = tmp_path / "cut.cat"
    cut.write_bytes(good[: len(good) - 10])
    refused(mounts(a, "2MiB", "--catalog", str(cut), name="cut"), cut, "truncated")
    fmt = tmp_path / "fmt.cat"
    fmt.write_bytes(good[:8] + (99).to_bytes(4, "little") + good[12:])
    refused(mounts(a, "2MiB", "--catalog", str(fmt), name="fmt"), fmt, "format version 99")
    # Stale: an entry added at the top of the source changes the root's mtime (one stat).
    (a / "new.bin").write_bytes(b"x")
    refused(mounts(a, "2MiB", "--catalog", str(cat), name="stale"), cat, "stale")
    # The catalog step keeps a current file and replaces a stale one.
    out = catalog(metfs, str(b), tmp_path / "b.cat").stdout
    assert "written" in out, out
    out = catalog(metfs, str(b), tmp_path / "b.cat").stdout
    assert "kept" in out, out
    r = catalog(metfs, str(a), cat)
    assert "written" in r.stdout and "replaced" in r.stderr, (r.stdout, r.stderr)
    m = mounts(a, "8MiB", "--catalog", str(cat), "--mini-epochs", "1", name="ok")
    # A sample changed below the top directory since the catalog: staging reports it, as
    # against a listing, and serves the rest.
    changed = next(p for p in sorted(a.rglob("*.bin")) if p.parent != a and p.stat().st_size)
    os.utime(changed, ns=(0, 10**18))
    m.mount()
    view = read_view(m.mountpoint)
    assert view and all((a / k).read_bytes() == v for k, v in view.items())
    rel = changed.relative_to(a).as_posix()
    assert rel not in view, rel
    assert "changed since it was catalogued" in m.status()["last_error"], m.status()


def test_four_nodes_list_s3_once_from_a_catalog_and_four_times_without(
    metfs, mounts, garage, tmp_path
):
    local = tmp_path / "local"
    make_tree(local, n=60)
    prefix = f"cat{abs(hash(str(tmp_path))) % 10**8}"
    garage.upload(local, prefix)
    url = f"s3://metfs/{prefix}"
    with counting_proxy(garage, tmp_path, 300) as (port, listings):
        s3 = ["--endpoint", f"http://127.0.0.1:{port}", "--region", "garage", "--allow-http"]

        def job(tag: str, *extra: str) -> int:
            before = listings()
            for rank in range(4):
                m = mounts(
                    Tier("s3", url, s3, garage.env),
                    "2MiB",
                    "--nodes",
                    "4",
                    "--node-rank",
                    str(rank),
                    *extra,
                    name=f"{tag}{rank}",
                )
                m.mount()
                assert read_view(m.mountpoint), "each node's first mini-epoch is staged"
                m.umount()
            return listings() - before

        without = job("plain")
        cat = tmp_path / "s3.cat"
        before = listings()
        out = catalog(metfs, url, cat, *s3, env=garage.env).stdout
        assert "60 samples" in out, out
        made = listings() - before
        with_catalog = job("cat", "--catalog", str(cat))
        print(f"listings for 4 nodes: {without} without a catalog, {made + with_catalog} with one")
        assert without == 4, without
        assert (made, with_catalog) == (1, 0), (made, with_catalog)
        # The first object rewritten: its ETag (one HEAD at mount) tells the catalog is stale.
        first = min(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
        garage.client().put_object(Bucket="metfs", Key=f"{prefix}/{first}", Body=b"changed")
        m = mounts(Tier("s3", url, s3, garage.env), "2MiB", "--catalog", str(cat), name="stale")
        r = m.mount(check=False)
        assert r.returncode != 0 and "stale" in r.stderr and first in r.stderr, r.stderr
        assert str(cat) in r.stderr and not staged(m.cache), r.stderr


SLURM_JOB = """#!/usr/bin/env bash
# One listing for the job: the catalog step on the first node, then every node mounts from it
# (as the train-*.sbatch templates do), reads its view and unmounts.
set -euo pipefail
H=$METFS_DEPLOY/metfs-node.sh
"$H" catalog
srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --overlap --kill-on-bad-exit=0 bash -c '
  set -e
  "$0" mount
  eval "$("$0" paths)"
  echo "node $METFS_NODE: $(find "$METFS_MOUNT" -type f | wc -l) files"
  "$0" umount' "$H"
"""


def test_a_two_node_slurm_job_lists_s3_once_through_the_catalog_step(
    metfs,
    garage,
    tmp_path,
    cluster,  # noqa: F811
):
    """The catalog step of deploy/slurm on the test command's Slurm (two slurmd on this host):
    a job of two nodes lists the S3 prefix once, one without a catalog once per node. With the
    catalog the node check (`metfs doctor`, on by default) reads the file and lists nothing, so
    it stays on; without one it reads a page of the listing per node, so it is off there."""
    local = tmp_path / "local"
    make_tree(local, n=40)
    prefix = f"slurm{abs(hash(str(tmp_path))) % 10**8}"
    garage.upload(local, prefix)
    d = cluster.dir / "catalog"
    for n in ("n1", "n2"):
        (d / n).mkdir(parents=True, exist_ok=True)
    script = d / "job.sbatch"
    script.write_text(SLURM_JOB)
    with counting_proxy(garage, tmp_path, 600) as (port, listings):
        env = {
            **{k: v for k, v in garage.env.items() if k.startswith("AWS_")},
            "METFS_BIN": metfs,
            "METFS_SOURCE": f"s3://metfs/{prefix}",
            "METFS_CACHE_ROOT": str(d / "%n" / "cache-%j"),
            "METFS_BUDGET": "2MiB",
            "METFS_MOUNTPOINT": str(d / "%n" / "mnt-%j"),
            "METFS_ARGS": f"--endpoint http://127.0.0.1:{port} --region garage --allow-http",
            "METFS_DEPLOY": str(ROOT / "deploy" / "slurm"),
            "METFS_MOUNT_TIMEOUT": "120",
        }

        def run(tag: str, catalog_file: str, doctor: str) -> int:
            before = listings()
            job = cluster.sbatch(
                script,
                {**env, "METFS_CATALOG": catalog_file, "METFS_DOCTOR": doctor},
                d / f"{tag}.out",
                "--nodes=2",
                "--ntasks-per-node=1",
            )
            info = cluster.wait(job)
            text = job.text()
            assert info.get("JobState") == "COMPLETED", text[-3000:]
            assert text.count(" files") == 2 and " 0 files" not in text, text[-3000:]
            return listings() - before

        try:
            with_catalog = run("catalog", str(d / "s3.cat"), "1")
            without = run("plain", "", "0")
            print(
                f"listings of a 2-node Slurm job: {with_catalog} with the catalog step, "
                f"{without} without"
            )
            assert (with_catalog, without) == (1, 2), (with_catalog, without)
        finally:
            test_slurm.sweep(d)
