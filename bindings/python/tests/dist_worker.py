"""One rank of a two-rank ``torch.distributed`` (gloo) job over metfs, run in a subprocess.

``python dist_worker.py RANK WORLD STORE SOCKET OUT EPOCHS [KILL_AFTER]`` joins the process group,
runs :func:`metfs.passes` against its own daemon's socket, reading every file of each pass,
and writes a JSON report to OUT: the position, generation and files of every pass, and the
error if one was raised. With KILL_AFTER, this rank tells its (fake) daemon to die after that
many passes (``shutdown`` op).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
import traceback
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))


def main() -> int:
    rank, world, store, sock, out = (
        int(sys.argv[1]),
        int(sys.argv[2]),
        sys.argv[3],
        sys.argv[4],
        sys.argv[5],
    )
    epochs = int(sys.argv[6])
    kill_after = int(sys.argv[7]) if len(sys.argv) > 7 else None

    import torch.distributed as dist

    import metfs

    report: dict[str, Any] = {"rank": rank, "passes": [], "error": None, "code": None}
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    t0 = time.monotonic()
    try:
        client = metfs.Client(sock, job="dist")
        run = metfs.passes(client, epochs=epochs)
        report["coordinator"] = type(run.coordinator).__name__
        for p in run:
            nbytes = 0
            for path in p.paths:
                if os.path.exists(path):
                    with open(path, "rb") as f:
                        nbytes += len(f.read())
            report["passes"].append(
                {
                    "epoch": p.epoch,
                    "mini_epoch": p.mini_epoch,
                    "generation": p.generation,
                    "files": list(p.files),
                    "bytes": nbytes,
                }
            )
            p.report(loss=1.0 / (p.index + 1), rank=rank)
            if kill_after is not None and p.index + 1 == kill_after:
                try:
                    client.request({"op": "shutdown"})
                except metfs.MetfsError:
                    pass
        report["decisions"] = [d.decision for d in run.decisions]
        report["not_ready"] = [d.not_ready_ranks for d in run.decisions]
        report["done"] = run.done
    except metfs.MetfsError as e:
        report["error"] = e.message
        report["code"] = e.code
    except Exception as e:  # noqa: BLE001 - any failure goes into the report the test reads
        report["error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
        report["code"] = "exception"
    report["seconds"] = time.monotonic() - t0
    report["host"] = socket.gethostname()
    with open(out, "w") as f:
        json.dump(report, f)
    # The report is written; a peer that already left may make the teardown fail.
    with contextlib.suppress(Exception):
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
