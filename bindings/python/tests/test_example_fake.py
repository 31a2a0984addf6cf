"""examples/met_sklearn.py against the fake socket with real files (the real mount: see
test_daemon_passes.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from fake_daemon import FakeDaemon
from realmount import REPO, dataset_module


def test_example_trains_and_reports(  # type: ignore[no-untyped-def]
    fake_view: FakeDaemon, tmp_path
) -> None:
    val = tmp_path / "val"
    dataset_module().make_dataset(str(tmp_path / "unused"), 2, 1, 0, str(val), 10)
    out = tmp_path / "summary.json"
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "examples", "met_sklearn.py"),
            "--mount",
            fake_view.mountpoint,
            "--socket",
            fake_view.path,
            "--val",
            str(val),
            "--epochs",
            "1",
            "--json",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout
    summary = json.loads(out.read_text())
    assert summary["passes"] == 6 and summary["decisions"] == ["repeat", "advance"] * 3
    assert [(r["epoch"], r["mini_epoch"], r["passes"]) for r in summary["mini_epochs"]] == [
        (0, 0, 2),
        (0, 1, 2),
        (0, 2, 2),
    ]
    sizes = {
        m: sum(
            os.path.getsize(os.path.join(fake_view.mountpoint, f)) for f in fake_view.files_at(0, m)
        )
        for m in range(3)
    }
    assert [r["view_bytes"] for r in summary["mini_epochs"]] == [sizes[0], sizes[1], sizes[2]]
    assert summary["mount_bytes"] == 2 * sum(sizes.values())
    assert 0.5 <= summary["final_val_accuracy"] <= 1.0
    assert all(set(m) == {"loss", "accuracy", "val_accuracy"} for m in fake_view.metrics)
    assert "bytes read from the tier" in proc.stdout and "   0    2      2" in proc.stdout


def test_example_fails_clearly_without_daemon(tmp_path) -> None:  # type: ignore[no-untyped-def]
    val = tmp_path / "val"
    dataset_module().make_dataset(str(tmp_path / "unused"), 2, 1, 0, str(val), 10)
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "examples", "met_sklearn.py"),
            "--mount",
            str(tmp_path),
            "--socket",
            str(tmp_path / "no.sock"),
            "--val",
            str(val),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode != 0
    assert "error:" in proc.stdout and "does not exist" in proc.stdout
