"""Smoke test of the fixed-rf front benchmark (benches/rf_front.py --quick): the glyphs of
examples/cnn_study.py on a real mount, one seed, fixed rf 2 and 8 and the paced policy, seconds
each. It proves the harness measures (every run trains through the mount, its tier bytes are
counted, each adaptive run is paired with its seed's fixed front) and prints its table, its
ratio lines and the front's PNG. The accuracies belong to the full run (docs/EXPERIMENTS.md)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from conftest import ROOT, metfs_bin


def test_rf_front_quick(tmp_path: Path) -> None:
    out, png = tmp_path / "runs.json", tmp_path / "front.png"
    env = dict(os.environ, METFS_BIN=metfs_bin())
    # A short directory: the mounts' control sockets must fit in sun_path.
    work = tempfile.mkdtemp(prefix="rff-", dir="/tmp")
    try:
        r = run_quick(work, out, png, env)
        check(r, out, png)
        # Again with the same file: every run is in it, so none runs again, and the table is the
        # same runs' (an interrupted full run resumes this way).
        first = json.loads(out.read_text())
        again = run_quick(work, out, png, env)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        assert "resuming: 3 runs already in" in again.stdout, again.stdout[-3000:]
        assert "run glyphs " not in again.stdout, "a run in the file was made again"
        assert json.loads(out.read_text()) == first
        assert "| paced | " in again.stdout
        assert all(x["commit"] for x in first), first
        # A file that is not this benchmark's runs is refused naming it, and left as it was.
        out.write_text('{"not": "runs"}')
        bad = run_quick(work, out, png, env)
        assert bad.returncode != 0 and str(out) in bad.stderr, bad.stderr[-3000:]
        assert out.read_text() == '{"not": "runs"}'
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_quick(
    work: str, out: Path, png: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            str(ROOT / "benches/rf_front.py"),
            "--quick",
            "--work",
            work,
            "--json",
            str(out),
            "--png",
            str(png),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def check(r: subprocess.CompletedProcess[str], out: Path, png: Path) -> None:
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for line in [
        "### glyphs",
        "| configuration | test accuracy % (95 % CI) | tier MiB | passes | mean rf |",
        "| fixed rf 2 | ",
        "| fixed rf 8 | ",
        "| paced | ",
        "ratio glyphs paced: ",
        " pt vs the fixed front at equal tier bytes ",
        "x the front's tier bytes for its accuracy",
    ]:
        assert line in r.stdout, f"{line!r} not printed:\n{r.stdout[-3000:]}"
    runs = json.loads(out.read_text())
    assert {x["config"] for x in runs} == {"fixed rf 2", "fixed rf 8", "paced"}
    for x in runs:
        assert x["tier_bytes"] > 0 and x["passes"] > 0, x
    # rf 8 reads fewer mini-epochs than rf 2 for the same samples.
    by = {x["config"]: x for x in runs}
    assert by["fixed rf 8"]["tier_bytes"] < by["fixed rf 2"]["tier_bytes"]
    assert png.stat().st_size > 0
