#!/usr/bin/env python3
"""The accuracy/tier-bytes front of fixed rf, and every adaptive policy placed on it.

    python3 benches/rf_front.py --png docs/rf_front.png --json rf_front.json   # about 8 hours
    python3 benches/rf_front.py --quick                                        # the test's run

Issue 51, item 1. An adaptive rf policy is worth its name only above the **front**: the test
accuracy that fixed rf 1, 2, 4, ... reaches for the capacity-tier bytes it reads. Every run here
trains the same model for the same sample budget, its learning rate cosine-decayed to 0 over that
budget (every run finishes its schedule), reading through a real metfs mount; only the policy
deciding when the view advances differs, and with it how many mini-epochs (tier bytes) the run
reads. Seeds are paired: seed s gives every configuration the same initialisation, batch order
and mount plan.

**Workloads** (their generators and models imported, not copied):

* ``glyphs``: examples/cnn_study.py's 16x16 grey glyphs (20,000 files of 384 B) and its CNN
  (``cnn_study.Trainer``), 16 epochs' worth of samples, 64 mini-epochs;
* ``colour``: benches/tta.py's colour glyphs (20,000 files of 48 KiB, pooled 4x to 32x32x3) and
  its CNN (``tta.Learner``), 5 epochs' worth, 32 mini-epochs.

**Configurations**: fixed rf 1, 2, 4, 8, 16, 32, and the adaptive variants at ``--rf-max 64``:
``score`` (paper Fig. 6: run-wide best), ``score per-me`` (best per mini-epoch), ``score
val_loss`` (a val_loss-only score, best per mini-epoch), ``bollinger`` (the defaults),
``bollinger paper`` (N = 20, population std, current point included, window per mini-epoch),
``bollinger above`` (the band on val_accuracy, leaving on an upward breakout), ``paced`` (the
new policy: staging-aware, progress-capped cap, held-out gains from ``val_loss``) and ``paced
fresh`` (the same fed only the fresh-data loss). Every pass reports ``loss``, ``accuracy``,
``val_accuracy`` and ``val_loss`` (``paced fresh``: no ``val_loss``), the run's progress
(samples of the budget) and, on a mini-epoch's first pass, its fresh-data loss (the loss of its
first FRESH_BATCHES batches, evaluated before training on them).

**Reported**, per workload: a table of every configuration (test accuracy with a 95 % bootstrap
interval over seeds, tier MiB, passes, mean rf, the rf distribution in Fig. 11's style); for
each adaptive configuration its paired difference from the fixed front of its own seed,
interpolated (in log scale) at its realised tier bytes and at its realised mean rf, with a 95 %
bootstrap interval, and the tier bytes the front needs for its accuracy (``x front bytes``);
the mean rf and spread of score and Bollinger beside Fig. 11's (score 55, Bollinger 35 of 128);
and the front as a PNG (``--png``, drawn by ``metfs plot``).

``--quick``: the glyphs workload at 2,000 samples, 8 mini-epochs, 3 epochs' worth of samples,
one seed, fixed rf 2 and 8 and ``paced``: seconds per point, to prove the harness (its numbers
mean nothing).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "benches"))
sys.path.insert(0, str(ROOT / "benches" / "peers"))
sys.path.insert(0, str(ROOT / "bindings" / "python" / "src"))

import cnn_study  # noqa: E402  the glyphs, their CNN and its trainer
import metfs  # noqa: E402
from met_study import metfs_binary, mounted, unwind_on_signals  # noqa: E402

FIXED_RFS = [1, 2, 4, 8, 16, 32]
RF_MAX = 64
#: Batches of a first pass whose loss, before training on them, is the fresh-data loss.
FRESH_BATCHES = 4
#: Fig. 11 of paper 001: mean rf over 128 mini-epochs at rf_max 128.
FIG11 = {"score": 55, "bollinger": 35}
ADAPTIVE = {
    "score": "--rf-policy score",
    "score per-me": "--rf-policy score --best-scope per_mini_epoch",
    "score val_loss": "--rf-policy score --score-metrics val_loss --best-scope per_mini_epoch",
    "bollinger": "--rf-policy bollinger",
    "bollinger paper": "--rf-policy bollinger --bollinger-window 20 --bollinger-std population "
    "--bollinger-current included --bollinger-scope per_mini_epoch",
    "bollinger above": "--rf-policy bollinger --score-metrics val_accuracy --bollinger-side above",
    "paced": "--rf-policy paced",
    "paced fresh": "--rf-policy paced",
}
#: Configurations that do not send val_loss (the held-out signal is the fresh-data loss).
NO_VAL_LOSS = {"paced fresh"}


@dataclass
class Run:
    """One run: its configuration, seed and what it measured."""

    workload: str
    config: str
    seed: int
    accuracy: float
    tier_bytes: int
    passes: int
    rfs: list[int] = field(default_factory=list)
    seconds: float = 0.0
    #: The commit the run was made at (`git describe --always --dirty`), so that a table that
    #: mixes runs of several sessions (`--json` resumes) says which code each ran.
    commit: str = ""
    #: The machine's 1-minute load average when the run ended: non-blocking `pass_end` gives
    #: bonus passes while staging, so a loaded machine changes how many passes a run makes.
    load: float = 0.0

    @property
    def mean_rf(self) -> float:
        return float(np.mean(self.rfs)) if self.rfs else float(self.passes)


# --------------------------------------------------------------------------------- workloads


class Model:
    """What the pass loop needs of a workload's model."""

    seen: int

    def train_pass(self, paths: list[str]) -> dict[str, float]: ...
    def fresh_loss(self, paths: list[str]) -> float: ...
    def val(self) -> dict[str, float]: ...
    def test_accuracy(self) -> float: ...


