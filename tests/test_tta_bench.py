"""Smoke test of the time-to-accuracy benchmark (benches/tta.py --quick): Garage behind the
rate-capping proxy, a small generated image dataset, one seed, a few seconds of real PyTorch
training per side on the local copy, every metfs side (fixed rf 1, score, bollinger, fixed rf 4
with and without blocking) and the direct peer. It proves the harness measures: every side
trains and is measured, its tier bytes and its fraction of the cap are counted, each seed's
target is fixed from its local copy, and the table and the sides' configurations are printed.
Accuracies belong to the full run (docs/BENCHMARKS.md). A peer missing on the machine stops a
run with its name, or is skipped and said so under --allow-missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, metfs_bin


def quick(env: dict[str, str], *flags: str) -> subprocess.CompletedProcess[str]:
    """`benches/tta.py --quick --no-install FLAGS`, its output captured."""
    return subprocess.run(
        [sys.executable, str(ROOT / "benches/tta.py"), "--quick", "--no-install", *flags],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )


def test_tta_benchmark_quick(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the time-to-accuracy benchmark needs root (FUSE mounts, dropping caches)")
    pytest.importorskip("torch")
    out = tmp_path / "rows.json"
    env = dict(os.environ, METFS_BIN=metfs_bin())
    r = quick(
        env,
        "--json",
        str(out),
        "--curves",
        str(tmp_path / "curves.json"),
        "--runs",
        str(tmp_path / "runs.jsonl"),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(out.read_text())
    rows = data["rows"]
    sides = {row["side"] for row in rows}
    assert {
        "local",
        "metfs-rf1",
        "metfs-score",
        "metfs-bollinger",
        "metfs-rf4",
        "metfs-rf4-block",
        "direct",
    } <= sides, (sides, data["skipped"])
    for row in rows:
        assert row["error"] is None, row
        assert row["samples"] > 0 and row["step_s"] > 0, row
        # The weights are measured at the start, at every pass or epoch and at the end.
        assert len(row["curve"]) >= 2 and row["curve"][0][0] == 0.0, row
        if row["side"] == "local":
            assert row["tier_bytes"] == 0, row
        else:
            assert row["tier_bytes"] > 0, row
    for row in rows:
        if row["side"].startswith("metfs"):
            # The daemon's own count of what it fetched agrees with the proxy's (which adds
            # headers and the listing).
            assert 0 < row["metfs_tier_bytes"] <= row["tier_bytes"], row
    assert 0 < data["target"] < 1
    assert set(data["targets"]) == {"0"} and 0 < data["targets"]["0"] < 1, data["targets"]
    assert "Target accuracy per seed" in r.stdout
    assert data["summary"]["direct"]["cap"][0] > 0, data["summary"]["direct"]
    assert "| tier read / cap |" in r.stdout and "Configuration of each side:" in r.stdout
    assert "Commit each side ran at: local copy (full shuffle) " in r.stdout, r.stdout
    assert "* direct from the tier: boto3 get_object" in r.stdout, r.stdout
    for label in (
        "local copy (full shuffle)",
        "metfs fixed rf 1",
        "metfs score",
        "metfs bollinger",
        "metfs fixed rf 4 (the default)",
        "metfs fixed rf 4, blocking",
        "direct from the tier",
    ):
        assert f"| {label} |" in r.stdout, r.stdout
    curves = json.loads((tmp_path / "curves.json").read_text())
    assert len(curves["series"]) == len(sides) and curves["hlines"], curves

    # Resumed: every run of the first is in the runs file and none is run again; the report
    # is made from them.
    runs = (tmp_path / "runs.jsonl").read_text().splitlines()
    assert len(runs) == 1 + len(rows), runs[:1]
    again = quick(env, "--sides", "local,direct", "--runs", str(tmp_path / "runs.jsonl"))
    assert again.returncode == 0, again.stderr[-3000:]
    for side in ("local", "direct"):
        assert f"{side} seed 0: reused from" in again.stderr, again.stderr[-3000:]
    assert (tmp_path / "runs.jsonl").read_text().splitlines() == runs
    assert "| direct from the tier |" in again.stdout, again.stdout


def test_tta_benchmark_stops_on_a_missing_peer(tmp_path: Path) -> None:
    """Bad input: a peer that is not on the machine (and is not to be installed) stops the run
    with its name and the reason, before anything starts; --allow-missing goes on without it."""
    if os.geteuid() != 0:
        pytest.skip("the time-to-accuracy benchmark needs root")
    pytest.importorskip("torch")
    empty = tmp_path / "bin"
    empty.mkdir()
    env = dict(os.environ, METFS_BIN=metfs_bin(), PATH=str(empty))
    r = subprocess.run(
        [sys.executable, str(ROOT / "benches/tta.py"), "--sides", "local,s3fs", "--no-install"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert r.returncode != 0
    assert "side s3fs cannot run: s3fs is not installed (--no-install)" in r.stderr, r.stderr


def test_tta_benchmark_refuses_runs_of_other_settings(tmp_path: Path) -> None:
    """Bad input: a runs file written with other settings is refused before anything starts,
    naming the setting that differs; one that is not a runs file is refused naming the file."""
    if os.geteuid() != 0:
        pytest.skip("the time-to-accuracy benchmark needs root")
    pytest.importorskip("torch")
    runs = tmp_path / "runs.jsonl"
    cmd = [sys.executable, str(ROOT / "benches/tta.py"), "--secs", "60", "--runs", str(runs)]
    runs.write_text(json.dumps({"settings": {"secs": 240.0}}) + "\n")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert f"--runs {runs} was written with other settings (" in r.stderr, r.stderr
    assert "secs 240.0 there, 60.0 here" in r.stderr, r.stderr
    runs.write_text("local,0,0.85\n")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert f"--runs {runs}: not a runs file of this benchmark" in r.stderr, r.stderr
