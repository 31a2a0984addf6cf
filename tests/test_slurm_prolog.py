"""The metfs node service on a real Slurm: slurmd runs deploy/slurm/prolog.sh as root on each
node of a job, which mounts the site's dataset for the job's (non-root) user with
`metfs mount --run-as`; task-prolog.sh hands the job its mount and socket; epilog.sh removes
everything. The cluster is this module's own (two slurmd on this host, with Prolog, TaskProlog
and Epilog in its slurm.conf), so the other Slurm tests keep theirs as it is.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import metfs_bin
from test_slurm import SLURM_LOCAL, _free_port_base, leftovers, metfs_mounts, sweep

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy" / "slurm"
USER = "metfs-user"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs slurmd and a Prolog as root")

# What the job runs (as the user, with the system's Python: stdlib only): every file of its
# view read through the mount and hashed, the daemon's status through the socket, and its own
# identity; then it waits for the test's checks from outside before it ends.
CHECK = r"""
import hashlib, json, os, socket, sys, time
mnt, sock = os.environ["METFS_MOUNT"], os.environ["METFS_SOCKET"]
files = {}
for d, _, names in os.walk(mnt):
    for n in names:
        p = os.path.join(d, n)
        with open(p, "rb") as f:
            files[os.path.relpath(p, mnt)] = hashlib.sha256(f.read()).hexdigest()
s = socket.socket(socket.AF_UNIX)
s.connect(sock)
s.sendall(b'{"op": "status"}\n')
buf = b""
while not buf.endswith(b"\n"):
    buf += s.recv(1 << 20)
st = json.loads(buf)
print("RESULT " + json.dumps({"uid": os.getuid(), "mount": mnt, "socket": sock, "files": files,
      "read_path": st["read_path"], "passthrough": st["passthrough"]}), flush=True)
go = sys.argv[1]
end = time.time() + 90
while not os.path.exists(go) and time.time() < end:
    time.sleep(0.2)