def _ce(net: Any, x: Any, y: np.ndarray) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of ``net`` on ``(x, y)``, without training."""
    import torch

    net.eval()
    with torch.inference_mode():
        out = net(x)
        loss = float(torch.nn.functional.cross_entropy(out, torch.from_numpy(y)))
        acc = float((out.argmax(1).numpy() == y).mean())
    return loss, acc


class GlyphModel(Model):
    """cnn_study's CNN over its grey glyphs."""

    def __init__(self, seed: int, budget: int, data: dict[str, Any]) -> None:
        self.t = cnn_study.Trainer(seed, budget, data["val"], data["test"], "none", False)
        self.rng = np.random.default_rng([seed, 51])

    @property
    def seen(self) -> int:  # type: ignore[override]
        return self.t.seen

    def train_pass(self, paths: list[str]) -> dict[str, float]:
        x, y, _ = cnn_study.read_glyphs(paths)
        return self.t.train_pass(x, y)

    def fresh_loss(self, paths: list[str]) -> float:
        pick = self.rng.permutation(len(paths))[: FRESH_BATCHES * cnn_study.BATCH]
        x, y, _ = cnn_study.read_glyphs([paths[i] for i in pick])
        return _ce(self.t.net, self.t.tensor(x), y)[0]

    def val(self) -> dict[str, float]:
        loss, acc = _ce(self.t.net, self.t.val[0], self.t.val[1])
        return {"val_loss": loss, "val_accuracy": acc}

    def test_accuracy(self) -> float:
        return self.t.accuracy(self.t.test)


