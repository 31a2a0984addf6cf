#!/usr/bin/env python3
"""One rank of the ADJUST_BS test on Slurm (`tests/test_slurm.py`), launched by
`deploy/slurm/train-pytorch.sbatch` as its TRAIN with several ranks per node.

Every rank joins torch.distributed (gloo), reads its node's metfs mount and runs a fixed number
of steps per pass; a step reads the rank's local batch (`p.batch_size`, from
`metfs.batchsize.AdjustBs`) from its part of the view, paced to `--rate` samples per second (the speed
of a model's step), and records the samples and the step's time with `AdjustBs.record`. From
pass `FROM` on, the ranks of node `NODE` are capped at a lower rate (`--slow NODE:RATE:FROM`).
Each pass appends one JSON line to `LOG_DIR/bs-rank<R>.jsonl`: the pass, the rank's node, local
rank and batch size, every rank's sizes and the changes so far.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "deploy" / "slurm" / "examples"))

import metfs_job  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--global-batch", type=int, required=True)
    ap.add_argument("--passes", type=int, required=True)
    ap.add_argument("--steps", type=int, default=4, help="steps per pass")
    ap.add_argument("--rate", type=float, required=True, help="samples per second of a rank")
    ap.add_argument("--slow", required=True, help="NODE:RATE:FROM_PASS")
    ap.add_argument("--window", type=float, required=True, help="AdjustBs window_s")
    ap.add_argument("--slowness", type=float, default=1.5, help="AdjustBs slowness (λ)")
    ap.add_argument("--log-dir", required=True)
    args = ap.parse_args()
    slow_node, slow_rate, slow_from = args.slow.split(":")

    import metfs
    from metfs.batchsize import AdjustBs

    rank, _world, local, local_world = metfs_job.init_distributed(60.0)
    node = metfs_job.node_name()
    os.makedirs(args.log_dir, exist_ok=True)
    log = Path(args.log_dir) / f"bs-rank{rank}.jsonl"
    try:
        client = metfs.Client(metfs_job.socket_path(), job="adjust-bs")
        bs = AdjustBs(args.global_batch, slowness=args.slowness, window_s=args.window)
        run = metfs.passes(client, epochs=1000, max_passes=args.passes, adjust_bs=bs)
        for p in run:
            paths = p.paths[local::local_world] or p.paths
            rate = (
                float(slow_rate) if node == slow_node and p.index >= int(slow_from) else args.rate
            )
            size = run.local_batch_size()
            assert size == p.batch_size
            k = 0
            for _ in range(args.steps):
                t0 = time.monotonic()
                for _ in range(size):
                    with open(paths[k % len(paths)], "rb") as f:
                        f.read()
                    k += 1
                # The rate cap: a step of `size` samples takes at least size / rate seconds.
                time.sleep(max(0.0, size / rate - (time.monotonic() - t0)))
                bs.record(size, time.monotonic() - t0)
            with open(log, "a") as f:
                f.write(
                    json.dumps(
                        {
                            "pass": p.index,
                            "rank": rank,
                            "node": bs.node,
                            "local": local,
                            "batch_size": size,
                            "sizes": bs.sizes,
                            "changes": len(bs.changes),
                        }
                    )
                    + "\n"
                )
        if rank == 0:
            for c in bs.changes:
                print(
                    "adjust-bs: change "
                    + json.dumps(
                        {
                            "boundary": c.boundary,
                            "before": c.before,
                            "after": c.after,
                            "stragglers": c.check.stragglers,
                            "throughputs": c.check.throughputs,
                            "bpt": c.check.bpt,
                            "mean_bpt": c.check.mean_bpt,
                            "window_s": c.check.window_s,
                        }
                    ),
                    flush=True,
                )
            print(
                f"adjust-bs: done after {len(run.records)} passes, {len(bs.changes)} change(s)",
                flush=True,
            )
    except metfs.MetfsError as e:
        metfs_job.fail(rank, f"metfs error ({e.code}): {e.message}")
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
