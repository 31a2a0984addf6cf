"""End-to-end tests of S3 sources through a real mount, against a real Garage server: bad
credentials and buckets, objects deleted after cataloguing, a server killed mid-staging, and a
fault-injecting proxy. (The core end-to-end tests in test_core.py also run against S3.)"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import ROOT, Tier, free_port, make_tree, read_view, wait_for


def s3_tier(
    garage, tmp_path: Path, n: int = 120, max_size: int = 48 * 1024, prefix: str = "d"
) -> tuple[Tier, dict[str, bytes]]:
    local = tmp_path / "local"
    files = make_tree(local, n=n, max_size=max_size)
    prefix = f"{prefix}{abs(hash(str(tmp_path))) % 10**8}"
    garage.upload(local, prefix)
    return Tier(
        "s3",
        f"s3://metfs/{prefix}",
        ["--endpoint", garage.endpoint, "--region", "garage", "--allow-http"],
        garage.env,
    ), files


def test_wrong_credentials_fail_the_mount_clearly(mounts, garage, tmp_path):
    tier, _ = s3_tier(garage, tmp_path, n=5)
    env = dict(tier.env)
    env["AWS_SECRET_ACCESS_KEY"] = "not-the-secret-0123456789abcdef"
    m = mounts(Tier("s3", tier.url, tier.args, env), "6MiB")
    r = m.mount(check=False)
    assert r.returncode != 0
    assert "access denied" in r.stderr.lower() or "auth" in r.stderr.lower(), r.stderr
    assert "not-the-secret" not in r.stderr and garage.env["AWS_SECRET_ACCESS_KEY"] not in r.stderr


def test_missing_bucket_fails_the_mount_clearly(mounts, garage, tmp_path):
    m = mounts(
        Tier(
            "s3",
            "s3://no-such-bucket-here/x",
            ["--endpoint", garage.endpoint, "--region", "garage", "--allow-http"],
            garage.env,
        ),
        "6MiB",
    )
    r = m.mount(check=False)
    assert r.returncode != 0 and "no-such-bucket-here" in r.stderr, r.stderr


def test_object_deleted_after_cataloguing_is_reported(mounts, garage, tmp_path):
    tier, files = s3_tier(garage, tmp_path)
    m = mounts(tier, "6MiB", "--rf", "1", "--compose", "sequential", "--prefetch-rate", "256KiB/s")
    m.mount()
    # Delete an object of a later mini-epoch before it is staged.
    plan_now = set(m.files()["files"])
    victim = sorted(k for k in files if k not in plan_now and files[k])[-1]
    key = tier.url.split("/", 3)[3] + "/" + victim
    garage.client().delete_object(Bucket="metfs", Key=key)
    seen: set[str] = set()
    for _ in range(40):
        m.wait_next_ready(timeout=120)
        seen |= set(m.files()["files"])
        assert m.pass_end()["decision"] == "advance"
        view = read_view(m.mountpoint)
        assert all(files[k] == v for k, v in view.items())
        if victim in seen or any(f["path"] == victim for f in m.status()["failed_samples"]):
            break
    st = m.status()
    assert any(f["path"] == victim for f in st["failed_samples"]), st
    assert st["last_error"] and "no longer exists" in st["last_error"], st["last_error"]
    assert victim not in seen, "a deleted object is never served"


def test_server_killed_and_restarted_mid_staging(mounts, garage, tmp_path):
    tier, files = s3_tier(garage, tmp_path, n=100)
    m = mounts(tier, "6MiB", "--rf", "1", "--compose", "sequential", "--prefetch-rate", "512KiB/s")
    m.mount()
    wait_for(lambda: m.status()["staging"].get("files_done", 0) >= 2, what="staging to start")
    garage.stop()
    try:
        time.sleep(3)
        # The current view keeps serving while the tier is down.
        view = read_view(m.mountpoint)
        assert view and all(files[k] == v for k, v in view.items())
    finally:
        # The server is shared by the session: the tests after this one need it back.
        garage.start()
    m.wait_next_ready(timeout=180)
    assert m.pass_end()["decision"] == "advance"
    view = read_view(m.mountpoint)
    assert view and all(files[k] == v for k, v in view.items()), "nothing corrupt is served"


def test_fault_injecting_proxy(mounts, garage, tmp_path):
    tier, files = s3_tier(garage, tmp_path, n=150)
    stats = tmp_path / "proxy.json"
    port = free_port()
    target = garage.endpoint.split("//", 1)[1]
    proxy = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "tests" / "faultproxy.py"),
            "--target",
            target,
            "--port",
            str(port),
            "--seed",
            "7",
            "--slowdown",
            "0.1",
            "--reset",
            "0.1",
            "--max-seconds",
            "300",
            "--stats",
            str(stats),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proxy.stdout.readline().startswith("listening")
        args = ["--endpoint", f"http://127.0.0.1:{port}", "--region", "garage", "--allow-http"]
        m = mounts(Tier("s3", tier.url, args, tier.env), "6MiB", "--rf", "1")
        m.mount()
        seen: set[str] = set()
        while m.files()["epoch"] == 0:
            view = read_view(m.mountpoint)
            for k, v in view.items():
                assert v == files[k], f"{k} differs from the object"
            seen |= set(view)
            m.wait_next_ready(timeout=180)
            assert m.pass_end()["decision"] == "advance"
        assert seen == set(files), "staging completed for every object"
        counts = json.loads(stats.read_text())
        assert counts["slowdowns"] > 0 and counts["resets"] > 0, counts
    finally:
        proxy.send_signal(signal.SIGTERM)
        proxy.wait(timeout=10)