class ColourModel(Model):
    """tta.py's CNN over its colour glyphs (stored 128x128x3, pooled to 32x32x3)."""

    def __init__(self, seed: int, budget: int, data: dict[str, Any]) -> None:
        import tta

        self.tta = tta
        self.learner = tta.Learner(seed, budget)
        self.data = data
        self.rng = np.random.default_rng([seed, 51])

    @property
    def seen(self) -> int:  # type: ignore[override]
        return self.learner.seen

    def _read(self, paths: list[str]) -> tuple[list[np.ndarray], np.ndarray]:
        shape = self.tta.SAMPLE_SHAPE
        raw = [np.frombuffer(Path(p).read_bytes(), np.uint8).reshape(shape) for p in paths]
        return raw, np.array([self.tta.label_of(p) for p in paths], np.int64)

    def train_pass(self, paths: list[str]) -> dict[str, float]:
        order = self.rng.permutation(len(paths))
        loss_sum, right = 0.0, 0
        batch = self.tta.BATCH
        for lo in range(0, len(order), batch):
            raw, y = self._read([paths[i] for i in order[lo : lo + batch]])
            loss, correct = self.learner.step(raw, y)
            loss_sum, right = loss_sum + loss, right + correct
        return {"loss": loss_sum / len(order), "accuracy": right / len(order)}

    def fresh_loss(self, paths: list[str]) -> float:
        pick = self.rng.permutation(len(paths))[: FRESH_BATCHES * self.tta.BATCH]
        raw, y = self._read([paths[i] for i in pick])
        return _ce(self.learner.net, self.tta.pool(np.stack(raw)), y)[0]

    def val(self) -> dict[str, float]:
        import torch

        x = torch.from_numpy(self.data["val_x"])
        loss, acc = _ce(self.learner.net, x, self.data["val_y"])
        return {"val_loss": loss, "val_accuracy": acc}

    def test_accuracy(self) -> float:
        return self.learner.accuracy(self.data["test_x"], self.data["test_y"])


@dataclass
class Workload:
    """A dataset on disk, its evaluation sets, and how to make its model."""

    name: str
    source: str
    nm: int
    budget: int  # training samples per run
    budget_mib: int  # the mount's cache budget
    data: dict[str, Any]
    make: Callable[[int, int, dict[str, Any]], Model]


def glyph_workload(work: Path, n: int, val: int, test: int, epochs: int, nm: int) -> Workload:
    source = work / "glyphs"
    x, y = cnn_study.glyphs(n, seed=0)
    for c in range(cnn_study.CLASSES):
        (source / str(c)).mkdir(parents=True, exist_ok=True)
    for i, (img, c) in enumerate(zip(x, y, strict=True)):
        np.save(source / str(c) / f"{c}_{i:05d}.npy", img)
    data = {"val": cnn_study.glyphs(val, seed=1), "test": cnn_study.glyphs(test, seed=2)}
    return Workload("glyphs", str(source), nm, epochs * n, 16, data, GlyphModel)


