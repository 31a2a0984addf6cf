"""Shared pieces of the training studies over real metfs mounts (not a program).

``rf_experiment.py`` holds the first study (digits, an MLP) and its report helpers;
``stratified_variance.py`` and ``cnn_study.py`` import from it and from here:

* :func:`metfs_binary` resolves the binary (``--metfs``, else ``$METFS_BIN``, else
  ``target/release/metfs``);
* :func:`mounted` mounts a source with a fresh cache, socket and event log under a run
  directory and always unmounts it, also on errors and signals (:func:`unwind_on_signals`);
* :func:`met_passes` is the pass loop of a MET run: it reads each view through the mount,
  trains one pass, reports the metrics with ``pass_end`` and records what a report needs
  (rf of every mini-epoch, class histograms of each view, decisions, tier bytes);
* :func:`bootstrap_ratio_ci` is the percentile bootstrap of a ratio of two sample variances.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, ".."))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from rf_experiment import Result, metfs  # also puts the client on sys.path


def metfs_binary(flag: str | None) -> str:
    """The metfs binary: the ``--metfs`` flag, else ``$METFS_BIN``, else the release build."""
    return flag or os.environ.get("METFS_BIN") or os.path.join(ROOT, "target", "release", "metfs")


def unwind_on_signals() -> None:
    """SIGTERM and SIGINT raise, so that every ``finally`` (the unmounts) runs."""

    def stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def run_metfs(binary: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([binary, *args], check=False, capture_output=True, text=True, timeout=300)


@dataclass
class Mount:
    """A mounted dataset: where it is, its control socket and its rf history file."""

    mountpoint: str
    socket: str
    cache: str
    history: str
    run_dir: str


@contextmanager
def mounted(
    binary: str,
    source: str,
    work: str,
    name: str,
    flags: Sequence[str],
    history: str | None = None,
    keep: bool = False,
) -> Iterator[Mount]:
    """Mounts ``source`` with ``flags`` under a new run directory in ``work``.

    The rf history goes to ``history`` (default: inside the run directory). The mount is
    unmounted on the way out whatever happens; the run directory is removed after a clean
    unmount unless ``keep``.
    """
    run_dir = tempfile.mkdtemp(prefix=f"{name.replace(' ', '_')}-", dir=work)
    cache, mnt = os.path.join(run_dir, "cache"), os.path.join(run_dir, "mnt")
    os.makedirs(cache)
    os.makedirs(mnt)
    hist = history or os.path.join(run_dir, "rf-history.json")
    args = [
        "mount",
        "--source",
        source,
        "--cache",
        cache,
        "--history",
        hist,
        *flags,
        mnt,
    ]
    proc = run_metfs(binary, *args)
    if proc.returncode != 0:
        raise RuntimeError(
            f"metfs {shlex.join(args)} failed ({proc.returncode}): "
            f"{proc.stderr.strip() or proc.stdout.strip()}"
        )
    clean = False
    try:
        yield Mount(mnt, os.path.join(cache, "metfs.sock"), cache, hist, run_dir)
    finally:
        um = run_metfs(binary, "umount", mnt)
        if um.returncode != 0:
            print(f"warning: metfs umount {mnt}: {um.stderr.strip()}", file=sys.stderr)
            fb = subprocess.run(
                ["fusermount3", "-u", mnt], check=False, capture_output=True, text=True
            )
            clean = fb.returncode == 0
        else:
            clean = True
    if clean and not keep:
        shutil.rmtree(run_dir, ignore_errors=True)


def label_of(path: str) -> int:
    """A sample's class: the name of its directory."""
    return int(os.path.basename(os.path.dirname(path)))


@dataclass
class MetRun:
    """What :func:`met_passes` recorded of one MET run, besides the training's own metrics."""

    rfs: list[int] = field(default_factory=list)  # passes of each completed mini-epoch
    rf_starts: list[float] = field(default_factory=list)  # where each began, budget fraction
    last_partial: int = 0  # passes over the mini-epoch the budget ended in
    classes: list[dict[int, int]] = field(default_factory=list)  # class histogram per view
    decisions: dict[str, int] = field(default_factory=dict)
    replayed: int = 0  # `learned` decisions taken from the recorded schedule
    tier_bytes: int = 0
    mount_bytes: int = 0
    passes: int = 0
    read_seconds: float = 0.0


def met_passes(
    mount: Mount,
    job: str,
    train_pass: Callable[[list[str]], tuple[dict[str, float], int]],
    seen: Callable[[], int],
    budget: int,
    block: bool = False,
) -> MetRun:
    """Trains over the mount's views until ``seen()`` reaches ``budget`` samples.

    ``train_pass(paths)`` reads the files (through the mount), trains one pass and returns its
    metrics and the bytes it read. The pass that spends the budget is not reported (the run
    ends inside its mini-epoch, which is then counted in ``last_partial``, not in ``rfs``).
    ``block`` sends ``pass_end(block=true)``: the job waits for the next mini-epoch instead of
    making a bonus pass over the current one when the policy wants to leave it before it is
    staged.
    """
    client = metfs.Client(mount.socket, job=job)
    loop = metfs.passes(client, epochs=1_000_000, block=block)
    out = MetRun()
    mes: list[list[int]] = []  # [passes, samples seen before the first] per mini-epoch
    position: tuple[int, int] | None = None
    for p in loop:
        if p.position != position:
            position = p.position
            mes.append([0, seen()])
            out.classes.append(dict(sorted(Counter(label_of(f) for f in p.paths).items())))
        mes[-1][0] += 1
        t = time.monotonic()
        metrics, nbytes = train_pass(p.paths)
        out.read_seconds += time.monotonic() - t
        out.mount_bytes += nbytes
        if seen() >= budget:
            break
        p.report(metrics)
    end = client.status()
    client.close()
    out.rfs = [n for n, _ in mes[:-1]]
    out.rf_starts = [start / budget for _, start in mes[:-1]]
    out.last_partial = mes[-1][0]
    out.passes = len(loop.records) + 1
    out.tier_bytes = end.tier_bytes_read or 0
    for d in loop.decisions:
        out.decisions[d.decision] = out.decisions.get(d.decision, 0) + 1
        out.replayed += d.reason is not None and d.reason.get("source") == "history"
    return out


def to_result(config: str, seed: int, accuracy: float, samples: int, run: MetRun) -> Result:
    """A :class:`rf_experiment.Result` (its report helpers take those) from a MET run."""
    return Result(
        config=config,
        seed=seed,
        val_accuracy=accuracy,
        samples=samples,
        passes=run.passes,
        rfs=run.rfs,
        rf_starts=run.rf_starts,
        last_partial=run.last_partial,
        tier_bytes=run.tier_bytes,
        mount_bytes=run.mount_bytes,
        decisions=run.decisions,
    )


def bootstrap_ratio_ci(
    a: Sequence[float], b: Sequence[float], reps: int = 10_000, seed: int = 0
) -> tuple[float, float, float]:
    """``var(a) / var(b)`` (sample variances) and its 95 % percentile-bootstrap interval.

    Each resample draws ``len(a)`` values of ``a`` and ``len(b)`` of ``b`` with replacement,
    independently (the two groups are independent runs).
    """
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    rng = np.random.default_rng(seed)
    xs = x[rng.integers(0, len(x), size=(reps, len(x)))]
    ys = y[rng.integers(0, len(y), size=(reps, len(y)))]
    vy = ys.var(axis=1, ddof=1)
    ok = vy > 0
    ratios = xs.var(axis=1, ddof=1)[ok] / vy[ok]
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return float(x.var(ddof=1) / y.var(ddof=1)), float(lo), float(hi)
