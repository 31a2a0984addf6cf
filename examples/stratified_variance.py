#!/usr/bin/env python3
"""Does stratified composition cut the seed-to-seed variance a large fixed rf brings?

    python3 examples/stratified_variance.py [--seeds 100-115] [--settings NAME,...]
                                            [--metfs BIN] [--out DIR] [--json FILE]

Issue 19, item 1 (paper 000: stratified sharding cuts the seed-to-seed variance of validation
accuracy by up to 6x); documented with its results in ``docs/EXPERIMENTS.md``. The small MLP of
``rf_experiment.py`` is trained on a class-imbalanced cut of scikit-learn's digits (class ``c``
keeps ``round(130 * r**c)`` training samples, one ``.npy`` file each; a balanced held-out set of
40 per class, read locally) over real metfs mounts with a large fixed rf, once per seed and
composition:

* ``random``: ``--compose random`` (the default);
* ``stratified``: ``--compose stratified --label-from-dirs``: every mini-epoch holds
  ``floor(n_c/nm)`` or ``ceil(n_c/nm)`` samples of class ``c``;
* ``clustered``: ``--compose clustered`` with a manifest that has no labels, only cluster ids
  from k-means (k = 10) on the pixels: stratification where labels are absent;
* ``full shuffle``: no metfs, the whole training set in a fresh order every pass (the floor of
  the variance that the initialisation and the batch order alone give).

A seed sets the model's initialisation, the batch order and the mount's ``--seed`` (the
composition). Every run trains on the same number of samples, one MET epoch: ``rf`` times the
training set. Settings (``--settings``) vary the imbalance (``mild``: r = 0.8, 130 down to 17
samples; ``strong``: r = 0.7, 130 down to 5) and the learning rate (``cosine``: the schedule of
``rf_experiment.py``, decayed to 0 over the budget; ``constant``: its mean, LR / 2, throughout).

Printed: per setting, each composition's final validation accuracy (mean, std, variance over
the seeds) and recall of the three rarest classes, and the variance ratios
var(random)/var(stratified) and var(random)/var(clustered) with 95 % percentile-bootstrap
intervals (10,000 resamples of the seeds); then, for the first seed, the class histogram of
every mini-epoch of each composition, as listed by the mount (the files each view showed).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import rf_experiment as rfx
from met_study import (
    bootstrap_ratio_ci,
    met_passes,
    metfs_binary,
    mounted,
    unwind_on_signals,
)

#: Mini-epochs per epoch and the large fixed rf (one MET epoch is the whole budget).
NM = 16
RF = 32
#: Training samples of class c: round(TRAIN_MAX * r**c); validation: VAL_PER_CLASS each.
TRAIN_MAX = 130
VAL_PER_CLASS = 40
#: Settings: imbalance ratio r and learning-rate schedule.
SETTINGS: dict[str, tuple[float, str]] = {
    "mild-cosine": (0.8, "cosine"),
    "mild-constant": (0.8, "constant"),
    "strong-cosine": (0.7, "cosine"),
    "strong-constant": (0.7, "constant"),
}
COMPOSITIONS = ("random", "stratified", "clustered", "full shuffle")
#: Rarest classes whose mean recall is reported.
RARE = 3
#: k-means clusters for the `clustered` composition.
CLUSTERS = 10


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def build_dataset(root: str, ratio: float) -> dict[str, object]:
    """Writes ``root/train/<class>/<class>_<i>.npy`` (imbalanced), ``root/val`` (balanced)
    and ``root/clusters.csv`` (a manifest of the training files with k-means cluster ids and
    no labels). Deterministic: the digits split and k-means use fixed seeds."""
    from sklearn.cluster import KMeans
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(0)
    counts = []
    for cls in range(10):
        images = digits.images[digits.target == cls].astype(np.float32)
        order = rng.permutation(len(images))
        n_train = round(TRAIN_MAX * ratio**cls)
        counts.append(n_train)
        for part, idx in (
            ("val", order[:VAL_PER_CLASS]),
            ("train", order[VAL_PER_CLASS : VAL_PER_CLASS + n_train]),
        ):
            d = os.path.join(root, part, str(cls))
            os.makedirs(d, exist_ok=True)
            for i, k in enumerate(idx):
                np.save(os.path.join(d, f"{cls}_{i:04d}.npy"), images[k])
    train = os.path.join(root, "train")
    files = rfx.list_files(train)
    x, _, _ = rfx.read_samples(files)
    km = KMeans(n_clusters=CLUSTERS, n_init=10, random_state=0).fit(x)
    with open(os.path.join(root, "clusters.csv"), "w") as f:
        f.write("path,size,cluster\n")
        f.writelines(
            f"{os.path.relpath(p, train)},{os.path.getsize(p)},k{c}\n"
            for p, c in zip(files, km.labels_, strict=True)
        )
    sizes = np.bincount(km.labels_, minlength=CLUSTERS)
    return {"ratio": ratio, "train_per_class": counts, "cluster_sizes": sizes.tolist()}


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------


class Trainer(rfx.Trainer):
    """``rf_experiment``'s MLP and optimiser, with a constant learning rate on request."""

    def __init__(
        self,
        seed: int,
        budget: int,
        x_val: np.ndarray,
        y_val: np.ndarray,
        schedule: str,
    ) -> None:
        super().__init__(seed, budget, x_val, y_val)
        self.schedule = schedule

    def lr(self) -> float:
        return rfx.LR / 2 if self.schedule == "constant" else super().lr()

    def recalls(self) -> np.ndarray:
        """Per-class recall on the validation set."""
        torch = self.torch
        self.net.eval()
        with torch.no_grad():
            pred = self.net(self.x_val).argmax(1).numpy()
        return np.array([(pred[self.y_val == c] == c).mean() for c in range(10)])


