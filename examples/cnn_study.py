#!/usr/bin/env python3
"""Adaptive rf on a harder task: a small CNN on 20,000 generated glyph images.

    python3 examples/cnn_study.py [--seeds 0,1,2] [--learned-seeds 10,11,12]
                                  [--only NAME,...] [--metfs BIN] [--out DIR] [--json FILE]

Issue 19, item 2; documented with its results in ``docs/EXPERIMENTS.md``. The digits study of
``rf_experiment.py`` repeated where a CPU run takes minutes. The dataset ("glyphs", generated
here, the same for every seed) has 10 classes of 16x16 grey images: each class is two
prototype glyphs of three random strokes, and every sample one of them drawn with a random
rotation (±20°), scale (0.8-1.15), shift (±10 %), per-endpoint jitter (σ ≈ 1 px), stroke width
and intensity, a clutter stroke (half of the samples) and pixel noise. 20,000 training samples
(2,000 per class, one ``.npy`` file each, 384 B) are the mount's source; 1,000 validation
samples (the ``val_accuracy`` every pass reports to the policies) and 5,000 test samples (the
reported accuracy) stay in memory. The model: conv 3x3 (8) - max-pool - conv 3x3 (16) -
max-pool - linear, SGD with momentum, batch 64, learning rate cosine-decayed to 0 over the
sample budget (16 times the training set, one MET epoch of the fixed configuration), one
torch thread. Configurations, as in ``rf_experiment.py``:

* ``full shuffle``: no metfs, the training set read from the source directory every pass;
* ``fixed rf 16``: ``--mini-epochs 64 --rf-policy fixed --rf 16``;
* ``score``, ``bollinger``: the adaptive policies with ``--rf-max 16``; ``bollinger either``:
  the band rule's other reading (``--bollinger-side either``: also leave when the score rises
  above the band);
* ``learned``: ``--rf-policy learned`` replaying the rf schedule of the best ``score`` or
  ``bollinger`` run (the one with the highest test accuracy): its ``--history`` file is given
  to the new mount, with the same ``--seed`` (the history is keyed by the plan, which the mount
  seed decides) and new training seeds (``--learned-seeds``: initialisation and batch order);
  where the schedule ends, its fallback, ``score`` as above, decides.

Augmentation (``+ online aug``, ``+ offline aug``): a random shift of up to 2 pixels (edge
padding). Online: drawn afresh in the reader at every pass. Offline: drawn once per staged
sample by a real ``--transform`` worker (this script with ``--augment-worker``, one worker,
seeded by the run seed, the sample's path and how often that worker has seen it), so that all
rf passes over a mini-epoch see the same shifted sample, as preprocessing during staging would.

Printed: per configuration, the test accuracy (mean ± std over seeds), mean rf, mini-epochs,
samples and capacity-tier bytes (``rf_experiment.table``), the rf distribution (paper Fig. 11)
and the accuracy each adaptive policy wins back of what the fixed rf loses.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import shutil
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import rf_experiment as rfx
from met_study import (
    label_of,
    met_passes,
    metfs_binary,
    mounted,
    to_result,
    unwind_on_signals,
)

# ---------------------------------------------------------------------------------------------
# The setting
# ---------------------------------------------------------------------------------------------

SIDE = 16
CLASSES = 10
STYLES = 2
TRAIN, VAL, TEST = 20_000, 1_000, 5_000
NM = 64
RF_FIXED = 16
#: Samples per run, in training sets: one MET epoch at the fixed rf.
FULL_EPOCHS = RF_FIXED
#: score: wait = ceil(RF_FIXED / 3), as rf_experiment's 11 for 32; bollinger: the defaults.
ADAPTIVE: dict[str, str] = {
    "score": f"--rf-policy score --score-wait 6 --rf-max {RF_FIXED}",
    "bollinger": f"--rf-policy bollinger --rf-max {RF_FIXED}",
    # The other reading of the band rule: leave on either side (issue 33, item 4).
    "bollinger either": f"--rf-policy bollinger --bollinger-side either --rf-max {RF_FIXED}",
}
LEARNED = f"--rf-policy learned --learned-fallback score --score-wait 6 --rf-max {RF_FIXED}"
FIXED = f"--rf-policy fixed --rf {RF_FIXED}"
CHANNELS = (8, 16)
BATCH = 64
LR = 0.05
MOMENTUM = 0.9
WD = 5e-4
#: How the table shows the offline configuration's transform.
TRANSFORM_NOTE = " --transform 'cnn_study.py --augment-worker SEED' --transform-workers 1"
#: Largest shift of the augmentation, in pixels.
SHIFT = 2


@dataclass
class Config:
    """A configuration: ``flags`` for ``metfs mount`` (None: full shuffle, no metfs)."""

    name: str
    flags: str | None
    augment: str = "none"  # none, online, offline
    nm: int = NM

    @property
    def validates(self) -> bool:
        """Whether the policy needs ``val_accuracy`` (fixed and full shuffle do not)."""
        return self.flags is not None and "fixed" not in self.flags


def configs() -> list[Config]:
    return [
        Config("full shuffle", None),
        Config(f"fixed rf {RF_FIXED}", FIXED),
        *(Config(name, flags) for name, flags in ADAPTIVE.items()),
        Config("learned", LEARNED),
        Config("full shuffle + online aug", None, "online"),
        Config(f"fixed rf {RF_FIXED} + online aug", FIXED, "online"),
        Config(f"fixed rf {RF_FIXED} + offline aug", FIXED, "offline"),
    ]


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def render(labels: np.ndarray, rng: np.random.Generator, side: int = SIDE) -> np.ndarray:
    """Draws one glyph image per label (uint8, ``side`` x ``side``). Stroke widths scale with
    ``side``, so a larger side draws the same glyphs at a finer resolution (pixel noise stays
    per pixel); the default side is the study's own."""
    protos = np.random.default_rng(1234).uniform(0.15, 0.85, size=(CLASSES, STYLES, 3, 2, 2))
    n = len(labels)
    pts = protos[labels, rng.integers(0, STYLES, size=n)]  # n, stroke, endpoint, (row, col)
    pts = pts + rng.normal(0.0, 0.06, size=pts.shape)
    theta = rng.uniform(-0.35, 0.35, size=n)
    scale = rng.uniform(0.8, 1.15, size=n)
    shift = rng.uniform(-0.1, 0.1, size=(n, 2))
    c, s = np.cos(theta), np.sin(theta)
    rot = np.stack([np.stack([c, -s], -1), np.stack([s, c], -1)], -2) * scale[:, None, None]
    pts = np.einsum("nij,nsej->nsei", rot, pts - 0.5) + 0.5 + shift[:, None, None, :]
    clutter = rng.uniform(0.05, 0.95, size=(n, 1, 2, 2))
    clutter[:, :, 1] = clutter[:, :, 0] + rng.normal(0.0, 0.15, size=(n, 1, 2))
    has_clutter = rng.random(n) < 0.5
    strokes = np.concatenate([pts, clutter], 1)
    intensity = np.concatenate(
        [
            np.repeat(rng.uniform(0.6, 1.0, size=(n, 1)), 3, 1),
            rng.uniform(0.3, 0.7, size=(n, 1)) * has_clutter[:, None],
        ],
        1,
    )
    width = rng.uniform(0.8, 1.6, size=(n, 1)) * (side / SIDE)
    g = (np.arange(side) + 0.5) / side
    pix = np.stack(np.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2)
    a, b = strokes[:, :, 0][:, :, None, :], strokes[:, :, 1][:, :, None, :]
    ab, ap = b - a, pix[None, None] - a
    t = np.clip((ap * ab).sum(-1) / np.maximum((ab * ab).sum(-1), 1e-9), 0.0, 1.0)
    dist = np.linalg.norm(ap - t[..., None] * ab, axis=-1) * side
    ink = np.clip(width[:, :, None] / 2 + 0.5 - dist, 0.0, 1.0) * intensity[:, :, None]
    img = ink.max(1).reshape(n, side, side) + rng.normal(0.0, 0.15, size=(n, side, side))
    return (np.clip(img, 0.0, 1.0) * 255).round().astype(np.uint8)


