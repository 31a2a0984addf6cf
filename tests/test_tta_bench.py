"""Smoke test of the time-to-accuracy benchmark (benches/tta.py --quick): Garage behind the
rate-capping proxy, a small generated image dataset, one seed, a few seconds of real PyTorch
training per side on the local copy, every metfs side (score, bollinger, fixed rf 4 with and
without blocking) and the direct peer. It proves the harness measures: every side trains and
is measured, its tier bytes are counted, the target is fixed from the local copy and the table
is printed. Accuracies belong to the full run (docs/BENCHMARKS.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, metfs_bin


def test_tta_benchmark_quick(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the time-to-accuracy benchmark needs root (FUSE mounts, dropping caches)")
    pytest.importorskip("torch")
    out = tmp_path / "rows.json"
    env = dict(os.environ, METFS_BIN=metfs_bin())
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benches/tta.py"),
            "--quick",
            "--no-install",
            "--json",
            str(out),
            "--curves",
            str(tmp_path / "curves.json"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(out.read_text())
    rows = data["rows"]
    sides = {row["side"] for row in rows}
    assert {
        "local",
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
    assert "Target accuracy:" in r.stdout
    for label in (
        "local copy (full shuffle)",
        "metfs score",
        "metfs bollinger",
        "metfs fixed rf 4",
        "metfs fixed rf 4, blocking",
        "direct from the tier",
    ):
        assert f"| {label} |" in r.stdout, r.stdout
    curves = json.loads((tmp_path / "curves.json").read_text())
    assert len(curves["series"]) == len(sides) and curves["hlines"], curves