@dataclass
class Run:
    setting: str
    composition: str
    seed: int
    val_accuracy: float
    rare_recall: float
    samples: int
    mini_epochs: int
    tier_bytes: int
    seconds: float
    classes: list[dict[int, int]] = field(default_factory=list)


def train_files(trainer: Trainer, paths: list[str]) -> tuple[dict[str, float], int]:
    x, y, nbytes = rfx.read_samples(paths)
    return trainer.train_pass(x, y), nbytes


def run_one(
    binary: str,
    data: str,
    work: str,
    setting: str,
    composition: str,
    seed: int,
    val: tuple[np.ndarray, np.ndarray],
) -> Run:
    t0 = time.monotonic()
    train = os.path.join(data, "train")
    files = rfx.list_files(train)
    budget = RF * len(files)
    trainer = Trainer(seed, budget, val[0], val[1], SETTINGS[setting][1])
    classes: list[dict[int, int]] = []
    mini_epochs, tier = 0, 0
    if composition == "full shuffle":
        rng = np.random.default_rng(seed + 1000)
        while trainer.seen < budget:
            _, nbytes = train_files(trainer, [files[i] for i in rng.permutation(len(files))])
            tier += nbytes
    else:
        flags = ["--budget", "16MiB", "--mini-epochs", str(NM), "--seed", str(seed)]
        flags += ["--rf-policy", "fixed", "--rf", str(RF), "--compose", composition]
        if composition == "stratified":
            flags.append("--label-from-dirs")
        elif composition == "clustered":
            flags += ["--manifest", os.path.join(data, "clusters.csv")]
        with mounted(binary, train, work, f"{composition}-s{seed}", flags) as m:
            run = met_passes(
                m,
                "stratified_variance",
                lambda paths: train_files(trainer, paths),
                lambda: trainer.seen,
                budget,
            )
        classes, tier = run.classes, run.tier_bytes
        mini_epochs = len(run.rfs) + (1 if run.last_partial else 0)
    rec = trainer.recalls()
    rarest = np.argsort([len(os.listdir(os.path.join(train, str(c)))) for c in range(10)])
    return Run(
        setting=setting,
        composition=composition,
        seed=seed,
        val_accuracy=trainer.val_accuracy(),
        rare_recall=float(rec[rarest[:RARE]].mean()),
        samples=trainer.seen,
        mini_epochs=mini_epochs,
        tier_bytes=tier,
        seconds=time.monotonic() - t0,
        classes=classes,
    )


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def report_setting(setting: str, runs: list[Run]) -> list[str]:
    acc = {c: [r.val_accuracy for r in runs if r.composition == c] for c in COMPOSITIONS}
    rare = {c: [r.rare_recall for r in runs if r.composition == c] for c in COMPOSITIONS}
    lines = [
        f"### {setting} (r = {SETTINGS[setting][0]}, {SETTINGS[setting][1]} learning rate)",
        "",
        (
            "| composition | seeds | val accuracy (mean ± std) | variance | "
            f"recall of the {RARE} rarest classes |"
        ),
        "|---|---|---|---|---|",
    ]
    for c in COMPOSITIONS:
        a = np.array(acc[c])
        if len(a) < 2:
            continue
        lines.append(
            f"| {c} | {len(a)} | {100 * a.mean():.2f} ± {100 * a.std(ddof=1):.2f} % "
            f"| {a.var(ddof=1) * 1e4:.2f} (%²) | {100 * np.mean(rare[c]):.1f} % |"
        )
    lines.append("")
    for num, den in (("random", "stratified"), ("random", "clustered")):
        if len(acc[num]) >= 2 and len(acc[den]) >= 2:
            ratio, lo, hi = bootstrap_ratio_ci(acc[num], acc[den])
            goal = "met" if ratio >= 2 else "NOT met"
            lines.append(
                f"var({num}) / var({den}) = {ratio:.2f}, 95 % bootstrap CI "
                f"[{lo:.2f}, {hi:.2f}]" + (f"; goal >= 2x {goal}" if den == "stratified" else "")
            )
    return lines