def colour_workload(work: Path, n: int, val: int, test: int, epochs: int, nm: int) -> Workload:
    import tta

    source = work / "colour"
    x, y = tta.make_samples(n, seed=0)
    for c in range(tta.CLASSES):
        (source / f"{c:02d}").mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (source / tta.key_of(i, int(y[i]))).write_bytes(x[i].tobytes())
    data: dict[str, Any] = {}
    for name, size, seed in (("val", val, 1), ("test", test, 2)):
        xs, ys = tta.make_samples(size, seed)
        data[f"{name}_x"], data[f"{name}_y"] = tta.pool(xs).numpy(), ys
    mib = max(64, 4 * n * tta.SAMPLE_BYTES // nm // (1 << 20))
    return Workload("colour", str(source), nm, epochs * n, mib, data, ColourModel)


# -------------------------------------------------------------------------------------- runs


def flags_of(config: str) -> list[str]:
    if config.startswith("fixed rf "):
        return ["--rf-policy", "fixed", "--rf", config.split()[-1], "--rf-max", str(RF_MAX)]
    return [*ADAPTIVE[config].split(), "--rf-max", str(RF_MAX)]


def one_run(binary: str, w: Workload, config: str, seed: int, work: str) -> Run:
    """Trains one model through a mount until the sample budget is spent."""
    import torch

    torch.set_num_threads(1)
    t0 = time.monotonic()
    model = w.make(seed, w.budget, w.data)
    flags = ["--budget", f"{w.budget_mib}MiB", "--mini-epochs", str(w.nm), "--seed", str(seed)]
    flags += flags_of(config)
    rfs: list[int] = []
    position: tuple[int, int] | None = None
    # Short: the control socket's path must fit in sun_path.
    name = f"{w.name[0]}s{seed}"
    with mounted(binary, w.source, work, name, flags) as m:
        client = metfs.Client(m.socket, job=f"rf_front-{w.name}")
        loop = metfs.passes(client, epochs=1_000_000)
        for p in loop:
            if p.position != position:
                position = p.position
                rfs.append(0)
            rfs[-1] += 1
            paths = list(p.paths)
            fresh = model.fresh_loss(paths) if p.fresh else None
            metrics = model.train_pass(paths)
            if model.seen >= w.budget:
                break
            metrics.update(model.val())
            if config in NO_VAL_LOSS:
                metrics.pop("val_loss")
            p.report(metrics)
            p.progress = min(1.0, model.seen / w.budget)
            p.fresh_loss = fresh
        tier = client.status().tier_bytes_read or 0
        client.close()
    return Run(
        workload=w.name,
        config=config,
        seed=seed,
        accuracy=model.test_accuracy(),
        tier_bytes=tier,
        passes=sum(rfs),
        # The mini-epoch the budget ended in is cut short: not a choice of the policy.
        rfs=rfs[:-1],
        seconds=time.monotonic() - t0,
    )


# ----------------------------------------------------------------------------------- analysis


def boot_ci(xs: list[float], reps: int = 10_000, seed: int = 0) -> tuple[float, float, float]:
    """Mean and its 95 % percentile-bootstrap interval (one value: the value, twice)."""
    a = np.asarray(xs, float)
    if len(a) < 2:
        return float(a.mean()), float(a.mean()), float(a.mean())
    rng = np.random.default_rng(seed)
    means = a[rng.integers(0, len(a), size=(reps, len(a)))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(a.mean()), float(lo), float(hi)


def interp_log(xs: list[float], ys: list[float], x: float) -> float:
    """``y`` at ``x`` on the piecewise-linear curve through ``(log x, y)``, clamped to its ends."""
    order = np.argsort(xs)
    lx = np.log(np.asarray(xs, float)[order])
    return float(np.interp(math.log(x), lx, np.asarray(ys, float)[order]))


def fixed_of(runs: list[Run], seed: int) -> list[Run]:
    return sorted(
        (r for r in runs if r.seed == seed and r.config.startswith("fixed rf ")),
        key=lambda r: r.tier_bytes,
    )


def paired(runs: list[Run], config: str) -> dict[str, tuple[float, float, float]] | None:
    """The adaptive ``config`` against its own seed's fixed front: accuracy difference (points)
    at equal tier bytes and at equal mean rf, and its tier bytes over the front's at its
    accuracy."""
    by_bytes, by_rf, ratio = [], [], []
    for r in (r for r in runs if r.config == config):
        front = fixed_of(runs, r.seed)
        if len(front) < 2:
            continue
        tb = [max(f.tier_bytes, 1) for f in front]
        acc = [f.accuracy for f in front]
        by_bytes.append(100 * (r.accuracy - interp_log(tb, acc, max(r.tier_bytes, 1))))
        rf = [float(f.config.split()[-1]) for f in front]
        by_rf.append(100 * (r.accuracy - interp_log(rf, acc, r.mean_rf)))
        # The front's bytes at this accuracy: accuracy falls as bytes fall, so invert it on the
        # monotone part (np.interp needs increasing accuracy).
        best = np.maximum.accumulate(np.asarray(acc))
        need = math.exp(float(np.interp(r.accuracy, best, np.log(tb))))
        ratio.append(r.tier_bytes / need)
    if not by_bytes:
        return None
    return {"bytes": boot_ci(by_bytes), "rf": boot_ci(by_rf), "ratio": boot_ci(ratio)}


def histogram(rfs: list[int]) -> str:
    """Fig. 11's view of an rf distribution: mini-epochs per power-of-two bucket."""
    if not rfs:
        return "-"
    c = Counter(min(int(math.log2(r)), 6) for r in rfs)
    names = ["1", "2-3", "4-7", "8-15", "16-31", "32-63", "64"]
    return " ".join(f"{names[b]}:{c[b]}" for b in sorted(c))


def table(runs: list[Run], workload: str, configs: list[str]) -> list[str]:
    out = [
        f"### {workload}",
        "",
        "| configuration | test accuracy % (95 % CI) | tier MiB | passes | mean rf | rf sd "
        "| rf distribution (mini-epochs by rf) | seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for cfg in configs:
        rs = [r for r in runs if r.workload == workload and r.config == cfg]
        if not rs:
            continue
        m, lo, hi = boot_ci([100 * r.accuracy for r in rs])
        rfs = [x for r in rs for x in r.rfs]
        sd = float(np.std(rfs)) if rfs else 0.0
        out.append(
            f"| {cfg} | {m:.2f} ({lo:.2f}-{hi:.2f}) | "
            f"{np.mean([r.tier_bytes for r in rs]) / (1 << 20):.1f} | "
            f"{np.mean([r.passes for r in rs]):.0f} | {np.mean([r.mean_rf for r in rs]):.2f} | "
            f"{sd:.2f} | {histogram(rfs)} | {np.mean([r.seconds for r in rs]):.0f} |"
        )
    return out


def ratio_lines(runs: list[Run], workload: str, configs: list[str]) -> list[str]:
    out = []
    rs = [r for r in runs if r.workload == workload]
    for cfg in configs:
        if cfg.startswith("fixed rf "):
            continue
        p = paired(rs, cfg)
        if p is None:
            continue
        b, f, q = p["bytes"], p["rf"], p["ratio"]
        out.append(
            f"ratio {workload} {cfg}: {b[0]:+.2f} pt vs the fixed front at equal tier bytes "
            f"[{b[1]:+.2f}, {b[2]:+.2f}], {f[0]:+.2f} pt at equal mean rf [{f[1]:+.2f}, "
            f"{f[2]:+.2f}], {q[0]:.2f}x the front's tier bytes for its accuracy "
            f"[{q[1]:.2f}, {q[2]:.2f}]"
        )
    return out


def fig11_lines(runs: list[Run], workload: str) -> list[str]:
    out = []
    for cfg, paper in FIG11.items():
        rfs = [x for r in runs if r.workload == workload and r.config == cfg for x in r.rfs]
        if rfs:
            out.append(
                f"fig11 {workload} {cfg}: mean rf {np.mean(rfs):.1f} (sd {np.std(rfs):.1f}) of "
                f"rf_max {RF_MAX}, {np.mean(rfs) / RF_MAX:.2f} of the cap; paper: {paper} of "
                f"128 ({paper / 128:.2f})"
            )
    return out


def plot(binary: str, runs: list[Run], workloads: list[str], png: str) -> None:
    """The front (fixed rf) and the adaptive points, accuracy against tier MiB, via metfs plot."""
    series = []
    for w in workloads:
        rs = [r for r in runs if r.workload == w]
        fixed = sorted({r.config for r in rs if r.config.startswith("fixed rf ")})
        pts = []
        for cfg in fixed:
            c = [r for r in rs if r.config == cfg]
            pts.append(
                [
                    np.mean([r.tier_bytes for r in c]) / (1 << 20),
                    100 * np.mean([r.accuracy for r in c]),
                ]
            )
        series.append({"name": f"{w}: fixed rf front", "points": sorted(pts)})
        for cfg in sorted({r.config for r in rs} - set(fixed)):
            c = [r for r in rs if r.config == cfg]
            x = np.mean([r.tier_bytes for r in c]) / (1 << 20)
            y = 100 * np.mean([r.accuracy for r in c])
            # A point alone draws nothing as a line: a short tick at its place.
            series.append({"name": f"{w}: {cfg}", "points": [[0.97 * x, y], [1.03 * x, y]]})
    doc = {
        "title": "Test accuracy against capacity-tier bytes: fixed rf front and adaptive rf",
        "x_label": "tier MiB read",
        "y_label": "test accuracy %",
        "series": [
            {"name": s["name"], "points": [[float(a), float(b)] for a, b in s["points"]]}
            for s in series
        ],
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(doc, f)
    r = subprocess.run([binary, "plot", f.name, png], capture_output=True, text=True, check=False)
    os.unlink(f.name)
    if r.returncode != 0:
        raise RuntimeError(f"metfs plot failed: {r.stderr.strip()}")
    print(f"front drawn: {png}")


# -------------------------------------------------------------------------------------- main


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="seconds per point: the test's run")
    ap.add_argument("--seeds", default="0,1,2,3,4", help="paired seeds (full run)")
    ap.add_argument("--workloads", default="glyphs,colour")
    ap.add_argument("--only", default=None, help="configurations to run, comma-separated")
    ap.add_argument("--metfs", default=None, help="the metfs binary (else $METFS_BIN)")
    ap.add_argument("--work", default=None, help="where datasets and mounts go")
    ap.add_argument(
        "--json",
        default=None,
        help="every run is written here as it ends; runs already in the file (same workload, "
        "configuration and seed) are kept and not run again, so a long run can be resumed",
    )
    ap.add_argument("--png", default=None, help="draw the front here (metfs plot)")
    return ap.parse_args(argv)


def setup(cfg: argparse.Namespace, work: Path) -> tuple[list[Workload], list[str], list[int]]:
    if cfg.quick:
        return (
            [glyph_workload(work, n=2_000, val=200, test=500, epochs=3, nm=8)],
            ["fixed rf 2", "fixed rf 8", "paced"],
            [0],
        )
    made = {
        "glyphs": lambda: glyph_workload(work, 20_000, 1_000, 5_000, 16, 64),
        "colour": lambda: colour_workload(work, 20_000, 500, 2_500, 5, 32),
    }
    configs = [f"fixed rf {r}" for r in FIXED_RFS] + list(ADAPTIVE)
    if cfg.only:
        configs = [c.strip() for c in cfg.only.split(",")]
    seeds = [int(s) for s in cfg.seeds.split(",")]
    return [made[w]() for w in cfg.workloads.split(",")], configs, seeds


def commit() -> str:
    """The checkout's commit, `-dirty` when it has changes."""
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def load_runs(path: Path | None) -> list[Run]:
    """The runs of an earlier, possibly interrupted, invocation with the same `--json`; none
    where the file does not exist. A file that is not such a list is an error naming it."""
    if path is None or not path.exists():
        return []
    try:
        return [Run(**r) for r in json.loads(path.read_text())]
    except (ValueError, TypeError) as e:
        raise SystemExit(f"rf_front: {path} is not a list of this benchmark's runs: {e}") from e


def save_runs(path: Path | None, runs: list[Run]) -> None:
    """Writes every run so far, atomically (a run killed mid-write leaves the last file)."""
    if path is None:
        return
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps([asdict(r) for r in runs], indent=1))
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    cfg = parse(argv)
    unwind_on_signals()
    binary = metfs_binary(cfg.metfs)
    t0 = time.monotonic()
    out = Path(cfg.json) if cfg.json else None
    runs = load_runs(out)
    if runs:
        print(f"resuming: {len(runs)} runs already in {out}", flush=True)
    at = commit()
    with tempfile.TemporaryDirectory(prefix="rf_front-", dir=cfg.work) as tmp:
        work = Path(tmp)
        workloads, configs, seeds = setup(cfg, work)
        for w in workloads:
            for seed in seeds:
                for c in configs:
                    if any((r.workload, r.config, r.seed) == (w.name, c, seed) for r in runs):
                        continue
                    r = one_run(binary, w, c, seed, str(work))
                    r.commit, r.load = at, os.getloadavg()[0]
                    runs.append(r)
                    save_runs(out, runs)
                    print(
                        f"run {w.name} {c} seed {seed}: accuracy {100 * r.accuracy:.2f} %, "
                        f"{r.tier_bytes / (1 << 20):.1f} tier MiB, mean rf {r.mean_rf:.2f}, "
                        f"{r.seconds:.0f} s",
                        flush=True,
                    )
    names = [w.name for w in workloads]
    runs = [r for r in runs if r.workload in names and r.config in configs and r.seed in seeds]
    lines: list[str] = []
    for w in names:
        lines += ["", *table(runs, w, configs), "", *ratio_lines(runs, w, configs)]
        lines += fig11_lines(runs, w)
    commits = Counter(r.commit for r in runs)
    lines += [
        "",
        "runs by commit: " + ", ".join(f"{c or 'unrecorded'} {n}" for c, n in commits.items()),
    ]
    print("\n".join(lines))
    print(f"\n{len(runs)} runs in {time.monotonic() - t0:.0f} s")
    if cfg.png:
        plot(binary, runs, names, cfg.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
