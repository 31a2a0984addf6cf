#!/usr/bin/env python3
"""Data-parallel PyTorch training over metfs mounts, one rank per task (srun or torchrun).

Every rank reads the current mini-epoch through its own node's metfs mount. Ranks on the same
node split that node's view (``files[local_rank::ranks_per_node]``); nodes hold disjoint shards
(``metfs mount --node-rank/--nodes``). After each pass the ranks report their metrics through
:mod:`metfs`: with ``torch.distributed`` initialised, rank 0's daemon decides repeat or
advance and every node moves to the same mini-epoch (``TorchDistributedCoordinator``).

The model is a linear classifier on 64 features per file (``metfs_job.features``), wrapped in
``DistributedDataParallel``; nodes' views differ in size, so each pass runs under
``torch.distributed.algorithms.Join`` (uneven inputs).

    srun python train_torch.py --epochs 2 --classes 10 --log-dir logs/

Exits 1 with ``train: rank R on NODE: <reason>`` when metfs fails on any node (a daemon that
died, a mount that vanished), so ``srun --kill-on-bad-exit=1`` ends the step at once.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import metfs_job  # noqa: E402


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=2, help="MET epochs to train (default 2)")
    ap.add_argument("--classes", type=int, default=10, help="number of classes (default 10)")
    ap.add_argument("--batch-size", type=int, default=32, help="samples per step (default 32)")
    ap.add_argument("--lr", type=float, default=0.5, help="SGD learning rate (default 0.5)")
    ap.add_argument(
        "--socket",
        default=None,
        help="control socket (default $METFS_SOCKET or $METFS_CACHE_ROOT/metfs.sock; %%n = node)",
    )
    ap.add_argument(
        "--log-dir",
        default=os.environ.get("METFS_PASS_LOG"),
        help="write rank<R>.jsonl with one line per pass here (default $METFS_PASS_LOG)",
    )
    ap.add_argument(
        "--dist-timeout",
        type=float,
        default=120.0,
        help="seconds any collective may wait for a peer (default 120)",
    )
    ap.add_argument(
        "--pass-sleep",
        type=float,
        default=0.0,
        help="extra seconds per pass (to make a demo or a test last longer)",
    )
    args = ap.parse_args(argv)

    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel

    import metfs

    torch.set_num_threads(1)
    rank, world, local, local_world = metfs_job.init_distributed(args.dist_timeout)
    log = metfs_job.PassLog(args.log_dir, rank)
    sock = metfs_job.socket_path(args.socket)
    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.Linear(metfs_job.FEATURES, args.classes)
    ddp = DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")
    t0 = time.monotonic()
    try:
        client = metfs.Client(sock, job=metfs_job.job_name("train_torch"))
        run = metfs.passes(client, epochs=args.epochs)
        if rank == 0:
            print(f"train: {world} ranks, coordinator {type(run.coordinator).__name__}", flush=True)
            share = client.connect().share
            if share is not None:
                print(
                    f"train: job {client.job} on a shared store, its view at {share['path']}",
                    flush=True,
                )
        for p in run:
            files = p.files[local::local_world]
            paths = p.paths[local::local_world]
            x_np, y_np = metfs_job.load_view(paths, files, args.classes, client)
            x, y = torch.from_numpy(x_np), torch.from_numpy(y_np)
            order = torch.randperm(len(y), generator=torch.Generator().manual_seed(p.index))
            sums = torch.zeros(3, dtype=torch.float64)  # loss, correct, samples
            ctx = Join([ddp]) if world > 1 else _Null()
            with ctx:
                for i in range(0, len(order), args.batch_size):
                    idx = order[i : i + args.batch_size]
                    opt.zero_grad()
                    out = ddp(x[idx])
                    loss = loss_fn(out, y[idx])
                    (loss / len(idx)).backward()
                    opt.step()
                    sums += torch.tensor(
                        [loss.item(), (out.argmax(1) == y[idx]).sum().item(), len(idx)],
                        dtype=torch.float64,
                    )
            if world > 1:
                dist.all_reduce(sums)
            n = max(1.0, float(sums[2]))
            loss_avg, acc = float(sums[0]) / n, float(sums[1]) / n
            p.report(loss=loss_avg, accuracy=acc)
            log.write(
                {
                    "pass": p.index,
                    "epoch": p.epoch,
                    "mini_epoch": p.mini_epoch,
                    "generation": p.generation,
                    "files": files,
                    "loss": loss_avg,
                    "accuracy": acc,
                    "t": time.monotonic() - t0,
                }
            )
            if rank == 0:
                print(
                    f"train: pass {p.index} epoch {p.epoch} mini-epoch {p.mini_epoch} "
                    f"files {int(sums[2])} loss {loss_avg:.4f} accuracy {acc:.3f}",
                    flush=True,
                )
            if args.pass_sleep:
                time.sleep(args.pass_sleep)
        if rank == 0:
            print(f"train: done, rf per mini-epoch {run.rf_per_mini_epoch()}", flush=True)
        if client.connect().share is not None:
            client.leave()  # a trial of a sweep: its share of the store goes to the next one
    except metfs.MetfsError as e:
        metfs_job.fail(rank, f"metfs error ({e.code}): {e.message}")
    except RuntimeError as e:  # I/O through the mount, or a collective whose peer is gone
        metfs_job.fail(rank, str(e).splitlines()[0] if str(e) else type(e).__name__)
    if world > 1:
        dist.destroy_process_group()
    return 0


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    sys.exit(main())
