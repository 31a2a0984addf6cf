#!/usr/bin/env python3
"""Train a scikit-learn classifier over a metfs mount, one mini-epoch at a time.

    python examples/met_sklearn.py --mount MNT --socket SOCK --val VAL_DIR [--epochs 2]

The dataset is the ImageFolder layout of ``scripts/make_dataset.py`` (one ``.npy`` image per
file, class = directory name), mounted with ``metfs mount``; the validation set is a separate
local directory in the same layout. Every pass reads every file of the current view through the
mount and runs ``SGDClassifier.partial_fit`` on them (all classes given on the first call);
after the pass it reports ``loss``, ``accuracy`` (on the pass's data) and ``val_accuracy`` to
the daemon, which answers repeat / advance / wait.

It prints one line per mini-epoch (passes, files, bytes of the view, bytes the daemon read from
the capacity tier meanwhile, accuracy), and at the end the bytes read from the tier against the
bytes read through the mount, which is what reading every pass from the tier would have cost.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import metfs
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, os.path.join(HERE, "..", "bindings", "python", "src"))
    import metfs


def load_sample(path: str) -> Tuple[np.ndarray, int, int]:
    """One sample: 64 features in [0, 1], its class (directory name) and the bytes read."""
    with open(path, "rb") as f:
        raw = f.read()
    import io

    img = np.load(io.BytesIO(raw))
    k = img.shape[0] // 8
    x = img.reshape(8, k, 8, k).mean(axis=(1, 3)).reshape(64).astype(np.float32) / 16.0
    return x, int(os.path.basename(os.path.dirname(path))), len(raw)


def load_folder(root: str) -> Tuple[np.ndarray, np.ndarray]:
    """Every sample under a local ImageFolder directory."""
    paths = sorted(
        os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".npy")
    )
    if not paths:
        raise SystemExit(f"error: no .npy samples under {root}")
    xs, ys = zip(*[load_sample(p)[:2] for p in paths], strict=True)
    return np.stack(xs), np.array(ys)


def human(n: float) -> str:
    """Bytes in a readable unit."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mount", required=True, help="the metfs mountpoint")
    ap.add_argument("--socket", default=None, help="control socket (default: $METFS_SOCKET)")
    ap.add_argument("--val", required=True, help="local directory with the validation set")
    ap.add_argument("--epochs", type=int, default=2, help="MET epochs to train (default 2)")
    ap.add_argument("--job", default="met_sklearn", help="job name sent to the daemon")
    ap.add_argument("--seed", type=int, default=0, help="random seed of the classifier")
    ap.add_argument("--block", action="store_true", help="wait for staging instead of repeating")
    ap.add_argument("--json", default=None, help="also write a JSON summary to this file")
    args = ap.parse_args(argv)

    from sklearn.linear_model import SGDClassifier
    from sklearn.metrics import log_loss

    x_val, y_val = load_folder(args.val)
    classes = np.unique(y_val)
    clf = SGDClassifier(loss="log_loss", alpha=1e-4, random_state=args.seed)
    rng = np.random.default_rng(args.seed)

    try:
        client = metfs.Client(args.socket, job=args.job)
    except metfs.MetfsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    mount = os.path.realpath(args.mount)
    if client.info and client.info.mountpoint and os.path.realpath(client.info.mountpoint) != mount:
        print(
            f"error: the daemon at {client.socket_path} serves {client.info.mountpoint}, "
            f"not {mount}",
            file=sys.stderr,
        )
        return 1

    start = client.status()
    print(
        f"metfs {client.info.version if client.info else '?'}: {start.mini_epochs} mini-epochs, "
        f"rf {start.rf:g} ({start.policy or '?'} policy), budget "
        f"{human(start.budget_bytes or 0)}; training {args.epochs} epoch(s) from epoch "
        f"{start.epoch}, mini-epoch {start.mini_epoch}"
    )
    print(
        f"{'epoch':>5} {'mini':>4} {'passes':>6} {'files':>6} {'view':>10} "
        f"{'staged':>10} {'accuracy':>8} {'val_acc':>8}"
    )
    mount_bytes = 0
    tier_at_start = start.tier_bytes_read or 0
    tier_mark = tier_at_start
    rows: List[Dict[str, Any]] = []
    row: Optional[Dict[str, Any]] = None
    t0 = time.monotonic()

    def finish(row: Dict[str, Any]) -> None:
        """Prints a mini-epoch once the view has moved past it."""
        nonlocal tier_mark
        tier_now = client.status().tier_bytes_read or 0
        row["staged_bytes"] = tier_now - tier_mark
        tier_mark = tier_now
        rows.append(row)
        print(
            f"{row['epoch']:>5} {row['mini_epoch']:>4} {row['passes']:>6} {row['files']:>6} "
            f"{human(row['view_bytes']):>10} {human(row['staged_bytes']):>10} "
            f"{row['accuracy']:>8.3f} {row['val_accuracy']:>8.3f}",
            flush=True,
        )

    run = metfs.passes(client, epochs=args.epochs, block=args.block)
    try:
        for p in run:
            if row is not None and p.position != (row["epoch"], row["mini_epoch"]):
                finish(row)
                row = None
            loaded = [load_sample(path) for path in p.paths]
            if not loaded:
                print(f"error: the view of generation {p.generation} is empty", file=sys.stderr)
                return 1
            x = np.stack([s[0] for s in loaded])
            y = np.array([s[1] for s in loaded])
            view_bytes = sum(s[2] for s in loaded)
            mount_bytes += view_bytes
            order = rng.permutation(len(y))
            if p.index == 0:
                clf.partial_fit(x[order], y[order], classes=classes)
            else:
                clf.partial_fit(x[order], y[order])
            proba = clf.predict_proba(x)
            metrics = {
                "loss": float(log_loss(y, proba, labels=clf.classes_)),
                "accuracy": float((clf.classes_[proba.argmax(1)] == y).mean()),
                "val_accuracy": float((clf.predict(x_val) == y_val).mean()),
            }
            p.report(metrics)
            if row is None:
                row = {
                    "epoch": p.epoch,
                    "mini_epoch": p.mini_epoch,
                    "generation": p.generation,
                    "passes": 0,
                    "files": len(p.paths),
                    "view_bytes": view_bytes,
                }
            row["passes"] += 1
            row.update(accuracy=metrics["accuracy"], val_accuracy=metrics["val_accuracy"])
        if row is not None:
            finish(row)
        end = client.status()
    except metfs.MetfsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1

    # Everything the daemon read from the tier: mini-epoch 0 (staged before the mount came
    # up), every later mini-epoch, and the one staged ahead after the last pass.
    tier_bytes = end.tier_bytes_read or 0
    passes_total = len(run.records)
    decisions = [d.decision for d in run.decisions]
    print(
        f"\n{passes_total} passes over {len(rows)} mini-epochs in {time.monotonic() - t0:.1f} s "
        f"({decisions.count('repeat')} repeat, {decisions.count('wait')} wait, "
        f"{decisions.count('advance')} advance); final val_accuracy "
        f"{rows[-1]['val_accuracy'] if rows else float('nan'):.3f}"
    )
    print(f"bytes read through the mount:   {human(mount_bytes):>10}  ({mount_bytes} B)")
    print(
        f"bytes read from the tier:       {human(tier_bytes):>10}  ({tier_bytes} B in all, "
        f"{tier_at_start} B of it before this run; staging ahead included)"
    )
    if tier_bytes > 0:
        print(
            f"reading every pass from the tier would have cost {mount_bytes / tier_bytes:.2f}x "
            "the tier traffic metfs used"
        )
    else:
        print("the tier was not read during this run (everything was staged before it began)")
    if args.json:
        summary = {
            "passes": passes_total,
            "mini_epochs": rows,
            "decisions": decisions,
            "mount_bytes": mount_bytes,
            "tier_bytes": tier_bytes,
            "tier_bytes_before": tier_at_start,
            "start": {"epoch": start.epoch, "mini_epoch": start.mini_epoch},
            "end": {"epoch": end.epoch, "mini_epoch": end.mini_epoch, "generation": end.generation},
            "final_val_accuracy": rows[-1]["val_accuracy"] if rows else None,
        }
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