def glyphs(n: int, seed: int, side: int = SIDE) -> tuple[np.ndarray, np.ndarray]:
    """``n`` samples, ``n / CLASSES`` per class in a random order; deterministic per seed."""
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(n) % CLASSES)
    x = np.concatenate([render(labels[i : i + 2000], rng, side) for i in range(0, n, 2000)])
    return x, labels


def build_dataset(train_dir: str) -> None:
    """Writes the training set as ``train_dir/<class>/<class>_<i>.npy``."""
    x, y = glyphs(TRAIN, seed=0)
    for c in range(CLASSES):
        os.makedirs(os.path.join(train_dir, str(c)), exist_ok=True)
    for i, (img, c) in enumerate(zip(x, y, strict=True)):
        np.save(os.path.join(train_dir, str(c), f"{c}_{i:05d}.npy"), img)


def augment(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A random shift of up to SHIFT pixels per image (edge padding); ``x`` is (n, H, W)."""
    n, h, w = x.shape
    p = np.pad(x, ((0, 0), (SHIFT, SHIFT), (SHIFT, SHIFT)), mode="edge")
    oy = rng.integers(0, 2 * SHIFT + 1, size=n)
    ox = rng.integers(0, 2 * SHIFT + 1, size=n)
    rows = oy[:, None] + np.arange(h)
    cols = ox[:, None] + np.arange(w)
    return p[np.arange(n)[:, None, None], rows[:, :, None], cols[:, None, :]]


def read_glyphs(paths: list[str]) -> tuple[np.ndarray, np.ndarray, int]:
    """Reads sample files (class = parent directory); images, labels and bytes read."""
    x = np.empty((len(paths), SIDE, SIDE), np.uint8)
    y = np.empty(len(paths), np.int64)
    nbytes = 0
    for i, p in enumerate(paths):
        with open(p, "rb") as f:
            raw = f.read()
        nbytes += len(raw)
        x[i] = np.load(io.BytesIO(raw))
        y[i] = label_of(p)
    return x, y, nbytes


def augment_worker(seed: int) -> int:
    """The ``--transform`` worker of the offline configuration."""
    from metfs.transform import serve

    seen: dict[str, int] = {}

    def shift(data: bytes, path: str) -> bytes:
        k = seen.get(path, 0)
        seen[path] = k + 1
        rng = np.random.default_rng([seed, zlib.crc32(path.encode()), k])
        out = augment(np.load(io.BytesIO(data))[None], rng)[0]
        buf = io.BytesIO()
        np.save(buf, out)
        return buf.getvalue()

    serve(shift)
    return 0


# ---------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------


class Trainer:
    """The CNN, its optimiser and the sample-count learning-rate schedule."""

    def __init__(
        self,
        seed: int,
        budget: int,
        val: tuple[np.ndarray, np.ndarray],
        test: tuple[np.ndarray, np.ndarray],
        augment: str,
        validates: bool,
    ) -> None:
        import torch

        self.torch = torch
        torch.manual_seed(seed)
        c1, c2 = CHANNELS
        nn = torch.nn
        self.net = nn.Sequential(
            nn.Conv2d(1, c1, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(c2 * (SIDE // 4) ** 2, CLASSES),
        )
        self.opt = torch.optim.SGD(self.net.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WD)
        self.rng = np.random.default_rng(seed)
        self.budget = budget
        self.seen = 0
        self.augment = augment
        self.validates = validates
        self.val = (self.tensor(val[0]), val[1])
        self.test = (self.tensor(test[0]), test[1])

    def tensor(self, x: np.ndarray) -> Any:
        return self.torch.from_numpy(x[:, None].astype(np.float32) / 255.0)

    def lr(self) -> float:
        frac = min(1.0, self.seen / self.budget)
        return LR * 0.5 * (1.0 + math.cos(math.pi * frac))

    def train_pass(self, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
        """One pass over the samples in a random order; running loss and accuracy, and
        ``val_accuracy`` when a policy needs it."""
        torch = self.torch
        order = self.rng.permutation(len(y))
        self.net.train()
        loss_sum, correct = 0.0, 0
        for b in range(0, len(order), BATCH):
            ib = order[b : b + BATCH]
            xb = augment(x[ib], self.rng) if self.augment == "online" else x[ib]
            yb = torch.from_numpy(y[ib])
            for g in self.opt.param_groups:
                g["lr"] = self.lr()
            out = self.net(self.tensor(xb))
            loss = torch.nn.functional.cross_entropy(out, yb)
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            loss_sum += float(loss.detach()) * len(ib)
            correct += int((out.argmax(1) == yb).sum())
            self.seen += len(ib)
        metrics = {"loss": loss_sum / len(order), "accuracy": correct / len(order)}
        if self.validates:
            metrics["val_accuracy"] = self.accuracy(self.val)
        return metrics

    def accuracy(self, data: tuple[Any, np.ndarray]) -> float:
        torch = self.torch
        self.net.eval()
        with torch.no_grad():
            pred = self.net(data[0]).argmax(1).numpy()
        return float((pred == data[1]).mean())


# ---------------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------------


def run_full_shuffle(
    cfg: Config,
    train_dir: str,
    seed: int,
    data: dict[str, tuple[np.ndarray, np.ndarray]],
) -> rfx.Result:
    t0 = time.monotonic()
    files = rfx.list_files(train_dir)
    budget = FULL_EPOCHS * len(files)
    trainer = Trainer(seed, budget, data["val"], data["test"], cfg.augment, False)
    rng = np.random.default_rng(seed + 1000)
    tier, passes, read_s = 0, 0, 0.0
    while trainer.seen < budget:
        t = time.monotonic()
        x, y, nbytes = read_glyphs([files[i] for i in rng.permutation(len(files))])
        tier += nbytes
        trainer.train_pass(x, y)
        read_s += time.monotonic() - t
        passes += 1
    return rfx.Result(
        config=cfg.name,
        seed=seed,
        val_accuracy=trainer.accuracy(trainer.test),
        samples=trainer.seen,
        passes=passes,
        rfs=[1] * passes,
        tier_bytes=tier,
        seconds=time.monotonic() - t0,
        read_seconds=read_s,
    )


def run_met(
    cfg: Config,
    binary: str,
    train_dir: str,
    work: str,
    seed: int,
    data: dict[str, tuple[np.ndarray, np.ndarray]],
    mount_seed: int | None = None,
    history: str | None = None,
) -> tuple[rfx.Result, int]:
    """One MET run; returns its result and how many passes the recorded schedule decided."""
    t0 = time.monotonic()
    budget = FULL_EPOCHS * TRAIN
    trainer = Trainer(seed, budget, data["val"], data["test"], cfg.augment, cfg.validates)
    flags = ["--budget", "16MiB", "--mini-epochs", str(cfg.nm)]
    flags += ["--seed", str(seed if mount_seed is None else mount_seed)]
    flags += (cfg.flags or "").split()
    if cfg.augment == "offline":
        worker = f"{sys.executable} {os.path.abspath(__file__)} --augment-worker {seed}"
        flags += ["--transform", worker, "--transform-workers", "1"]

    def train_pass(paths: list[str]) -> tuple[dict[str, float], int]:
        x, y, nbytes = read_glyphs(paths)
        return trainer.train_pass(x, y), nbytes

    with mounted(binary, train_dir, work, f"{cfg.name}-s{seed}", flags, history=history) as m:
        run = met_passes(m, "cnn_study", train_pass, lambda: trainer.seen, budget)
    result = to_result(cfg.name, seed, trainer.accuracy(trainer.test), trainer.seen, run)
    result.seconds = time.monotonic() - t0
    result.read_seconds = run.read_seconds
    return result, run.replayed


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def verdict(results: list[rfx.Result]) -> list[str]:
    def mean(name: str) -> float:
        return float(np.mean([r.val_accuracy for r in results if r.config == name]))

    names = {r.config for r in results}
    base, fixed = "full shuffle", f"fixed rf {RF_FIXED}"
    out: list[str] = []
    lost = float("nan")
    if base in names and fixed in names:
        lost = mean(base) - mean(fixed)
        out.append(
            f"test accuracy lost by {fixed}: {100 * lost:.2f} points "
            f"({100 * mean(base):.2f} -> {100 * mean(fixed):.2f} %)"
        )
    for name in [*ADAPTIVE, "learned"]:
        rs = [r for r in results if r.config == name]
        if rs and lost > 0:
            avg = float(np.mean([n for r in rs for n in r.rfs]))
            won = (mean(name) - mean(fixed)) / lost
            ok = won >= 0.5 and avg >= RF_FIXED / 3
            out.append(
                f"{name}: wins back {100 * won:.0f} % of it with average rf {avg:.1f} "
                f"(>= {RF_FIXED / 3:.1f} needed): goal {'met' if ok else 'NOT met'}"
            )
    aug = {n: mean(n) for n in names if "aug" in n}
    on, off = f"fixed rf {RF_FIXED} + online aug", f"fixed rf {RF_FIXED} + offline aug"
    if on in aug and off in aug:
        out.append(
            f"offline augmentation against online at fixed rf {RF_FIXED}: "
            f"{100 * (aug[off] - aug[on]):+.2f} points"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1,2", help="training and mount seeds (default 0,1,2)")
    ap.add_argument(
        "--learned-seeds", default="10,11,12", help="training seeds of the learned runs"
    )
    ap.add_argument("--only", default=None, help="configurations to run, comma-separated")
    ap.add_argument("--metfs", default=None, help="binary (default $METFS_BIN, else release)")
    ap.add_argument("--out", default=None, help="work directory (default a temporary one)")
    ap.add_argument("--json", default=None, help="write every run's result to this file")
    ap.add_argument("--augment-worker", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.augment_worker is not None:
        return augment_worker(args.augment_worker)
    unwind_on_signals()
    binary = metfs_binary(args.metfs)
    if not os.access(binary, os.X_OK):
        print(f"error: no metfs binary at {binary}", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(1)
    seeds = [int(s) for s in args.seeds.split(",")]
    learned_seeds = [int(s) for s in args.learned_seeds.split(",")]
    cfgs = configs()
    if args.only:
        wanted = {s.strip() for s in args.only.split(",")}
        cfgs = [c for c in cfgs if c.name in wanted]
    work = args.out or tempfile.mkdtemp(prefix="cnn_study-")
    os.makedirs(work, exist_ok=True)
    histories = os.path.join(work, "histories")
    os.makedirs(histories, exist_ok=True)
    train_dir = os.path.join(work, "data", "train")
    t_start = time.monotonic()
    if len(rfx.list_files(train_dir)) != TRAIN:
        shutil.rmtree(train_dir, ignore_errors=True)
        build_dataset(train_dir)
    data = {"val": glyphs(VAL, seed=1), "test": glyphs(TEST, seed=2)}
    dataset_bytes = sum(os.path.getsize(f) for f in rfx.list_files(train_dir))
    print(
        f"glyphs: {TRAIN} training files ({rfx.human(dataset_bytes)}), {VAL} validation and "
        f"{TEST} test samples in memory, made in {time.monotonic() - t_start:.0f} s; CNN "
        f"conv{CHANNELS[0]}-conv{CHANNELS[1]}-linear, batch {BATCH}, SGD lr {LR} cosine, "
        f"budget {FULL_EPOCHS} x the training set; nm {NM}; seeds {seeds}; work dir {work}",
        flush=True,
    )

    results: list[rfx.Result] = []
    replayed: dict[tuple[str, int], int] = {}
    best: tuple[float, str, int, str] | None = None  # accuracy, config, seed, history file
    for cfg in cfgs:
        run_seeds = learned_seeds if cfg.name == "learned" else seeds
        for seed in run_seeds:
            if cfg.flags is None:
                r = run_full_shuffle(cfg, train_dir, seed, data)
            elif cfg.name == "learned":
                if best is None:
                    print("learned: no score or bollinger run to replay", file=sys.stderr)
                    break
                hist = os.path.join(histories, f"learned-s{seed}.json")
                shutil.copyfile(best[3], hist)
                r, replayed[(cfg.name, seed)] = run_met(
                    cfg,
                    binary,
                    train_dir,
                    work,
                    seed,
                    data,
                    mount_seed=best[2],
                    history=hist,
                )
            else:
                hist = os.path.join(histories, f"{cfg.name.replace(' ', '_')}-s{seed}.json")
                r, _ = run_met(cfg, binary, train_dir, work, seed, data, history=hist)
                if cfg.name in ADAPTIVE and (best is None or r.val_accuracy > best[0]):
                    best = (r.val_accuracy, cfg.name, seed, hist)
            results.append(r)
            extra = ""
            if (cfg.name, seed) in replayed:
                extra = (
                    f", {replayed[(cfg.name, seed)]} passes decided by the schedule of "
                    f"{best[1] if best else '?'} seed {best[2] if best else '?'}"
                )
            print(
                f"  {cfg.name:<26} seed {seed}: test accuracy {100 * r.val_accuracy:.2f} %, "
                f"avg rf {np.mean(r.rfs):.1f} over {len(r.rfs)} mini-epochs, "
                f"tier {rfx.human(r.tier_bytes)}, decisions {r.decisions or '-'}{extra}, "
                f"{r.seconds:.0f} s ({r.read_seconds:.0f} s reading and training)",
                flush=True,
            )
    elapsed = time.monotonic() - t_start
    print(f"\n{len(results)} runs in {elapsed:.0f} s\n")
    table_cfgs = [
        rfx.Config(
            c.name,
            c.flags and c.flags + TRANSFORM_NOTE * (c.augment == "offline"),
            c.nm,
        )
        for c in cfgs
    ]
    print(rfx.table(table_cfgs, results, dataset_bytes).replace("val accuracy", "test accuracy", 1))
    print("\nrf per mini-epoch, all seeds (completed mini-epochs):\n\n```")
    for cfg in cfgs:
        if cfg.flags is not None:
            rs = [r for r in results if r.config == cfg.name]
            rfs = [n for r in rs for n in r.rfs]
            print(rfx.histogram(cfg.name, rfs, bin_width=2, top=RF_FIXED))
            print(
                rfx.by_quarter(
                    [(f, n) for r in rs for f, n in zip(r.rf_starts, r.rfs, strict=False)]
                )
            )
    print("```\n")
    print("\n".join(verdict(results)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "seconds": elapsed,
                    "dataset_bytes": dataset_bytes,
                    "learned_from": best[1:3] if best else None,
                    "configs": [c.__dict__ for c in cfgs],
                    "results": [r.__dict__ for r in results],
                },
                f,
                indent=1,
            )
    if not args.out:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
