#!/usr/bin/env python3
"""Writes an ImageNet-like manifest for the planning benchmark.

usage: gen_manifest.py N CLASSES OUT [--shuffled] [--seed S]

N samples spread evenly over CLASSES classes (the first N % CLASSES classes get one more), laid
out as an ImageFolder tree (train/<class>/<class>_<i>.JPEG), with lognormal sizes of mean about
110 KiB (sigma 0.6, a rough fit of ImageNet-1k's JPEGs), one CSV row per sample: path,size,label.
Rows come in path order, as a directory listing gives them; --shuffled writes them in random
order to exercise the catalog's sort. Uses numpy for speed when present.
"""

import argparse
import math
import random
import sys


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("n", type=int)
    ap.add_argument("classes", type=int)
    ap.add_argument("out")
    ap.add_argument("--shuffled", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.n < 1 or a.classes < 1:
        sys.exit("N and CLASSES must be positive")
    sigma = 0.6
    mu = math.log(110 * 1024) - sigma * sigma / 2
    try:
        import numpy as np

        rng = np.random.default_rng(a.seed)
        sizes = np.maximum(rng.lognormal(mu, sigma, a.n).astype(np.int64), 1).tolist()
    except ImportError:
        rng = random.Random(a.seed)
        sizes = [max(1, int(rng.lognormvariate(mu, sigma))) for _ in range(a.n)]
    per, extra = divmod(a.n, a.classes)
    rows = []
    k = 0
    for c in range(a.classes):
        name = f"n{c:08d}"
        for i in range(per + (1 if c < extra else 0)):
            rows.append(f"train/{name}/{name}_{i:08d}.JPEG,{sizes[k]},{name}\n")
            k += 1
    if a.shuffled:
        random.Random(a.seed).shuffle(rows)
    with open(a.out, "w", buffering=1 << 22) as f:
        f.write("path,size,label\n")
        f.writelines(rows)


if __name__ == "__main__":
    main()
