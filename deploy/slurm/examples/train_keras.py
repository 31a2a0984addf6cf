#!/usr/bin/env python3
"""Multi-node Keras 3 training over metfs mounts, one rank per task (srun).

Keras runs on its torch backend. Each rank trains its own copy of the model on its node's
current mini-epoch (one Keras epoch = one pass, :class:`metfs.keras.MetSequence`); after every
pass the ranks average their weights and metrics over ``torch.distributed`` (gloo), so they
stay one model (synchronous model averaging, as in local SGD). ``metfs.keras.MetCallback``
reports each pass; with ``torch.distributed`` initialised, rank 0's daemon decides and every
node moves to the same mini-epoch.

    srun python train_keras.py --epochs 2 --classes 10 --log-dir logs/

Exits 1 with ``train: rank R on NODE: <reason>`` when metfs fails on any node.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Dict, List, Optional

os.environ.setdefault("KERAS_BACKEND", "torch")  # before keras is imported

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
    args = ap.parse_args(argv)

    import keras
    import numpy as np
    import torch
    import torch.distributed as dist

    import metfs
    from metfs.keras import MetCallback, MetSequence

    torch.set_num_threads(1)
    rank, world, local, local_world = metfs_job.init_distributed(args.dist_timeout)
    log = metfs_job.PassLog(args.log_dir, rank)
    t0 = time.monotonic()
    try:
        client = metfs.Client(
            metfs_job.socket_path(args.socket), job=metfs_job.job_name("train_keras")
        )
        mount = client.connect().view_path or ""

        def load(path: str) -> Any:
            rel = os.path.relpath(path, mount)
            x = metfs_job.features(path, metfs_job.read_or_explain(path, client))
            return x, np.int64(metfs_job.label_of(rel, args.classes))

        train = MetSequence(client, load, batch_size=args.batch_size, seed=rank)
        keras.utils.set_random_seed(0)  # the same initial weights on every rank
        model = keras.Sequential(
            [
                keras.Input((metfs_job.FEATURES,)),
                keras.layers.Dense(args.classes, activation="softmax"),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.SGD(args.lr),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )

        class Average(keras.callbacks.Callback):
            """Averages weights and this pass's metrics over the ranks, and logs the pass."""

            def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
                if world > 1:
                    weights = []
                    for w in self.model.get_weights():
                        t = torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32))
                        dist.all_reduce(t)
                        weights.append((t / world).numpy())
                    self.model.set_weights(weights)
                if logs is not None:
                    keys = sorted(k for k in logs if k in ("loss", "accuracy"))
                    vals = torch.tensor([float(logs[k]) for k in keys], dtype=torch.float64)
                    if world > 1:
                        dist.all_reduce(vals)
                        vals /= world
                    for k, v in zip(keys, vals.tolist(), strict=True):
                        logs[k] = v
                view = train.view
                log.write(
                    {
                        "pass": epoch,
                        "epoch": view.epoch,
                        "mini_epoch": view.mini_epoch,
                        "generation": view.generation,
                        "files": list(view.files),
                        "loss": (logs or {}).get("loss"),
                        "accuracy": (logs or {}).get("accuracy"),
                        "t": time.monotonic() - t0,
                    }
                )
                if rank == 0:
                    print(
                        f"train: pass {epoch} epoch {view.epoch} mini-epoch {view.mini_epoch} "
                        f"loss {(logs or {}).get('loss', float('nan')):.4f} "
                        f"accuracy {(logs or {}).get('accuracy', float('nan')):.3f}",
                        flush=True,
                    )

        met = MetCallback(client, epochs=args.epochs, datasets=[train])
        # Average runs first, so the decision is taken on the averaged metrics.
        model.fit(train, epochs=1_000_000, callbacks=[Average(), met], verbose=0)
        if rank == 0:
            print(f"train: done after {len(met.decisions)} passes (done={met.done})", flush=True)
        if client.connect().share is not None:
            client.leave()  # a trial of a sweep: its share of the store goes to the next one
    except metfs.MetfsError as e:
        metfs_job.fail(rank, f"metfs error ({e.code}): {e.message}")
    except Exception as e:  # noqa: BLE001 - I/O through the mount, a vanished peer, ...
        metfs_job.fail(rank, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    if world > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
