"""End-to-end tests of the planning and reporting tools: `metfs manifest`, `metfs plan` (dataset
plans and the paper's bandwidth model), `metfs report`, the Prometheus metrics file, and auto
pacing, through the real binary and a real mount."""

from __future__ import annotations

import json
import math
import subprocess
import time
from pathlib import Path

from conftest import make_tree, wait_for


def run(metfs: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([metfs, *args], capture_output=True, text=True, timeout=300)


def test_plan_model_reproduces_the_papers_deepcam_figures(metfs):
    # DeepCAM on Summit: 3.8 TB/s required, B2 = 400 GB/s, (nm, rf) = (128, 128) -> EB2 ~ 30 GB/s.
    r = run(
        metfs,
        "plan",
        "--dataset-size",
        "8.8TiB",
        "--budget",
        "160GiB",
        "--required-bw",
        "3.8TiB/s",
        "--tier-bw",
        "400GiB/s",
        "--mini-epochs",
        "128",
        "--rf",
        "128",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["mini_epochs"] == 128
    assert abs(out["eb2_bytes_per_s"] / 2**30 - 30.4) < 0.1, out["eb2_bytes_per_s"]
    assert out["stall_free_rf"] == 10
    fractions = {}
    for rf in (1, 4, 9, 10, 16, 128):
        r = run(
            metfs,
            "plan",
            "--dataset-size",
            "8.8TiB",
            "--budget",
            "160GiB",
            "--required-bw",
            "3.8TiB/s",
            "--tier-bw",
            "400GiB/s",
            "--mini-epochs",
            "128",
            "--rf",
            str(rf),
            "--json",
        )
        fractions[rf] = json.loads(r.stdout)["throughput_fraction"]
    assert fractions[9] < 1.0 and fractions[1] < fractions[4] < fractions[9]
    assert fractions[10] == fractions[16] == fractions[128] == 1.0, "throughput peaks once rf >= 10"


def test_plan_model_schedule_and_errors(metfs, tmp_path):
    sched = tmp_path / "sched.csv"
    sched.write_text("rf,t\n128,10\n4,10\n")
    r = run(
        metfs,
        "plan",
        "--dataset-size",
        "1TiB",
        "--budget",
        "64GiB",
        "--required-bw",
        "100GiB/s",
        "--tier-bw",
        "10GiB/s",
        "--rf-schedule",
        str(sched),
        "--json",
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["eb2_bytes_per_s"] > 0
    sched.write_text("rf,t\nmany,10\n")
    r = run(
        metfs,
        "plan",
        "--dataset-size",
        "1TiB",
        "--budget",
        "64GiB",
        "--required-bw",
        "100GiB/s",
        "--tier-bw",
        "10GiB/s",
        "--rf-schedule",
        str(sched),
    )
    assert r.returncode != 0 and "sched.csv" in r.stderr and "2" in r.stderr, r.stderr


def test_manifest_and_plan_summary(metfs, tmp_path):
    src = tmp_path / "tier"
    files = make_tree(src, n=200)
    r = run(metfs, "manifest", str(src), "--label-from-dirs")
    assert r.returncode == 0, r.stderr
    man = tmp_path / "m.csv"
    man.write_text(r.stdout)
    lines = r.stdout.splitlines()
    assert lines[0].startswith("path,size") and "label" in lines[0]
    assert len(lines) == len(files) + 1
    r = run(
        metfs,
        "plan",
        "--manifest",
        str(man),
        "--budget",
        "4MiB",
        "--compose",
        "stratified",
        "--nodes",
        "2",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["mini_epochs"] >= 2
    assert plan["dataset_files"] == len(files)
    # A manifest with a path escaping the source is refused with file and line.
    bad = tmp_path / "bad.csv"
    bad.write_text("path,size\nok.bin,3\n../etc/passwd,10\n")
    r = run(metfs, "plan", "--manifest", str(bad), "--budget", "8MiB")
    assert r.returncode != 0 and "bad.csv" in r.stderr and "3" in r.stderr, r.stderr


def test_mount_from_manifest(mounts, tmp_path, metfs):
    src = tmp_path / "tier"
    files = make_tree(src, n=80)
    man = tmp_path / "m.jsonl"
    man.write_text(run(metfs, "manifest", str(src), "--format", "jsonl").stdout)
    m = mounts(src, "8MiB", "--manifest", str(man), "--mini-epochs", "2")
    m.mount()
    view = m.files()["files"]
    assert view and set(view) <= set(files)
    assert (m.mountpoint / view[0]).read_bytes() == files[view[0]]
    # `metfs files` (which reads the list packed) prints the same paths, one per line, names
    # with spaces and non-ASCII included; `--json` carries the list and its count.
    r = run(metfs, "files", "--socket", m.socket)
    assert r.returncode == 0 and r.stdout.splitlines() == view, r.stderr
    j = json.loads(run(metfs, "files", "--socket", m.socket, "--json").stdout)
    assert j["files"] == view and j["count"] == len(view) and j["packed"] is None


def is_png(p: Path) -> bool:
    return p.exists() and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 1000


def test_report_metrics_and_auto_pacing(mounts, tmp_path, metfs):
    src = tmp_path / "tier"
    make_tree(src, n=150)
    prom = tmp_path / "metfs.prom"
    m = mounts(src, "6MiB", "--rf", "2", "--prefetch-rate", "auto", "--metrics-file", str(prom))
    m.mount()
    for _ in range(12):
        time.sleep(0.05)  # a pass takes time: pacing derives the rate from it
        m.pass_end(metrics={"loss": 0.5})
    st = m.status()
    for key in (
        "b2_bytes_per_s",
        "eb1_bytes_per_s",
        "pass_seconds",
        "stall_free_rf",
        "blocked_seconds",
        "bonus_passes",
        "staging",
    ):
        assert key in st, key
    assert st["pass_seconds_mean"] and st["pass_seconds_mean"] > 0.04
    # The daemon's stall-free rf is the model's ceil(EB1 / B2), from the figures it reports.
    if st["b2_bytes_per_s"] and st["eb1_bytes_per_s"] is not None:
        assert st["stall_free_rf"] == max(
            1, math.ceil(st["eb1_bytes_per_s"] / st["b2_bytes_per_s"])
        ), st
    wait_for(lambda: prom.exists(), timeout=15, what="the metrics file")
    text = prom.read_text()
    assert "metfs_tier_read_bytes_total" in text and "# TYPE" in text, text[:500]
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            float(value)
            assert name.startswith("metfs_"), name
    out = tmp_path / "report"
    r = run(metfs, "report", str(m.cache / "run"), "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary, summary
    for png in ("rf_per_mini_epoch.png", "rf_histogram.png", "tier_bandwidth.png"):
        assert is_png(out / png), png
    assert (out / "summary.txt").read_text()


def test_output_into_a_closed_pipe_ends_quietly(metfs, tmp_path):
    # `metfs manifest SRC | head -1`: the reader goes away after one line; the writer must end as
    # Unix tools do (SIGPIPE), not panic with "failed printing to stdout".
    make_tree(tmp_path / "src", n=3000)
    p = subprocess.run(
        f"'{metfs}' manifest '{tmp_path / 'src'}' | head -1; echo \"rc=${{PIPESTATUS[0]}}\" >&2",
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.stdout.startswith("path,size"), p.stdout
    assert "panicked" not in p.stderr, p.stderr
    assert "rc=141" in p.stderr, p.stderr  # 128 + SIGPIPE
