#!/usr/bin/env python3
"""Make a small labelled image dataset in ImageFolder layout for the metfs demo and tests.

    python scripts/make_dataset.py OUT_DIR [--classes 10] [--per-class 60] [--seed 0]
                                           [--val-out DIR] [--val-per-class 20]

Samples come from scikit-learn's ``load_digits`` (8x8 grey-level digits, 0..16). Each sample is
one ``.npy`` file ``OUT_DIR/<class>/<class>_<index>.npy`` holding a float32 image at a random
resolution (8x8, 16x16, 24x24 or 32x32, pixel-replicated), so file sizes vary from about 400 B
to about 4 KiB; :func:`load_sample` reads any of them back as a 64-value vector in [0, 1].
When a class needs more samples than the digits set has, the extra ones are noisy copies
(Gaussian noise, sigma 1.5 grey levels, clipped). ``--val-out`` writes a held-out validation
set (samples not used for training) to a separate directory in the same layout.

The output is deterministic for a given seed. Prints one JSON line with the counts and bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Dict, List, Tuple

import numpy as np

#: Upsampling factors: 8x8 .. 32x32 images.
SCALES = (1, 2, 3, 4)


def load_sample(path: str) -> np.ndarray:
    """Reads one sample file back as a float32 vector of 64 values in [0, 1]."""
    img = np.load(path)
    k = img.shape[0] // 8
    return img.reshape(8, k, 8, k).mean(axis=(1, 3)).reshape(64).astype(np.float32) / 16.0


def label_of(path: str) -> int:
    """The class of a sample: the name of its directory, as an int."""
    return int(os.path.basename(os.path.dirname(path)))


def _samples(images: np.ndarray, count: int, rng: np.random.Generator) -> List[np.ndarray]:
    """``count`` 8x8 images: the originals first (shuffled), then noisy copies."""
    order = rng.permutation(len(images))
    out = [images[i] for i in order[:count]]
    while len(out) < count:
        base = images[order[len(out) % len(order)]]
        noisy = np.clip(base + rng.normal(0.0, 1.5, size=base.shape), 0.0, 16.0)
        out.append(noisy)
    return out


def _write(root: str, cls: int, index: int, img: np.ndarray, rng: np.random.Generator) -> int:
    k = int(rng.choice(SCALES))
    big = np.kron(img, np.ones((k, k))).astype(np.float32)
    d = os.path.join(root, str(cls))
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"{cls}_{index:05d}.npy")
    np.save(path, big)
    return os.path.getsize(path)


def make_dataset(
    out_dir: str,
    classes: int = 10,
    per_class: int = 60,
    seed: int = 0,
    val_out: str | None = None,
    val_per_class: int = 20,
) -> Dict[str, int]:
    """Writes the dataset (and optionally the validation set); returns counts and bytes."""
    from sklearn.datasets import load_digits

    if not 1 <= classes <= 10:
        raise ValueError(f"--classes must be between 1 and 10, got {classes}")
    if per_class < 1:
        raise ValueError(f"--per-class must be at least 1, got {per_class}")
    digits = load_digits()
    rng = np.random.default_rng(seed)
    stats = {"train_files": 0, "train_bytes": 0, "val_files": 0, "val_bytes": 0}
    for cls in range(classes):
        images = digits.images[digits.target == cls]
        order = rng.permutation(len(images))
        # Hold out validation originals first so that no training sample (or noisy copy of
        # one) is in the validation set.
        n_val = min(val_per_class, len(images) // 4) if val_out else 0
        val_imgs, train_imgs = images[order[:n_val]], images[order[n_val:]]
        for i, img in enumerate(_samples(train_imgs, per_class, rng)):
            stats["train_bytes"] += _write(out_dir, cls, i, img, rng)
            stats["train_files"] += 1
        if val_out:
            for i, img in enumerate(val_imgs):
                stats["val_bytes"] += _write(val_out, cls, i, img, rng)
                stats["val_files"] += 1
    return stats


def load_folder(root: str) -> Tuple[np.ndarray, np.ndarray]:
    """Every sample under ``root`` (ImageFolder layout) as ``(X, y)``, in sorted path order."""
    paths = sorted(
        os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".npy")
    )
    x = np.stack([load_sample(p) for p in paths]) if paths else np.zeros((0, 64), np.float32)
    y = np.array([label_of(p) for p in paths], dtype=np.int64)
    return x, y


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", help="directory to create the training set in")
    ap.add_argument("--classes", type=int, default=10, help="number of digit classes (1-10)")
    ap.add_argument("--per-class", type=int, default=60, help="training samples per class")
    ap.add_argument("--seed", type=int, default=0, help="random seed")
    ap.add_argument("--val-out", default=None, help="directory for a held-out validation set")
    ap.add_argument("--val-per-class", type=int, default=20, help="validation samples per class")
    args = ap.parse_args(argv)
    if os.path.exists(args.out_dir) and os.listdir(args.out_dir):
        print(f"error: {args.out_dir} exists and is not empty", file=sys.stderr)
        return 2
    try:
        stats = make_dataset(
            args.out_dir, args.classes, args.per_class, args.seed, args.val_out, args.val_per_class
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
