"""Runs the ranks of a torch.distributed (gloo) job over metfs, one subprocess each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def run_ranks(
    sockets: list[str], epochs: int, workdir: str, kill_after: list[int | None] | None = None
) -> list[dict[str, Any]]:
    """Runs one dist_worker.py per socket; returns their reports."""
    store = os.path.join(workdir, "store")
    procs = []
    outs = []
    for rank, sock in enumerate(sockets):
        out = os.path.join(workdir, f"rank{rank}.json")
        outs.append(out)
        args = [
            sys.executable,
            os.path.join(HERE, "dist_worker.py"),
            str(rank),
            str(len(sockets)),
            store,
            sock,
            out,
            str(epochs),
        ]
        if kill_after and kill_after[rank] is not None:
            args.append(str(kill_after[rank]))
        procs.append(subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=120)[0].decode(errors="replace"))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("a rank hung")
    reports = []
    for rank, (out, log, p) in enumerate(zip(outs, logs, procs)):
        # The exit status says how a rank that wrote nothing ended (negative: the signal).
        assert os.path.exists(out), (
            f"rank {rank} wrote no report (exit status {p.returncode}):\n{log[-3000:]}"
        )
        with open(out) as f:
            reports.append(json.load(f))
    return reports