def histograms(run: Run) -> list[str]:
    lines = [f"{run.composition}, seed {run.seed} (setting {run.setting}):"]
    lines.append("mini-epoch " + " ".join(f"{c:>4}" for c in range(10)) + "  total")
    for i, h in enumerate(run.classes):
        row = " ".join(f"{h.get(c, 0):>4}" for c in range(10))
        lines.append(f"{i:>10} {row}  {sum(h.values()):>5}")
    return lines


def parse_seeds(spec: str) -> list[int]:
    """``100-115`` or ``1,2,3`` (or both, comma-separated)."""
    seeds: list[int] = []
    for part in spec.split(","):
        lo, sep, hi = part.strip().partition("-")
        seeds += list(range(int(lo), int(hi) + 1)) if sep else [int(lo)]
    return seeds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--seeds", default="100-115", help="seeds, e.g. 100-115 or 1,2,3")
    ap.add_argument(
        "--settings",
        default=",".join(SETTINGS),
        help="settings to run, comma-separated",
    )
    ap.add_argument(
        "--compositions",
        default=",".join(COMPOSITIONS),
        help="compositions, comma-separated",
    )
    ap.add_argument("--metfs", default=None, help="binary (default $METFS_BIN, else release)")
    ap.add_argument("--out", default=None, help="work directory (default a temporary one)")
    ap.add_argument("--json", default=None, help="write every run's result to this file")
    args = ap.parse_args(argv)
    unwind_on_signals()
    binary = metfs_binary(args.metfs)
    if not os.access(binary, os.X_OK):
        print(f"error: no metfs binary at {binary}", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(1)
    seeds = parse_seeds(args.seeds)
    settings = [s.strip() for s in args.settings.split(",")]
    comps = [c.strip() for c in args.compositions.split(",")]
    for s in settings:
        if s not in SETTINGS:
            print(
                f"error: unknown setting {s!r}; known: {', '.join(SETTINGS)}",
                file=sys.stderr,
            )
            return 2
    work = args.out or tempfile.mkdtemp(prefix="stratified_variance-")
    os.makedirs(work, exist_ok=True)
    print(
        f"digits MLP 64-{rfx.HIDDEN}-10, batch {rfx.BATCH}, nm {NM}, fixed rf {RF}, "
        f"budget rf x training set; seeds {seeds}; work dir {work}",
        flush=True,
    )
    t_start = time.monotonic()
    runs: list[Run] = []
    data_info: dict[float, dict[str, object]] = {}
    for setting in settings:
        ratio = SETTINGS[setting][0]
        data = os.path.join(work, f"data-r{ratio}")
        if ratio not in data_info:
            shutil.rmtree(data, ignore_errors=True)
            data_info[ratio] = build_dataset(data, ratio)
            print(f"dataset r = {ratio}: {data_info[ratio]}", flush=True)
        xv, yv, _ = rfx.read_samples(rfx.list_files(os.path.join(data, "val")))
        for comp in comps:
            for seed in seeds:
                r = run_one(binary, data, work, setting, comp, seed, (xv, yv))
                runs.append(r)
                print(
                    f"  {setting:<17} {comp:<12} seed {seed}: val_accuracy "
                    f"{100 * r.val_accuracy:.2f} %, rare recall {100 * r.rare_recall:.1f} %, "
                    f"{r.samples} samples, {r.mini_epochs} mini-epochs, {r.seconds:.1f} s",
                    flush=True,
                )
    elapsed = time.monotonic() - t_start
    print(f"\n{len(runs)} runs in {elapsed:.0f} s\n")
    for setting in settings:
        print("\n".join(report_setting(setting, [r for r in runs if r.setting == setting])))
        print()
    print("Class histogram of every mini-epoch, first seed (files listed by the mount):\n")
    print("```")
    shown: set[tuple[float, str]] = set()
    for r in runs:
        key = (SETTINGS[r.setting][0], r.composition)
        if r.classes and r.seed == seeds[0] and key not in shown:
            shown.add(key)
            print("\n".join(histograms(r)))
            print()
    print("```")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "seconds": elapsed,
                    "datasets": {str(k): v for k, v in data_info.items()},
                    "runs": [r.__dict__ for r in runs],
                },
                f,
                indent=1,
            )
    if not args.out:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