"""


@dataclass
class Site:
    base: Path
    src: Path
    jobs: Path
    env: dict[str, str]
    hashes: dict[str, str]
    wrappers: dict[str, Path]


def _wrapper(path: Path, target: Path, exports: dict[str, str]) -> Path:
    lines = (
        ["#!/usr/bin/env bash"]
        + [f"export {k}={v}" for k, v in exports.items()]
        + [f'exec "{target}"']
    )
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    metfs = metfs_bin()
    if subprocess.run(["id", "-u", USER], capture_output=True).returncode != 0:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER],
            check=True,
        )
    base = Path(tempfile.mkdtemp(prefix="metfs-prolog-", dir="/tmp"))
    base.chmod(0o755)
    src, jobs = base / "src", base / "jobs"
    (src / "d").mkdir(parents=True)
    src.chmod(0o755)
    (src / "d").chmod(0o755)
    hashes = {}
    for i in range(24):
        data = hashlib.sha256(str(i).encode()).digest() * (1 << 13)  # 256 KiB
        (src / "d" / f"f{i:02d}.bin").write_bytes(data)
        (src / "d" / f"f{i:02d}.bin").chmod(0o644)
        hashes[f"d/f{i:02d}.bin"] = hashlib.sha256(data).hexdigest()
    # Root's own file, 0600: the user may not read it at the source, so never through metfs.
    (src / "d" / "secret.bin").write_bytes(b"s" * 4096)
    (src / "d" / "secret.bin").chmod(0o600)
    conf = base / "site.toml"
    conf.write_text(f'source = "{src}"\nbudget = "32MiB"\nrf = 2\nread_path = "passthrough"\n')
    exports = {"METFS_PROLOG_CONFIG": str(conf), "METFS_PROLOG_ROOT": str(jobs), "METFS_BIN": metfs}
    wrappers = {
        "prolog": _wrapper(base / "prolog", DEPLOY / "prolog.sh", exports),
        "epilog": _wrapper(base / "epilog", DEPLOY / "epilog.sh", exports),
        "task": _wrapper(
            base / "task-prolog", DEPLOY / "task-prolog.sh", {"METFS_PROLOG_ROOT": str(jobs)}
        ),
    }
    env = dict(
        os.environ,
        SLURM_LOCAL_DIR=str(base / "slurm"),
        SLURM_LOCAL_PORT=str(_free_port_base()),
        SLURM_LOCAL_PROLOG=str(wrappers["prolog"]),
        SLURM_LOCAL_EPILOG=str(wrappers["epilog"]),
        SLURM_LOCAL_TASK_PROLOG=str(wrappers["task"]),
    )
    try:
        r = subprocess.run(
            [str(SLURM_LOCAL), "start"], env=env, capture_output=True, text=True, timeout=600
        )
        assert r.returncode == 0, f"slurm-local.sh start failed:\n{r.stderr}"
        m = re.search(r"export SLURM_CONF=(\S+)", r.stdout)
        assert m, r.stdout
        env["SLURM_CONF"] = m.group(1)
        yield Site(base, src, jobs, env, hashes, wrappers)
    finally:
        subprocess.run([str(SLURM_LOCAL), "stop"], env=env, capture_output=True, timeout=120)
        sweep(base)
        shutil.rmtree(base, ignore_errors=True)


def _user_dir(site: Site, name: str) -> Path:
    d = site.base / name
    d.mkdir()
    shutil.chown(d, USER, USER)
    return d


def _in_queue(site: Site, job: str) -> bool:
    r = subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%T"], env=site.env, capture_output=True, text=True
    )
    return bool(r.stdout.strip())


def _has_result(text: str) -> bool:
    """Whether the job's output holds its whole RESULT line: the file is read while the job
    writes it, and a line seen without its newline may be cut short."""
    return "RESULT " in text and "\n" in text.split("RESULT ", 1)[1]


def test_a_users_job_reads_through_passthrough_and_the_epilog_leaves_nothing(site: Site) -> None:
    work = _user_dir(site, "job1")
    (work / "check.py").write_text(CHECK)
    go = work / "go"
    script = work / "job.sh"
    script.write_text(f"#!/bin/bash\nset -e\nsrun /usr/bin/python3 {work / 'check.py'} {go}\n")
    script.chmod(0o755)
    out = work / "job.out"
    r = subprocess.run(
        [
            "runuser",
            "-u",
            USER,
            "--",
            "env",
            f"SLURM_CONF={site.env['SLURM_CONF']}",
            "sbatch",
            "--parsable",
            f"--output={out}",
            "--time=5",
            "--nodes=1",
            "-w",
            "n1",
            f"--chdir={work}",
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip().split(";")[0]
    jobdir = site.jobs / f"{job}-n1"
    end = time.monotonic() + 120
    text = ""
    while not _has_result(text):
        assert time.monotonic() < end, f"no result from job {job}:\n{text[-3000:]}"
        assert _in_queue(site, job), f"job {job} ended early:\n{text[-3000:]}\n{_logs(site)}"
        time.sleep(0.5)
        text = out.read_text(errors="replace") if out.exists() else ""
    res = json.loads(text.split("RESULT ", 1)[1].splitlines()[0])
    try:
        uid = int(subprocess.run(["id", "-u", USER], capture_output=True, text=True).stdout)
        assert res["uid"] == uid
        # The job found its mount and socket through the TaskProlog, in its own directory.
        assert res["mount"] == str(jobdir / "mnt") and res["socket"] == str(
            jobdir / "cache" / "metfs.sock"
        )
        # Reads take passthrough, which an ordinary user's own daemon is refused.
        assert res["read_path"] == "passthrough" and res["passthrough"] is True, res
        # Its view is its share of the readable files, byte for byte; root's 0600 file is not in
        # it, nor anywhere in the cache.
        assert res["files"], res
        assert all(site.hashes.get(k) == v for k, v in res["files"].items()), res["files"]
        assert "d/secret.bin" not in res["files"]
        assert not list((jobdir / "cache").rglob("secret.bin"))
        # The daemon runs as the user, and the job's directory is the user's alone.
        assert jobdir.stat().st_uid == uid and (jobdir.stat().st_mode & 0o777) == 0o700
        # Another user can neither read the mount nor talk to the socket.
        r = subprocess.run(
            [
                "runuser",
                "-u",
                "nobody",
                "--",
                "cat",
                str(jobdir / "mnt" / next(iter(res["files"]))),
            ],
            capture_output=True,
            text=True,
        )
        assert r.returncode != 0 and "Permission denied" in r.stderr, r.stderr
        r = subprocess.run(
            [
                "runuser",
                "-u",
                "nobody",
                "--",
                "/usr/bin/python3",
                "-c",
                f"import socket; socket.socket(socket.AF_UNIX).connect({str(jobdir / 'cache' / 'metfs.sock')!r})",
            ],
            capture_output=True,
            text=True,
        )
        assert r.returncode != 0 and "Permission denied" in r.stderr, r.stderr
    finally:
        go.touch()
    end = time.monotonic() + 120
    while _in_queue(site, job):
        assert time.monotonic() < end, (
            f"job {job} did not end:\n{out.read_text(errors='replace')[-3000:]}"
        )
        time.sleep(0.5)
    # The Epilog ran: no mount, no daemon, no job directory.
    assert leftovers(site.base, wait=20) == [], _logs(site)
    end = time.monotonic() + 20
    while jobdir.exists() and time.monotonic() < end:
        time.sleep(0.2)
    assert not jobdir.exists(), (sorted(p.name for p in jobdir.rglob("*"))[:20], _logs(site))
    assert not metfs_mounts(site.base)


def test_each_node_of_a_two_node_job_mounts_its_share(site: Site) -> None:
    """The Prolog runs on both nodes at allocation; each node's daemon shows that node's share
    of the mini-epoch (its place in the job's node list), so the two views are disjoint and
    together hold readable files only; the Epilog cleans both nodes."""
    work = _user_dir(site, "job2")
    (work / "check.py").write_text(CHECK)
    go = work / "go"
    script = work / "job.sh"
    # One output file per task: two tasks writing one file interleave their lines.
    script.write_text(
        f"#!/bin/bash\nset -e\nsrun --ntasks-per-node=1 --output={work}/task-%t.out "
        f"/usr/bin/python3 {work / 'check.py'} {go}\n"
    )
    script.chmod(0o755)
    out = work / "job.out"
    r = subprocess.run(
        [
            "runuser",
            "-u",
            USER,
            "--",
            "env",
            f"SLURM_CONF={site.env['SLURM_CONF']}",
            "sbatch",
            "--parsable",
            f"--output={out}",
            "--time=5",
            "--nodes=2",
            "--ntasks-per-node=1",
            f"--chdir={work}",
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip().split(";")[0]
    end = time.monotonic() + 120
    text = ""
    tasks = [work / "task-0.out", work / "task-1.out"]

    def texts() -> list[str]:
        return [t.read_text(errors="replace") if t.exists() else "" for t in tasks]

    try:
        while not all(_has_result(t) for t in texts()):
            text = "\n".join(texts()) + (out.read_text(errors="replace") if out.exists() else "")
            assert time.monotonic() < end, f"no results from job {job}:\n{text[-3000:]}"
            assert _in_queue(site, job), f"job {job} ended early:\n{text[-3000:]}\n{_logs(site)}"
            time.sleep(0.5)
    finally:
        go.touch()
    results = [json.loads(t.split("RESULT ", 1)[1].splitlines()[0]) for t in texts()]
    mounts = {res["mount"] for res in results}
    assert mounts == {str(site.jobs / f"{job}-n1" / "mnt"), str(site.jobs / f"{job}-n2" / "mnt")}, (
        mounts
    )
    views = [set(res["files"]) for res in results]
    assert views[0] and views[1] and not views[0] & views[1], (views, _logs(site))
    assert all(site.hashes.get(k) == v for res in results for k, v in res["files"].items())
    end = time.monotonic() + 120
    while _in_queue(site, job):
        assert time.monotonic() < end, f"job {job} did not end"
        time.sleep(0.5)
    assert leftovers(site.base, wait=20) == [], _logs(site)
    end = time.monotonic() + 20
    while any((site.jobs / f"{job}-{n}").exists() for n in ("n1", "n2")) and time.monotonic() < end:
        time.sleep(0.2)
    assert not any((site.jobs / f"{job}-{n}").exists() for n in ("n1", "n2"))


def test_a_prolog_without_the_jobs_user_fails_clearly_and_mounts_nothing(site: Site) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    r = subprocess.run(
        [str(site.wrappers["prolog"])],
        env=dict(env, SLURM_JOB_ID="999001", SLURMD_NODENAME="n1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0
    assert "the job's user is not known" in r.stderr and "999001" in r.stderr, r.stderr
    assert not (site.jobs / "999001-n1").exists()
    r = subprocess.run(
        [str(site.wrappers["prolog"])],
        env=dict(
            env, SLURM_JOB_ID="999002", SLURMD_NODENAME="n1", SLURM_JOB_USER="no-such-user-xyz"
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0 and "'no-such-user-xyz' is not known" in r.stderr, r.stderr
    assert not (site.jobs / "999002-n1").exists()


def _logs(site: Site) -> str:
    out = []
    for p in sorted((site.base / "slurm" / "log").glob("*.log")):
        out.append(f"--- {p.name}\n" + p.read_text(errors="replace")[-1500:])
    return "\n".join(out)
