"""Smoke test of the scale benchmark (benches/scale.py --quick): 20,000 small files, every row
once, with the checks that hold at any size: the packed list is the JSON list, a pass over an
unchanged view receives no list, a switch receives exactly one, the loaders read every sample,
the daemon lists each new view for the kernel (and does not with `--prime-entries=false`).
The numbers belong to the full run (docs/BENCHMARKS.md, "Scale")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, metfs_bin


def test_scale_benchmark_quick(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the scale benchmark drops the page cache (root)")
    reader = ROOT / "target" / "debug" / "examples" / "readbench"
    if not reader.exists():
        subprocess.run(
            ["cargo", "build", "-q", "-p", "metfs", "--example", "readbench"], cwd=ROOT, check=True
        )
    env = dict(
        os.environ,
        METFS_BIN=metfs_bin(),
        METFS_READBENCH=str(reader),
        METFS_BENCH_DIR=str(tmp_path / "work"),
    )
    r = subprocess.run(
        [sys.executable, str(ROOT / "benches/scale.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    table = r.stdout[r.stdout.rindex("| what |") :]
    for row in (
        "mount (catalog",
        "staging the next mini-epoch",
        "`Client.files()`",
        "over an unchanged view",
        "`os.walk` of the view, cold",
        "16 threads, warm",
        "`DataLoader`",
        "first walk after a switch",
        "daemon RSS",
        "remount",
        "the first pass over a new view",
    ):
        assert row in table, (row, table)
    assert "CHECK FAILED" not in r.stdout
