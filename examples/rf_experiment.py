#!/usr/bin/env python3
"""Does an adaptive repeating factor win back the accuracy a large fixed rf costs?

    python examples/rf_experiment.py [--seeds 0,1,2] [--sweep] [--out DIR] [--json FILE]

Issue 4, item 5; documented with its results in ``docs/EXPERIMENTS.md``. A small torch MLP is
trained on CPU on scikit-learn's digits, one sample per file, under these configurations:

* ``full shuffle``: no metfs; every pass reads the whole training set from the source
  directory (the capacity tier) in a fresh random order (rf = 1 per full epoch);
* ``fixed rf``: metfs, ``--rf-policy fixed`` with a large rf;
* ``score`` and ``bollinger``: metfs with the adaptive policies of paper 001, section III.C.

Every configuration trains on the same number of samples (``--full-epochs`` times the training
set) with the same learning-rate schedule, which is a function of the samples seen so far; a
MET run stops after the pass that reaches the sample budget, wherever it is in its mini-epoch.
``--sweep`` runs instead the sweep that chose the setting: full shuffle, fixed rf 1, 4, 8, 11,
16 and 32 at the same nm, and fixed rf 32 at nm 8 and 16, all at the same budget.

Every MET run mounts the dataset with a real ``metfs`` daemon (its own cache directory, control
socket and ``--history`` file under ``--out``, ``--seed`` = the run's seed), reads every file of
the view through the mount on every pass, and reports ``loss`` and ``accuracy`` (running means
over the pass, as Keras logs them) and ``val_accuracy`` (on a held-out set read from a local
directory, never through the mount) with ``pass_end``. The daemon is unmounted after each run,
also on errors.

Printed: a markdown table (final validation accuracy, mean ± std over seeds; the rf; the
capacity-tier bytes, i.e. the daemon's ``tier_bytes_read`` at the end of the run, staging of the
next mini-epoch included), then the rf distribution of every MET configuration as a text
histogram over all the mini-epochs of all seeds (paper Fig. 11).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, ".."))
try:
    import metfs
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, os.path.join(ROOT, "bindings", "python", "src"))
    import metfs

# ---------------------------------------------------------------------------------------------
# The setting (see docs/EXPERIMENTS.md for how it was chosen)
# ---------------------------------------------------------------------------------------------

#: Mini-epochs per epoch: about 41 training files, 4 per class, per mini-epoch.
NM = 32
#: The large fixed rf whose accuracy cost the adaptive policies should win back.
RF_FIXED = 32
#: Samples trained on by every configuration, in full training sets: exactly one MET epoch of
#: the fixed configuration (NM mini-epochs x RF_FIXED passes).
FULL_EPOCHS = 32

#: The adaptive configurations, as extra ``metfs mount`` flags.
#: Both may repeat a mini-epoch at most as often as the fixed configuration (rf_max = RF_FIXED).
#: score: the paper's terms and weights (loss + (1 - accuracy) + (1 - val_accuracy)), the best
#: score kept for the run; wait = ceil(RF_FIXED / 3) = 11, because once training plateaus a
#: mini-epoch rarely sets a new best and is left after exactly `wait` passes, so `wait` is the
#: floor of the average rf. bollinger: the defaults (N = 5, K = 2, window over the run).
ADAPTIVE: Dict[str, str] = {
    "score": f"--rf-policy score --score-wait 11 --rf-max {RF_FIXED}",
    "bollinger": f"--rf-policy bollinger --rf-max {RF_FIXED}",
}

#: The sweep that chose the setting (``--sweep``): fixed rf at NM, and RF_FIXED at smaller nm.
SWEEP_RF = (1, 4, 8, 11, 16)
SWEEP_NM = (8, 16)

#: The model and its optimizer: 64 -> HIDDEN -> 10 ReLU MLP, SGD with momentum, batch BATCH,
#: learning rate LR decayed to 0 by a cosine over the sample budget, weight decay WD.
HIDDEN = 64
BATCH = 16
LR = 0.05
MOMENTUM = 0.9
WD = 1e-4

#: Held-out validation samples per class (load_digits has 174-183 per class; at most a quarter
#: of a class is held out), and training samples per class (the rest, without noisy copies).
VAL_PER_CLASS = 44
TRAIN_PER_CLASS = 130


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def build_dataset(root: str) -> Tuple[str, str, Dict[str, int]]:
    """Writes digits as one ``.npy`` file per sample (``scripts/make_dataset.py``).

    ``root/train/<class>/<class>_<i>.npy`` is the source of the mount, ``root/val`` the held-out
    set. The dataset is the same for every seed (its own seed is 0).
    """
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from make_dataset import make_dataset  # noqa: E402

    train, val = os.path.join(root, "train"), os.path.join(root, "val")
    stats = make_dataset(
        train,
        classes=10,
        per_class=TRAIN_PER_CLASS,
        seed=0,
        val_out=val,
        val_per_class=VAL_PER_CLASS,
    )
    return train, val, stats


def decode(raw: bytes) -> np.ndarray:
    """One sample file's bytes as 64 features in [0, 1] (any of the dataset's resolutions)."""
    img = np.load(io.BytesIO(raw))
    k = img.shape[0] // 8
    return img.reshape(8, k, 8, k).mean(axis=(1, 3)).reshape(64).astype(np.float32) / 16.0


def read_samples(paths: Sequence[str]) -> Tuple[np.ndarray, np.ndarray, int]:
    """Reads files (class = parent directory name); returns features, labels and bytes read."""
    xs, ys, nbytes = [], [], 0
    for p in paths:
        with open(p, "rb") as f:
            raw = f.read()
        nbytes += len(raw)
        xs.append(decode(raw))
        ys.append(int(os.path.basename(os.path.dirname(p))))
    return np.stack(xs), np.array(ys, dtype=np.int64), nbytes


def list_files(root: str) -> List[str]:
    """Every ``.npy`` file under ``root``, sorted."""
    return sorted(
        os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".npy")
    )


# ---------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------


class Trainer:
    """The MLP, its optimizer and the sample-count learning-rate schedule."""

    def __init__(self, seed: int, budget: int, x_val: np.ndarray, y_val: np.ndarray) -> None:
        import torch

        self.torch = torch
        torch.manual_seed(seed)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(64, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 10)
        )
        self.opt = torch.optim.SGD(self.net.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WD)
        self.rng = np.random.default_rng(seed)
        self.budget = budget
        self.seen = 0
        self.x_val = torch.from_numpy(x_val)
        self.y_val = y_val

    def lr(self) -> float:
        """Cosine decay from LR to 0 over the sample budget."""
        frac = min(1.0, self.seen / self.budget)
        return LR * 0.5 * (1.0 + math.cos(math.pi * frac))

    def train_pass(self, x: np.ndarray, y: np.ndarray) -> Dict[str, float]:
        """One pass over ``x`` in a random order; ``loss`` and ``accuracy`` as running means."""
        torch = self.torch
        order = self.rng.permutation(len(y))
        xt, yt = torch.from_numpy(x[order]), torch.from_numpy(y[order])
        self.net.train()
        loss_sum, correct = 0.0, 0
        for b in range(0, len(order), BATCH):
            xb, yb = xt[b : b + BATCH], yt[b : b + BATCH]
            for g in self.opt.param_groups:
                g["lr"] = self.lr()
            out = self.net(xb)
            loss = torch.nn.functional.cross_entropy(out, yb)
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            loss_sum += float(loss.detach()) * len(yb)
            correct += int((out.argmax(1) == yb).sum())
            self.seen += len(yb)
        return {
            "loss": loss_sum / len(order),
            "accuracy": correct / len(order),
            "val_accuracy": self.val_accuracy(),
        }

    def val_accuracy(self) -> float:
        torch = self.torch
        self.net.eval()
        with torch.no_grad():
            pred = self.net(self.x_val).argmax(1).numpy()
        return float((pred == self.y_val).mean())


# ---------------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------------


@dataclass
class Config:
    """One configuration: ``flags`` are extra ``metfs mount`` flags (None: no metfs)."""

    name: str
    flags: Optional[str]
    nm: int = NM


@dataclass
class Result:
    config: str
    seed: int
    val_accuracy: float
    samples: int
    passes: int
    rfs: List[int] = field(default_factory=list)  # passes of each completed mini-epoch
    rf_starts: List[float] = field(default_factory=list)  # where each began, budget fraction
    last_partial: int = 0  # passes over the mini-epoch the budget ended in (0: none)
    tier_bytes: int = 0
    mount_bytes: int = 0
    decisions: Dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    read_seconds: float = 0.0  # of which reading sample files


def run_full_shuffle(
    train_dir: str, budget: int, seed: int, x_val: np.ndarray, y_val: np.ndarray
) -> Result:
    """No MET: every pass reads the whole training set from the source directory."""
    t0 = time.monotonic()
    files = list_files(train_dir)
    trainer = Trainer(seed, budget, x_val, y_val)
    rng = np.random.default_rng(seed + 1000)
    tier, passes, metrics = 0, 0, {"val_accuracy": float("nan")}
    read_s = 0.0
    while trainer.seen < budget:
        order = rng.permutation(len(files))
        t = time.monotonic()
        x, y, nbytes = read_samples([files[i] for i in order])
        read_s += time.monotonic() - t
        tier += nbytes
        metrics = trainer.train_pass(x, y)
        passes += 1
    return Result(
        config="full shuffle",
        seed=seed,
        val_accuracy=metrics["val_accuracy"],
        samples=trainer.seen,
        passes=passes,
        rfs=[1] * passes,
        tier_bytes=tier,
        mount_bytes=0,
        seconds=time.monotonic() - t0,
        read_seconds=read_s,
    )


def metfs_cmd(binary: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=120)


def run_met(
    cfg: Config,
    binary: str,
    train_dir: str,
    work: str,
    budget: int,
    seed: int,
    x_val: np.ndarray,
    y_val: np.ndarray,
) -> Result:
    """One MET run over a fresh metfs mount (unmounted at the end, whatever happens)."""
    t0 = time.monotonic()
    run_dir = tempfile.mkdtemp(prefix=f"{cfg.name.replace(' ', '_')}-s{seed}-", dir=work)
    cache, mnt = os.path.join(run_dir, "cache"), os.path.join(run_dir, "mnt")
    os.makedirs(cache)
    os.makedirs(mnt)
    sock = os.path.join(cache, "metfs.sock")
    mount_args = [
        "mount",
        "--source", train_dir,
        "--cache", cache,
        "--budget", "16MiB",
        "--mini-epochs", str(cfg.nm),
        "--seed", str(seed),
        "--history", os.path.join(run_dir, "rf-history.json"),
        *shlex.split(cfg.flags or ""),
        mnt,
    ]  # fmt: skip
    proc = metfs_cmd(binary, *mount_args)
    if proc.returncode != 0:
        raise RuntimeError(
            f"metfs {' '.join(mount_args)} failed ({proc.returncode}): "
            f"{proc.stderr.strip() or proc.stdout.strip()}"
        )
    try:
        trainer = Trainer(seed, budget, x_val, y_val)
        client = metfs.Client(sock, job="rf_experiment")
        run = metfs.passes(client, epochs=1_000_000)
        mount_bytes, metrics = 0, {"val_accuracy": float("nan")}
        read_s = 0.0
        # [(epoch, mini_epoch), passes, samples seen before its first pass] per mini-epoch
        mes: List[list] = []
        for p in run:
            if not mes or mes[-1][0] != p.position:
                mes.append([p.position, 0, trainer.seen])
            mes[-1][1] += 1
            t = time.monotonic()
            x, y, nbytes = read_samples(p.paths)
            read_s += time.monotonic() - t
            mount_bytes += nbytes
            metrics = trainer.train_pass(x, y)
            if trainer.seen >= budget:
                break  # the sample budget is spent: no pass_end for the last pass
            p.report(metrics)
        end = client.status()
        client.close()
        decisions: Dict[str, int] = {}
        for d in run.decisions:
            decisions[d.decision] = decisions.get(d.decision, 0) + 1
        return Result(
            config=cfg.name,
            seed=seed,
            val_accuracy=metrics["val_accuracy"],
            samples=trainer.seen,
            passes=len(run.records) + 1,
            rfs=[n for _, n, _ in mes[:-1]],
            rf_starts=[start / budget for _, _, start in mes[:-1]],
            last_partial=mes[-1][1],
            tier_bytes=end.tier_bytes_read or 0,
            mount_bytes=mount_bytes,
            decisions=decisions,
            seconds=time.monotonic() - t0,
            read_seconds=read_s,
        )
    finally:
        um = metfs_cmd(binary, "umount", mnt)
        if um.returncode != 0:
            print(
                f"warning: metfs umount {mnt} failed ({um.returncode}): {um.stderr.strip()}",
                file=sys.stderr,
            )
        else:
            shutil.rmtree(run_dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def table(configs: List[Config], results: List[Result], dataset_bytes: int) -> str:
    rows = [
        "| configuration | mount flags | val accuracy (mean ± std) | per seed | avg rf "
        "| mini-epochs | samples | capacity-tier bytes | x dataset |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for cfg in configs:
        rs = [r for r in results if r.config == cfg.name]
        if not rs:
            continue
        acc = np.array([r.val_accuracy for r in rs])
        rfs = [n for r in rs for n in r.rfs]
        avg_rf = float(np.mean(rfs)) if rfs else float("nan")
        tier = float(np.mean([r.tier_bytes for r in rs]))
        flags = (
            "(none: reads the source directory)"
            if cfg.flags is None
            else (f"`--mini-epochs {cfg.nm} {cfg.flags}`")
        )
        mes = np.mean([len(r.rfs) + (1 if r.last_partial else 0) for r in rs])
        rows.append(
            f"| {cfg.name} | {flags} | {100 * acc.mean():.2f} ± {100 * acc.std():.2f} % "
            f"| {' '.join(f'{100 * a:.1f}' for a in acc)} "
            f"| {avg_rf:.1f} | {mes:.1f} | {int(np.mean([r.samples for r in rs]))} "
            f"| {human(tier)} | {tier / dataset_bytes:.2f} |"
        )
    return "\n".join(rows)


def histogram(
    name: str, rfs: List[int], width: int = 40, bin_width: int = 4, top: Optional[int] = None
) -> str:
    """A text histogram of rf over mini-epochs: bins 1-4, 5-8, ... up to the largest rf (at
    least ``top``, default the fixed rf)."""
    if not rfs:
        return f"{name}: no completed mini-epoch"
    arr = np.array(rfs)
    if arr.min() == arr.max():
        return f"{name}: {len(rfs)} mini-epochs, rf {arr.min()} each"
    top_rf = max(int(arr.max()), RF_FIXED if top is None else top)
    counts = []
    for lo in range(1, top_rf + 1, bin_width):
        hi = lo + bin_width - 1
        counts.append((lo, hi, int(((arr >= lo) & (arr <= hi)).sum())))
    top = max(c for _, _, c in counts) or 1
    lines = [
        f"{name}: {len(rfs)} mini-epochs, rf mean {arr.mean():.1f}, median "
        f"{np.median(arr):.0f}, min {arr.min()}, max {arr.max()}"
    ]
    for lo, hi, c in counts:
        lines.append(f"  rf {lo:>3}-{hi:<3} | {'#' * round(width * c / top):<{width}} {c}")
    return "\n".join(lines)


def by_quarter(starts_rfs: List[Tuple[float, int]]) -> str:
    """Mean rf of the mini-epochs that began in each quarter of the sample budget."""
    parts = []
    for q in range(4):
        rfs = [n for f, n in starts_rfs if q / 4 <= f < (q + 1) / 4]
        parts.append(f"{np.mean(rfs):.1f} ({len(rfs)})" if rfs else "- (0)")
    return "  mean rf (mini-epochs) by quarter of training: " + ", ".join(parts)


def verdict(configs: List[Config], results: List[Result]) -> str:
    """The issue's goal: an adaptive policy wins back >= half the accuracy the fixed rf lost,
    with an average rf >= a third of the fixed one."""

    def mean_acc(name: str) -> float:
        return float(np.mean([r.val_accuracy for r in results if r.config == name]))

    names = {c.name for c in configs}
    base, fixed = "full shuffle", f"fixed rf {RF_FIXED}"
    if base not in names or fixed not in names:
        return ""
    lost = mean_acc(base) - mean_acc(fixed)
    out = [
        f"accuracy lost by {fixed}: {100 * lost:.2f} points "
        f"({100 * mean_acc(base):.2f} -> {100 * mean_acc(fixed):.2f} %)"
    ]
    for name in ADAPTIVE:
        rs = [r for r in results if r.config == name]
        if not rs:
            continue
        rfs = [n for r in rs for n in r.rfs]
        avg = float(np.mean(rfs))
        won = (mean_acc(name) - mean_acc(fixed)) / lost if lost > 0 else float("nan")
        ok = won >= 0.5 and avg >= RF_FIXED / 3
        out.append(
            f"{name}: wins back {100 * won:.0f} % of it with average rf {avg:.1f} "
            f"(>= {RF_FIXED / 3:.1f} needed): goal {'met' if ok else 'NOT met'}"
        )
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    ap.add_argument(
        "--sweep", action="store_true", help="run the fixed-rf sweep instead of the comparison"
    )
    ap.add_argument(
        "--only", default=None, help="comma-separated configuration names to run (default all)"
    )
    ap.add_argument(
        "--extra",
        action="append",
        default=[],
        metavar="NAME=FLAGS",
        help="an extra MET configuration, e.g. 'score-w4=--rf-policy score --score-wait 4'",
    )
    ap.add_argument("--metfs", default=None, help="metfs binary (default target/release/metfs)")
    ap.add_argument("--out", default=None, help="work directory (default a temporary one)")
    ap.add_argument("--json", default=None, help="write every run's result to this file")
    args = ap.parse_args(argv)

    # SIGTERM (and SIGINT, which a background job ignores) unwind through the `finally` that
    # unmounts.
    def stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    binary = args.metfs or os.path.join(ROOT, "target", "release", "metfs")
    if not os.access(binary, os.X_OK):
        print(
            f"error: no metfs binary at {binary} (cargo build --release -p metfs)", file=sys.stderr
        )
        return 2
    import torch

    torch.set_num_threads(1)  # one core for training, one for the daemon
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]

    configs = [Config("full shuffle", None)]
    if args.sweep:
        configs += [Config(f"fixed rf {rf}", f"--rf-policy fixed --rf {rf}") for rf in SWEEP_RF]
        configs.append(Config(f"fixed rf {RF_FIXED}", f"--rf-policy fixed --rf {RF_FIXED}"))
        configs += [
            Config(f"fixed rf {RF_FIXED}, nm {nm}", f"--rf-policy fixed --rf {RF_FIXED}", nm)
            for nm in SWEEP_NM
        ]
    else:
        configs.append(Config(f"fixed rf {RF_FIXED}", f"--rf-policy fixed --rf {RF_FIXED}"))
        configs += [Config(name, flags) for name, flags in ADAPTIVE.items()]
    for spec in args.extra:
        name, sep, flags = spec.partition("=")
        if not sep:
            print(f"error: --extra wants NAME=FLAGS, got {spec!r}", file=sys.stderr)
            return 2
        configs.append(Config(name.strip(), flags))
    if args.only:
        wanted = {s.strip() for s in args.only.split(",")}
        configs = [c for c in configs if c.name in wanted]

    work = args.out or tempfile.mkdtemp(prefix="rf_experiment-")
    os.makedirs(work, exist_ok=True)
    data_root = os.path.join(work, "data")
    if not os.path.isdir(os.path.join(data_root, "train")):
        train_dir, val_dir, stats = build_dataset(data_root)
    else:
        train_dir, val_dir = os.path.join(data_root, "train"), os.path.join(data_root, "val")
        stats = {}
    val_files = list_files(val_dir)
    x_val, y_val, _ = read_samples(val_files)
    train_files = list_files(train_dir)
    n_train = len(train_files)
    dataset_bytes = sum(os.path.getsize(f) for f in train_files)
    budget = FULL_EPOCHS * n_train
    print(
        f"digits: {n_train} training files ({human(dataset_bytes)}), {len(val_files)} held-out "
        f"validation files; {stats or 'reused'}"
    )
    print(
        f"budget: {budget} samples ({FULL_EPOCHS} x the training set) per run; MLP 64-{HIDDEN}-10, "
        f"SGD lr {LR} cosine to 0 over the budget, momentum {MOMENTUM}, batch {BATCH}, "
        f"wd {WD}; nm {NM}; seeds {seeds}; work dir {work}",
        flush=True,
    )

    results: List[Result] = []
    t_start = time.monotonic()
    for cfg in configs:
        for seed in seeds:
            if cfg.flags is None:
                r = run_full_shuffle(train_dir, budget, seed, x_val, y_val)
            else:
                r = run_met(cfg, binary, train_dir, work, budget, seed, x_val, y_val)
            results.append(r)
            rf_txt = (
                f"avg rf {np.mean(r.rfs):.1f} over {len(r.rfs)} mini-epochs"
                + (
                    f" (+{r.last_partial} passes in the one the budget ended in)"
                    if r.last_partial
                    else ""
                )
                if cfg.flags is not None and r.rfs
                else f"{r.passes} passes"
            )
            print(
                f"  {cfg.name:<14} seed {seed}: val_accuracy {100 * r.val_accuracy:.2f} %, "
                f"{rf_txt}, tier {human(r.tier_bytes)}, decisions {r.decisions or '-'}, "
                f"{r.seconds:.1f} s ({r.read_seconds:.1f} s reading files)",
                flush=True,
            )
    print(f"\n{len(results)} runs in {time.monotonic() - t_start:.0f} s\n")
    print(table(configs, results, dataset_bytes))
    print()
    print("rf per mini-epoch, all seeds (completed mini-epochs):\n")
    print("```")
    for cfg in configs:
        if cfg.flags is not None:
            rs = [r for r in results if r.config == cfg.name]
            print(histogram(cfg.name, [n for r in rs for n in r.rfs]))
            print(
                by_quarter([(f, n) for r in rs for f, n in zip(r.rf_starts, r.rfs, strict=False)])
            )
    print("```")
    v = verdict(configs, results)
    if v:
        print()
        print(v)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "budget_samples": budget,
                    "train_files": n_train,
                    "dataset_bytes": dataset_bytes,
                    "configs": [c.__dict__ for c in configs],
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
