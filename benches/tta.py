#!/usr/bin/env python3
"""Time to accuracy: the same training job on metfs and on the tools a user picks instead.

    python3 benches/tta.py --png docs/tta.png       # the full run (about 3 hours on 2 cores)
    python3 benches/tta.py --quick --json FILE      # a small case of every metfs side and one peer
    python3 benches/tta.py --runs runs.jsonl ...    # resumable: finished runs are kept and reused

Issues 34 and 52. The peer benchmark (benches/peers/run.py) measures samples/s; this one measures what a
user wants from them, **how soon the model reaches the accuracy they need**, with a real PyTorch
training on every side and the same throttled tier under all of them.

**The dataset** ("colour glyphs", generated here, the same for every seed): the glyphs of
examples/cnn_study.py (10 classes, two prototype glyphs of three strokes per class, each sample
drawn with random rotation, scale, shift, endpoint jitter, stroke width and intensity, a clutter
stroke in half of them and pixel noise) rendered at 32x32, coloured (a random foreground and
background colour per sample), enlarged 4x to 128x128 and given per-pixel noise (uniform,
±24 of 255), stored as raw 128x128x3 uint8 arrays: 49,152 bytes (48 KiB) per sample, one file
per sample under its class directory (`CLASS/sNNNNN.raw`). 20,000 training samples (2,000 per
class, 938 MiB) are the capacity tier's content; 500 validation samples (the `val_accuracy`
the adaptive policies need, measured on the clock after every pass) and 2,500 test samples
(the reported accuracy) are made the same way and stay in memory, pooled.

**The job** (the same on every side but Streaming and direct, which bring the loaders their
documentation gives them): a loader of THREADS (16) threads reads samples in the side's order, at most PREFETCH (4) batches ahead; the training loop takes whole batches of 64,
pools them 4x4 to 32x32x3 and trains conv 3x3 (8) - max-pool - conv 3x3 (16) - max-pool -
linear, SGD with momentum (cnn_study's learning rate, momentum and weight decay), the learning
rate cosine-decayed to 0 over a sample budget (--epochs, 5, times the training set), one torch
thread. A run stops at the sample budget or after --secs (240) of wall time, whichever comes
first (the budget is long enough for the best peer to reach the target measured, not
projected); the clock starts before the mount (or the client) and stops at the last training step.
The weights are copied (not evaluated) at the start, after every pass or epoch, every GRID
samples (the same sample counts on every side) and at least every --snap-secs; once the clock
has stopped every copy is evaluated on the test set, so measuring costs the run nothing.

**The tier**: Garage behind benches/peers/proxy.py (`peers.Tier`: one token bucket for all
connections, every byte counted). With `--rate-mib auto` (the default) the cap is set after the
local-copy runs so that a full-shuffle epoch from the tier takes --ratio (4) times the local
copy's epoch, the training's own time: the job is I/O bound 4x when it reads every epoch from
the tier (more where a side cannot use the whole cap). Before the other sides run, the tier is
checked: where Garage behind the proxy cannot deliver 90 % of the cap to many GETs in flight on
this machine, the run stops with the numbers (--allow-slow-tier goes on; --quick always does).

**Sides** (each with the same cache budget, a third of the dataset, and the same job):

* `local`: full shuffle from a local copy of the whole dataset (no tier): the bound a faster
  tier could give. Run first, for every seed (--seeds, five by default): each seed's **target
  accuracy** is its local copy's final test accuracy minus one point, fixed and printed before
  any other side runs; every other run of that seed is held to it. A local run that fails or
  does not finish its sample budget within --secs stops the benchmark (no target is fixed from
  an unfinished schedule).
* `metfs-rf1`: `--rf-policy fixed --rf 1`, non-blocking: the job advances as soon as the next
  mini-epoch is staged (bonus passes over the current one until then), the simplest schedule
  that follows the tier's bandwidth;
* `metfs-score`, `metfs-bollinger`: `metfs mount` of the S3 prefix with `--rf-policy score` or
  `bollinger` (the policies' defaults but `--rf-max 8`, twice the fixed side's rf), the job
  sending loss, accuracy and val_accuracy with `pass_end`;
* `metfs-rf4`: `--rf-policy fixed --rf 4`; these three send the default non-blocking
  `pass_end`: a `wait` answer (the next mini-epoch is not staged yet) gives a bonus pass over
  the current one, which is MET's point;
* `metfs-rf4-block`: fixed rf 4 with `pass_end(block=true)`: the job waits for staging;
* `s3fs`, `rclone`: full shuffle through s3fs and rclone's VFS cache configured exactly as in
  benches/peers (`s3fs_mounted`, `rclone_mounted`), read by the job's loader;
* `streaming`: MosaicML Streaming configured by its own documentation as in benches/peers
  (`streaming_settings`: batch size 64 through its StreamingDataLoader with a worker process,
  `py1e` with a shuffle block of a mini-epoch's samples, predownload 2,000, one canonical node,
  cache_limit the budget, MDS shards of --shard-mib, 4 MiB); the configuration and the cache its
  tuning guide's formula needs are printed;
* `direct`: full shuffle, boto3 GETs of every sample straight from the tier through a PyTorch
  DataLoader whose worker processes each fetch a batch with threads over one client
  (`peers.DirectGets`), so the requests do not share the trainer's interpreter lock.

A side that cannot run (a peer missing) stops the benchmark with its name and the reason;
with --allow-missing it is skipped and listed as skipped in the table.

The full-shuffle sides but Streaming (SAME_AS_LOCAL) train exactly the local copy's sequence
of batches (same orders and bytes, one deterministic torch thread), only slower: checked at the
sample counts both measured. One that does not reach the target within the time budget would
reach it at the sample count where the local copy did; its time to target is projected from
the rate it consumed samples at, and reported as a projection beside its lower bound (the
budget).

Every run is a process of its own, forked from a server process that has imported torch once
(importing it takes seconds on a busy machine), so no side inherits another's threads; the
page cache is dropped before each. The order of the sides rotates between seeds. Measured per
run: test accuracy against wall time, the time to the target, the accuracy held at the time
budget, tier bytes (through the proxy, the side's mount and unmount included), and the fraction
of wall time spent in training steps (pooling, forward, backward, optimiser step: a CPU
stand-in for accelerator utilisation; a step's wall time includes waiting for the CPU and the
GIL, so its cost per sample is reported too), over the whole run and after the first batch
(for metfs: once the first mini-epoch is staged), samples per second, and the fraction of the
cap it read the tier at (tier bytes / run time / cap). Reported with each side's configuration
(how, and per whose documentation): medians and min-max over the
seeds, the goals of the issue met or not, the curves (`--curves`, the input of `metfs plot`)
and their PNG (`--png`, through `metfs plot`; skipped with a note where the binary has none).

Needs root (FUSE, tmpfs, dropping caches), Garage (scripts/garage.sh install) and torch.
Peers not installed are installed as run.py does (--no-install: not installed, so the run stops
unless --allow-missing).
Environment: METFS_BIN (default target/release/metfs, built when missing), TTA_WORK (work
directory, default a new /dev/shm/metfs-tta.*: the tier's objects, the local copy and every
side's cache in memory, so that a busy shared disk is not what is measured; removed unless
--keep).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benches" / "peers"))
sys.path.insert(0, str(ROOT / "examples"))

import benchlib  # the binary under test, its build, the page cache
import cnn_study  # the glyphs and the CNN study's optimiser settings
import run as peers  # the tier, the peers' configurations, available()
from met_study import met_passes, mounted  # the MET pass loop over a real mount

MIB = 1 << 20
SIDE = 32  # training resolution
UP = 4  # stored at UP x SIDE
SAMPLE_SHAPE = (SIDE * UP, SIDE * UP, 3)
SAMPLE_BYTES = int(np.prod(SAMPLE_SHAPE))  # 49,152
CLASSES = cnn_study.CLASSES
CHANNELS = cnn_study.CHANNELS
BATCH = cnn_study.BATCH
#: Loader threads: enough that a full shuffle straight from the tier is held back by the tier's
#: cap, not by its per-request latency (benches/peers' 4 threads read 78 samples/s, 3.7 MiB/s,
#: from the direct side in a trial on a busy 2-core machine, under a cap of 30 MiB/s).
THREADS = 16
PREFETCH = 4  # batches the loader reads ahead
#: The weights are also copied every GRID samples, at the same sample counts on every side.
GRID = 64 * BATCH
NOISE = 24  # per-pixel noise of the stored image, in 1/255
PREFIX = "tta"
#: The adaptive policies' rf_max: twice the fixed side's rf (cnn_study's 16 left both policies
#: on 2-3 mini-epochs of a one-minute run in a trial, Bollinger at rf_max nearly always).
RF_MAX = 8
SIDES = [
    "local",
    "metfs-rf1",
    "metfs-score",
    "metfs-bollinger",
    "metfs-rf4",
    "metfs-rf4-block",
    "s3fs",
    "rclone",
    "streaming",
    "direct",
]
PEERS = ["s3fs", "rclone", "streaming", "direct"]
ADAPTIVE = ["metfs-score", "metfs-bollinger"]
#: `metfs mount`'s default policy (fixed rf 4 since issue 51 measured the adaptive ones against
#: the fixed-rf front), non-blocking: the side the goals are judged on.
DEFAULT_SIDE = "metfs-rf4"
#: Sides that train exactly the local copy's sequence of batches (same orders, same bytes, one
#: deterministic torch thread): only when each batch arrives differs.
SAME_AS_LOCAL = ["s3fs", "rclone", "direct"]
#: `metfs mount` flags and pass_end mode of each metfs side.
METFS: dict[str, tuple[list[str], bool]] = {
    "metfs-rf1": (["--rf-policy", "fixed", "--rf", "1"], False),
    "metfs-score": (["--rf-policy", "score", "--rf-max", str(RF_MAX)], False),
    "metfs-bollinger": (["--rf-policy", "bollinger", "--rf-max", str(RF_MAX)], False),
    "metfs-rf4": (["--rf-policy", "fixed", "--rf", "4"], False),
    "metfs-rf4-block": (["--rf-policy", "fixed", "--rf", "4"], True),
    # Fixed rf 1, blocking: every sample read fresh, the job waits for staging
    # (benches/jobs_tier.py).
    "metfs-rf1-block": (["--rf-policy", "fixed", "--rf", "1"], True),
    # `metfs mount` without rf flags: whatever policy it uses by default (benches/jobs_tier.py).
    "metfs-default": ([], False),
}
LABELS = {
    "local": "local copy (full shuffle)",
    "metfs-rf1": "metfs fixed rf 1",
    "metfs-score": "metfs score",
    "metfs-bollinger": "metfs bollinger",
    "metfs-rf4": "metfs fixed rf 4 (the default)",
    "metfs-rf4-block": "metfs fixed rf 4, blocking",
    "metfs-rf1-block": "metfs fixed rf 1, blocking",
    "metfs-default": "metfs default policy",
    "s3fs": "s3fs",
    "rclone": "rclone VFS cache",
    "streaming": "MosaicML Streaming",
    "direct": "direct from the tier",
}


T_START = time.monotonic()


def log(msg: str) -> None:
    print(f"# [{time.monotonic() - T_START:.0f} s] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- the dataset


def make_samples(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`n` stored samples (n x 128 x 128 x 3 uint8) and their labels; deterministic per seed."""
    glyph, labels = cnn_study.glyphs(n, seed, side=SIDE)
    rng = np.random.default_rng([seed, 34])
    fg = rng.uniform(0.55, 1.0, size=(n, 1, 1, 3)).astype(np.float32)
    bg = rng.uniform(0.0, 0.45, size=(n, 1, 1, 3)).astype(np.float32)
    out = np.empty((n, *SAMPLE_SHAPE), np.uint8)
    for lo in range(0, n, 500):
        g = glyph[lo : lo + 500, ..., None].astype(np.float32) / 255.0
        img = (bg[lo : lo + 500] + g * (fg[lo : lo + 500] - bg[lo : lo + 500])) * 255.0
        img = np.repeat(np.repeat(img, UP, axis=1), UP, axis=2)
        img += rng.integers(-NOISE, NOISE + 1, size=img.shape, dtype=np.int16)
        out[lo : lo + 500] = np.clip(img, 0, 255).round()
    return out, labels


def key_of(i: int, label: int) -> str:
    return f"{label:02d}/s{i:05d}.raw"


def label_of(path: str) -> int:
    return int(os.path.basename(os.path.dirname(path)))


def pool(raw: np.ndarray) -> Any:
    """Stored samples (b x 128 x 128 x 3 uint8) as the model's input (b x 3 x 32 x 32 float)."""
    import torch

    x = torch.from_numpy(raw).permute(0, 3, 1, 2).float().div_(255.0)
    return torch.nn.functional.avg_pool2d(x, UP)


def build_dataset(
    work: Path, n: int, tier: peers.Tier, with_mds: bool, shard_mib: int, val: int, test: int
) -> list[str]:
    """Writes the training set under work/data (the local copy), uploads it to the tier as
    PREFIX/files/KEY (and as MDS shards under PREFIX/mds for Streaming), and writes the
    validation and test sets, pooled, to work/eval.npz. Returns the keys, by sample index."""
    t = time.monotonic()
    data = work / "data"
    x_all, y_all = make_samples(n, seed=0)
    log(f"dataset: {n} samples made in {time.monotonic() - t:.0f} s")
    keys: list[str] = []
    for c in range(CLASSES):
        (data / f"{c:02d}").mkdir(parents=True, exist_ok=True)
    chunk = 2_000
    for lo in range(0, n, chunk):
        x, y = x_all[lo : lo + chunk], y_all[lo : lo + chunk]
        batch = []
        for j in range(len(y)):
            k = key_of(lo + j, int(y[j]))
            b = x[j].tobytes()
            (data / k).write_bytes(b)
            keys.append(k)
            batch.append((f"{PREFIX}/files/{k}", b))
        tier.put_many(batch)
    if with_mds:
        peers.write_mds(
            tier,
            f"{PREFIX}/mds",
            {"data": "bytes", "label": "int"},
            ({"data": x_all[i].tobytes(), "label": int(y_all[i])} for i in range(n)),
            shard_mib * MIB,
            work / "mds",
        )
    del x_all
    import torch

    torch.set_num_threads(1)
    ev = {}
    for name, size, seed in (("val", val, 1), ("test", test, 2)):
        x, y = make_samples(size, seed)
        ev[f"{name}_x"] = pool(x).numpy()
        ev[f"{name}_y"] = y
    np.savez(work / "eval.npz", **ev)
    log(
        f"dataset: {n} samples of {SAMPLE_BYTES >> 10} KiB ({n * SAMPLE_BYTES / MIB:.0f} MiB) "
        f"written, uploaded{' (files and MDS shards)' if with_mds else ''} in "
        f"{time.monotonic() - t:.0f} s"
    )
    return keys


# ---------------------------------------------------------------------------- the job (child)


class Learner:
    """The CNN, its optimiser, the cosine schedule over samples, and the time in steps."""

    def __init__(self, seed: int, budget: int) -> None:
        import torch

        self.torch = torch
        torch.manual_seed(seed)
        nn = torch.nn
        c1, c2 = CHANNELS
        self.net = nn.Sequential(
            nn.Conv2d(3, c1, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(c2 * (SIDE // 4) ** 2, CLASSES),
        )
        self.opt = torch.optim.SGD(
            self.net.parameters(),
            lr=cnn_study.LR,
            momentum=cnn_study.MOMENTUM,
            weight_decay=cnn_study.WD,
        )
        self.budget = budget
        self.seen = 0
        self.step_s = 0.0

    def lr(self) -> float:
        frac = min(1.0, self.seen / self.budget)
        return cnn_study.LR * 0.5 * (1.0 + math.cos(math.pi * frac))

    def step(self, raw: list[np.ndarray], y: np.ndarray) -> tuple[float, int]:
        """One training step on a batch of stored samples; its loss and correct predictions."""
        torch = self.torch
        t = time.perf_counter()
        self.net.train()
        x = pool(np.stack(raw))
        yt = torch.from_numpy(y)
        for g in self.opt.param_groups:
            g["lr"] = self.lr()
        out = self.net(x)
        loss = torch.nn.functional.cross_entropy(out, yt)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.seen += len(y)
        correct = int((out.argmax(1) == yt).sum())
        self.step_s += time.perf_counter() - t
        return float(loss.detach()) * len(y), correct

    def accuracy(self, x: np.ndarray, y: np.ndarray) -> float:
        torch = self.torch
        self.net.eval()
        right = 0
        with torch.inference_mode():
            # Small batches: 2.5x faster than one large one for this model on one thread.
            for lo in range(0, len(y), 100):
                pred = self.net(torch.from_numpy(x[lo : lo + 100])).argmax(1).numpy()
                right += int((pred == y[lo : lo + 100]).sum())
        return right / len(y)

    def weights(self) -> dict[str, Any]:
        return {k: v.detach().clone() for k, v in self.net.state_dict().items()}


class Job:
    """One run of the job: its clock, learner, weight copies and counters."""

    def __init__(self, spec: dict) -> None:
        self.spec = spec
        self.secs = float(spec["secs"])
        self.learner = Learner(spec["seed"], spec["budget"])
        ev = np.load(spec["eval"])
        self.val = (ev["val_x"], ev["val_y"])
        self.test = (ev["test_x"], ev["test_y"])
        self.rng = np.random.default_rng(spec["seed"] + 1000)
        self.snap_secs = float(spec["snap_secs"])
        self.snaps: list[tuple[float, int, str, dict]] = []
        self.t0 = time.perf_counter()
        self.t_first: float | None = None
        self.t_end: float | None = None
        self.last_snap = 0.0
        self.grid = 0
        self.bytes = 0
        self.note = ""

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def over(self) -> bool:
        if self.t_end is None and (
            self.now() >= self.secs or self.learner.seen >= self.learner.budget
        ):
            self.t_end = self.now()
            self.snapshot("end")
        return self.t_end is not None

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self.snaps = [(0.0, 0, "start", self.learner.weights())]

    def snapshot(self, kind: str) -> None:
        t = self.now() if self.t_end is None or kind == "end" else self.t_end
        self.last_snap = t
        self.snaps.append((t, self.learner.seen, kind, self.learner.weights()))

    def train(
        self, batches: Iterator[tuple[list[np.ndarray], np.ndarray, int]]
    ) -> tuple[float, int, int]:
        """Trains on `batches` until they end or the run is over; loss sum, correct, samples."""
        loss = 0.0
        correct = n = 0
        for raw, y, nbytes in batches:
            if self.t_first is None:
                self.t_first = self.now()
            self.bytes += nbytes
            lo, c = self.learner.step(raw, y)
            loss, correct, n = loss + lo, correct + c, n + len(y)
            if self.over():
                break
            if self.learner.seen // GRID > self.grid:
                self.grid = self.learner.seen // GRID
                self.snapshot("grid")
            elif self.now() - self.last_snap >= self.snap_secs:
                self.snapshot("time")
        return loss, correct, n

    def result(self) -> dict:
        """Evaluates every weight copy on the test set (off the clock)."""
        if self.t_end is None:
            self.t_end = self.now()
            self.snapshot("end")
        curve = []
        for t, seen, kind, w in self.snaps:
            self.learner.net.load_state_dict(w)
            curve.append([round(t, 3), self.learner.accuracy(*self.test), seen, kind])
        return {
            "secs": self.t_end,
            "samples": self.learner.seen,
            "step_s": self.learner.step_s,
            "t_first": self.t_first,
            "curve": curve,
            "bytes": self.bytes,
            "note": self.note,
        }


def batches(
    items: Sequence[Any],
    fetch: Callable[[Any], bytes],
    label: Callable[[Any], int],
    stop: Callable[[], bool],
) -> Iterator[tuple[list[np.ndarray], np.ndarray, int]]:
    """The loader: THREADS threads fetch `items` in order, at most PREFETCH batches ahead;
    yields (samples, labels, bytes) per batch of BATCH until the items end or `stop()`."""

    def one(item: Any) -> np.ndarray:
        b = fetch(item)
        if len(b) != SAMPLE_BYTES:
            raise RuntimeError(f"{item}: {len(b)} bytes, expected {SAMPLE_BYTES}")
        return np.frombuffer(b, np.uint8).reshape(SAMPLE_SHAPE)

    ex = ThreadPoolExecutor(THREADS)
    pending: deque[tuple[Future, int]] = deque()
    it = iter(items)
    try:
        while True:
            while len(pending) < PREFETCH * BATCH:
                item = next(it, None)
                if item is None:
                    break
                pending.append((ex.submit(one, item), label(item)))
            if not pending or stop():
                return
            raw, ys = [], []
            while pending and len(raw) < BATCH:
                f, y = pending.popleft()
                raw.append(f.result())
                ys.append(y)
            yield raw, np.array(ys, np.int64), len(raw) * SAMPLE_BYTES
    finally:
        for f, _ in pending:
            f.cancel()
        ex.shutdown(wait=True, cancel_futures=True)


def read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def full_shuffle(
    job: Job, paths: Sequence[Any], fetch: Callable[[Any], bytes], label: Callable[[Any], int]
) -> None:
    """Epochs over every sample in a new order each (the same orders on every side)."""
    while not job.over():
        order = job.rng.permutation(len(paths))
        job.train(batches([paths[i] for i in order], fetch, label, job.over))
        if not job.over():
            job.snapshot("epoch")
    job.note = f"{job.learner.seen / len(paths):.1f} epochs"


def side_metfs(job: Job, spec: dict) -> None:
    flags, block = METFS[spec["side"]]
    validates = spec["side"] in ADAPTIVE
    tier = spec["tier"]
    args = [
        "--endpoint",
        tier["endpoint"],
        "--region",
        "garage",
        "--allow-http",
        "--budget",
        f"{spec['cache_mib']}MiB",
        "--seed",
        str(spec["seed"]),
        *flags,
    ]
    learner = job.learner

    def train_pass(paths: Sequence[str]) -> tuple[dict[str, float], int]:
        order = job.rng.permutation(len(paths))
        before = job.bytes
        loss, correct, n = job.train(
            batches([paths[i] for i in order], read_file, label_of, job.over)
        )
        metrics = {"loss": loss / max(n, 1), "accuracy": correct / max(n, 1)}
        if validates and not job.over():
            metrics["val_accuracy"] = learner.accuracy(*job.val)
        if not job.over():
            job.snapshot("pass")
        return metrics, job.bytes - before

    work = Path(spec["dir"])
    with mounted(
        spec["metfs"],
        f"s3://{tier['bucket']}/{PREFIX}/files",
        str(work),
        spec["side"],
        args,
        history=str(work / "rf-history.json"),
    ) as m:
        run = met_passes(
            m,
            "tta",
            train_pass,
            lambda: learner.budget if job.over() else learner.seen,
            learner.budget,
            block=block,
        )
    job.over()
    rfs = run.rfs
    job.note = (
        f"{run.passes} passes, {len(rfs)} mini-epochs done, mean rf "
        f"{statistics.mean(rfs) if rfs else float('nan'):.1f}, decisions "
        + ", ".join(f"{k} {v}" for k, v in sorted(run.decisions.items()))
    )
    job.spec["metfs_tier_bytes"] = run.tier_bytes
    job.spec["decisions"] = run.decisions
    job.spec["rfs"] = rfs


def side_streaming(job: Job, spec: dict) -> None:
    """MosaicML Streaming as its documentation configures it (peers.streaming_settings): its
    StreamingDataLoader yields the job's batches; an iteration of it is an epoch."""
    tier = spec["tier"]
    os.environ["S3_ENDPOINT_URL"] = tier["endpoint"]
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    settings = spec["streaming"]
    sds = peers.streaming_dataset(
        f"s3://{tier['bucket']}/{PREFIX}/mds", spec["cache"], settings, spec["seed"]
    )
    loader = peers.streaming_loader(sds, settings)
    epochs = 0

    def stream() -> Iterator[tuple[list[np.ndarray], np.ndarray, int]]:
        for b in loader:
            raw = [np.frombuffer(d, np.uint8).reshape(SAMPLE_SHAPE) for d in b["data"]]
            yield raw, b["label"].numpy().astype(np.int64), len(raw) * SAMPLE_BYTES

    while not job.over():
        job.train(stream())
        if not job.over():
            epochs += 1
            job.snapshot("epoch")
    job.note = f"{job.learner.seen / len(spec['keys']):.1f} epochs, {epochs} iterations ended"


class BatchOrder:
    """A DataLoader's batch sampler whose batches the job sets before each epoch (the indices
    are drawn in the job's process; persistent workers only fetch)."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def as_is(batch: Any) -> Any:
    return batch


def side_direct(job: Job, spec: dict, tier: SimpleNamespace) -> None:
    """boto3 GETs through a PyTorch DataLoader with worker processes (peers.DirectGets): the
    same epochs, orders and batches as full_shuffle, so it trains the local copy's batches."""
    import torch

    keys = spec["keys"]
    labels = np.array([int(k.split("/")[0]) for k in keys], np.int64)
    ds = peers.DirectGets(tier, f"{PREFIX}/files", keys)
    order = BatchOrder()
    loader = torch.utils.data.DataLoader(
        ds,
        batch_sampler=order,
        num_workers=peers.DIRECT_WORKERS,
        collate_fn=as_is,
        persistent_workers=True,
        prefetch_factor=2,
        # Linux's default, which a job started as a program gets; this run's process comes
        # from a forkserver, whose children would otherwise start workers that way too (each
        # importing boto3 anew: 17 s before the first batch in a trial).
        multiprocessing_context="fork",
    )

    def fetched(
        loader: Any, idx_batches: list[list[int]]
    ) -> Iterator[tuple[list[np.ndarray], np.ndarray, int]]:
        for idx, bodies in zip(idx_batches, loader, strict=False):
            for b in bodies:
                if len(b) != SAMPLE_BYTES:
                    raise RuntimeError(f"a GET returned {len(b)} bytes, expected {SAMPLE_BYTES}")
            raw = [np.frombuffer(b, np.uint8).reshape(SAMPLE_SHAPE) for b in bodies]
            yield raw, labels[idx], len(bodies) * SAMPLE_BYTES

    try:
        while not job.over():
            perm = job.rng.permutation(len(keys))
            order.batches = [perm[k : k + BATCH].tolist() for k in range(0, len(keys), BATCH)]
            job.train(fetched(loader, order.batches))
            if not job.over():
                job.snapshot("epoch")
    finally:
        del loader
    job.note = f"{job.learner.seen / len(keys):.1f} epochs"


def child(spec_path: str) -> None:
    """One run of one side (a process of its own, forked from a server that has imported
    torch); writes its result beside the spec and its output to the log beside it."""
    t_proc = time.perf_counter()
    spec = json.loads(Path(spec_path).read_text())
    logf = os.open(Path(spec_path).with_name("log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(logf, 1)
    os.dup2(logf, 2)
    import torch

    torch.set_num_threads(1)
    os.environ.update(spec["tier"]["env"])
    out: dict[str, Any] = {"error": None}
    job = Job(spec)

    side = spec["side"]
    tier = SimpleNamespace(**spec["tier"])
    cache, mnt = Path(spec["cache"]), Path(spec["mnt"])
    keys = spec["keys"]
    try:
        job.start()
        if side == "local":
            root = spec["data"]
            full_shuffle(job, [os.path.join(root, k) for k in keys], read_file, label_of)
        elif side in METFS:
            side_metfs(job, spec)
        elif side == "s3fs":
            with peers.s3fs_mounted(tier, f"{PREFIX}/files", cache, mnt, spec["cache_mib"]):
                full_shuffle(job, [str(mnt / k) for k in keys], read_file, label_of)
        elif side == "rclone":
            with peers.rclone_mounted(tier, f"{PREFIX}/files", cache, mnt, spec["cache_mib"]):
                full_shuffle(job, [str(mnt / k) for k in keys], read_file, label_of)
        elif side == "streaming":
            side_streaming(job, spec)
        elif side == "direct":
            side_direct(job, spec, tier)
        else:
            raise RuntimeError(f"unknown side {side}")
    except Exception:
        out["error"] = traceback.format_exc()[-1500:]
    t_eval = time.perf_counter()
    out.update(job.result())
    out["setup_s"] = job.t0 - t_proc
    out["eval_s"] = time.perf_counter() - t_eval
    for k in ("decisions", "rfs", "metfs_tier_bytes"):
        if k in spec:
            out[k] = spec[k]
    Path(spec["out"]).write_text(json.dumps(out))
    sys.stdout.flush()
    sys.stderr.flush()
    # Streaming's download threads would keep the interpreter alive.
    os._exit(0)


# ---------------------------------------------------------------------------- the runs (parent)


#: Runs are forked from a server process that has imported torch once (importing it takes
#: seconds on a busy machine); each run is still a process of its own.
FORKS = mp.get_context("forkserver")


def one(cfg: argparse.Namespace, tier: peers.Tier, side: str, seed: int, keys: list[str]) -> dict:
    base = cfg.work / f"run-{side}-s{seed}"
    shutil.rmtree(base, ignore_errors=True)
    cache, mnt = base / "cache", base / "mnt"
    cache.mkdir(parents=True)
    mnt.mkdir()
    spec = {
        "side": side,
        "seed": seed,
        "secs": cfg.secs,
        "budget": cfg.epochs * len(keys),
        "snap_secs": cfg.snap_secs,
        "eval": str(cfg.work / "eval.npz"),
        "data": str(cfg.work / "data"),
        "keys": keys,
        "cache": str(cache),
        "mnt": str(mnt),
        "dir": str(base),
        "cache_mib": cfg.cache_mib,
        "streaming": cfg.streaming,
        "metfs": cfg.metfs,
        "out": str(base / "result.json"),
        "tier": {
            "env": {k: v for k, v in tier.env.items() if k.startswith("AWS_")},
            "endpoint": tier.endpoint,
            "garage": tier.garage,
            "bucket": tier.bucket,
        },
    }
    spec_path = base / "spec.json"
    spec_path.write_text(json.dumps(spec))
    benchlib.drop_caches()
    before = tier.counted()
    t = time.monotonic()
    p = FORKS.Process(target=child, args=(str(spec_path),))
    p.start()
    p.join(cfg.secs + 600)
    if p.is_alive():
        p.kill()
        p.join()
    wall = time.monotonic() - t
    tier_bytes = tier.counted() - before
    if side == "streaming":
        # Its shared memory outlives the run's process (which ends without unwinding).
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
    try:
        row = json.loads((base / "result.json").read_text())
    except (OSError, ValueError):
        tail = (base / "log").read_text()[-1500:]
        row = {
            "error": f"child exited {p.exitcode}: {tail}",
            "curve": [],
            "secs": 0,
            "samples": 0,
            "step_s": 0,
            "t_first": None,
            "bytes": 0,
            "note": "",
        }
    row.update(
        side=side, seed=seed, tier_bytes=tier_bytes if side != "local" else 0, process_secs=wall
    )
    if not cfg.keep:
        shutil.rmtree(base, ignore_errors=True)
    acc = row["curve"][-1][1] if row["curve"] else float("nan")
    log(
        f"{side} seed {seed} ({wall:.0f} s in all, setup {row.get('setup_s', 0):.1f} s, "
        f"eval {row.get('eval_s', 0):.1f} s): {row['samples']} samples in {row['secs']:.1f} s, test accuracy "
        f"{100 * acc:.2f} %, tier {tier_bytes / MIB:.0f} MiB, steps {row['step_s']:.1f} s"
        f"{', ' + row['note'] if row['note'] else ''}{' ERROR ' + row['error'] if row['error'] else ''}"
    )
    return row


class RunsFile:
    """Every finished run, one JSON line each, so that a long benchmark can be resumed (``--runs
    FILE``): a run already in the file for the same side and seed is not run again.

    The first line is the benchmark's settings; a file written with other settings is refused
    naming what differs, and a reused run measured against another tier cap is refused too (the
    cap follows from the local copy's runs, so it changes only when they do).
    """

    #: The settings that make two runs comparable (the machine and the commit are recorded per
    #: run instead: each row carries its commit, and the report lists them).
    KEYS = (
        "samples",
        "secs",
        "epochs",
        "snap_secs",
        "val",
        "test",
        "cache_frac",
        "rate_mib",
        "ratio",
        "shard_mib",
    )

    def __init__(self, path: Path | None, cfg: argparse.Namespace) -> None:
        self.path = path
        self.settings = {k: getattr(cfg, k) for k in self.KEYS}
        self.done: dict[tuple[str, int], dict] = {}
        if path is None:
            return
        if not path.exists() or path.stat().st_size == 0:
            path.write_text(json.dumps({"settings": self.settings}) + "\n")
            return
        lines = path.read_text().splitlines()
        try:
            head = json.loads(lines[0])["settings"]
            rows = [json.loads(line) for line in lines[1:] if line.strip()]
        except (ValueError, KeyError, TypeError) as e:
            raise SystemExit(
                f"tta.py: --runs {path}: not a runs file of this benchmark: {e}"
            ) from e
        differ = [
            f"{k} {head.get(k)!r} there, {v!r} here"
            for k, v in self.settings.items()
            if head.get(k) != v
        ]
        if differ:
            raise SystemExit(
                f"tta.py: --runs {path} was written with other settings ({'; '.join(differ)}): "
                "use another file, or the same settings"
            )
        for r in rows:
            if not r.get("error"):
                self.done[(r["side"], r["seed"])] = r
        log(f"--runs {path}: {len(self.done)} finished run(s) reused")

    def run(self, key: tuple[str, int], fresh: Callable[[], dict], rate: float | None) -> dict:
        """The row of `key`: the file's where it has one, else `fresh()`'s, appended."""
        row = self.done.get(key)
        if row is not None:
            if rate is not None and row.get("rate") not in (None, rate):
                raise SystemExit(
                    f"tta.py: --runs {self.path}: {key[0]} seed {key[1]} ran against a tier cap "
                    f"of {row['rate']} B/s, this run's is {rate} (the local copy's runs changed)"
                )
            log(f"{key[0]} seed {key[1]}: reused from {self.path} (commit {row.get('commit')})")
            return row
        row = fresh()
        row.update(commit=commit(), rate=rate)
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps(row, default=str) + "\n")
        return row


def held(curve: list, t: float) -> float:
    """The accuracy a run holds at time t: its last measurement at or before t."""
    acc = curve[0][1] if curve else float("nan")
    for x, a, *_ in curve:
        if x > t + 1e-9:
            break
        acc = a
    return acc


def to_target(curve: list, target: float) -> float | None:
    for x, a, *_ in curve:
        if a >= target:
            return x
    return None


def fmt_spread(xs: list[float], scale: float = 1.0, digits: int = 1) -> str:
    if not xs:
        return "n/a"
    med = statistics.median(xs)
    if len(xs) == 1:
        return f"{med * scale:.{digits}f}"
    return f"{med * scale:.{digits}f} ({min(xs) * scale:.{digits}f}–{max(xs) * scale:.{digits}f})"


def samples_to_target(curve: list, target: float) -> int | None:
    for _, a, seen, *_ in curve:
        if a >= target:
            return seen
    return None


def same_training(run: dict, local: dict) -> float | None:
    """Largest difference of test accuracy between `run` and the local copy's run of the same
    seed at the sample counts both measured (None: no common count): 0 where the side trained
    exactly the local copy's batches."""
    at = {seen: a for _, a, seen, *_ in local["curve"] if seen > 0}
    diffs = [abs(a - at[seen]) for _, a, seen, *_ in run["curve"] if seen in at]
    return max(diffs) if diffs else None


def projected(run: dict, local: dict, target: float) -> float | None:
    """For a side that trains the local copy's batches but did not reach the target in its
    time: when it would, at the rate it consumed samples after its first batch (it reaches the
    target at the sample count where the local copy of the same seed did)."""
    k = samples_to_target(local["curve"], target)
    if k is None or not run["samples"] or run["t_first"] is None:
        return None
    rate = run["samples"] / max(run["secs"] - run["t_first"], 1e-9)
    return run["t_first"] + k / rate


def summarise(
    rows: list[dict], sides: list[str], targets: dict[int, float], secs: float, rate: float
) -> dict[str, dict]:
    """Per side over its seeds; each run is measured against its own seed's target."""
    out: dict[str, dict] = {}
    local = {r["seed"]: r for r in rows if r["side"] == "local" and not r["error"] and r["curve"]}
    for side in sides:
        rs = [
            r
            for r in rows
            if r["side"] == side and not r["error"] and r["curve"] and r["seed"] in targets
        ]
        if not rs:
            continue
        ttt = [to_target(r["curve"], targets[r["seed"]]) for r in rs]
        reached = [x for x in ttt if x is not None]
        inf = [x if x is not None else math.inf for x in ttt]
        after = [r["step_s"] / max(r["secs"] - (r["t_first"] or 0), 1e-9) for r in rs]
        proj: list[float] = []
        same: list[float] = []
        if side in SAME_AS_LOCAL:
            for r, x in zip(rs, ttt, strict=True):
                lo = local.get(r["seed"])
                if lo is None:
                    continue
                d = same_training(r, lo)
                if d is not None:
                    same.append(d)
                p = x if x is not None else projected(r, lo, targets[r["seed"]])
                proj.append(math.inf if p is None else p)
        out[side] = {
            "n": len(rs),
            "ttt": statistics.median(inf),
            "ttt_runs": ttt,
            "reached": len(reached),
            # Measured where reached, else projected from the rate (sides in SAME_AS_LOCAL).
            "ttt_proj": statistics.median(proj) if len(proj) == len(rs) else None,
            "proj_runs": proj,
            "same_diff": max(same) if same else None,
            "step_ms": [1000 * r["step_s"] / max(r["samples"], 1) for r in rs],
            # Every run ends at the time budget or at the sample budget, whichever comes first:
            # what it holds at the time budget is its last measurement.
            "acc": [r["curve"][-1][1] for r in rs],
            "tier": [r["tier_bytes"] for r in rs],
            # What the side read from the tier per second of its run, against the cap.
            "cap": [r["tier_bytes"] / max(r["secs"], 1e-9) / rate for r in rs],
            "frac": [r["step_s"] / max(r["secs"], 1e-9) for r in rs],
            "frac_after": after,
            "samples": [r["samples"] for r in rs],
            "sps": [r["samples"] / max(r["secs"], 1e-9) for r in rs],
            "note": rs[0]["note"],
        }
    return out


def table(
    summary: dict[str, dict],
    sides: list[str],
    rows: list[dict],
    dataset_bytes: int,
    secs: float,
    skipped: dict[str, str],
) -> str:
    local = summary.get("local", {}).get("ttt")
    out = [
        "| side | time to target, s | vs local copy | test accuracy at "
        f"{secs:g} s, % | tier bytes / dataset | tier read / cap | training steps / wall "
        "| after first batch | step, ms per sample | samples consumed | samples/s "
        "| runs' time to target, s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for side in sides:
        s = summary.get(side)
        if s is None:
            errs = [
                r["error"].strip().splitlines()[-1]
                for r in rows
                if r["side"] == side and r["error"]
            ]
            out.append(
                f"| {LABELS[side]} | n/a | | | | | | | | | | {errs[0] if errs else 'not run'} |"
            )
            continue
        if math.isinf(s["ttt"]):
            ttt = f"> {secs:g} ({s['reached']} of {s['n']} reached)"
            vs = ""
            p = s["ttt_proj"]
            if p is not None and not math.isinf(p):
                ttt += f"; projected {p:.0f}"
                vs = f"~{p / local:.1f}x" if local and not math.isinf(local) else ""
        else:
            ttt = f"{s['ttt']:.1f}"
            vs = f"{s['ttt'] / local:.2f}x" if local and not math.isinf(local) else ""
        runs = " ".join("–" if x is None else f"{x:.1f}" for x in s["ttt_runs"])
        if s["proj_runs"] and s["reached"] < s["n"]:
            runs += " (projected " + " ".join(f"{x:.0f}" for x in s["proj_runs"]) + ")"
        tier = [b / dataset_bytes for b in s["tier"]]
        cap = "" if side == "local" else f"{fmt_spread(s['cap'], 100, 0)} %"
        out.append(
            f"| {LABELS[side]} | {ttt} | {vs} | {fmt_spread(s['acc'], 100, 2)} | "
            f"{fmt_spread(tier, 1, 2)} | {cap} | {fmt_spread(s['frac'], 100, 0)} % | "
            f"{fmt_spread(s['frac_after'], 100, 0)} % | {statistics.median(s['step_ms']):.2f} | "
            f"{statistics.median(s['samples']):,.0f} | {statistics.median(s['sps']):,.0f} | "
            f"{runs} |"
        )
    for side, why in skipped.items():
        out.append(f"| {LABELS[side]} | skipped | | | | | | | | | | {why} (--allow-missing) |")
    return "\n".join(out)


def goals(summary: dict[str, dict], secs: float) -> list[str]:
    """Issue 52's goals, each said met or not, with the numbers it was read on. The side judged
    is `metfs mount`'s default (DEFAULT_SIDE: issue 51 kept fixed rf 4, non-blocking, as the
    default); the best metfs side is named beside it where another one is faster."""
    out = []
    peer = [p for p in PEERS if p in summary]
    if DEFAULT_SIDE not in summary or not peer or "local" not in summary:
        return ["goals: not judged (a side is missing)"]
    best_m = DEFAULT_SIDE
    tm = summary[best_m]["ttt"]
    mine = [m for m in METFS if m in summary]
    fastest = min(mine, key=lambda a: summary[a]["ttt"])
    if summary[fastest]["ttt"] < tm:
        out.append(
            f"fastest metfs side: {LABELS[fastest]} ({summary[fastest]['ttt']:.1f} s to target, "
            f"median); the goals are judged on the default, {LABELS[DEFAULT_SIDE]}"
        )
    best_p = min(peer, key=lambda p: summary[p]["ttt"])
    tp = summary[best_p]["ttt"]
    tl = summary["local"]["ttt"]
    if math.isinf(tm):
        out.append(
            f"time to target: {LABELS[best_m]} did not reach its seeds' targets (median): goals "
            "(<= 0.5x the best peer, <= 1.3x the local copy) NOT met"
        )
    else:
        if math.isinf(tp):
            proj = {p: summary[p]["ttt_proj"] for p in peer if summary[p]["ttt_proj"] is not None}
            line = (
                f"time to target, {LABELS[best_m]} {tm:.1f} s; no peer reached its targets "
                f"(median) within {secs:g} s: the best peer's time is NOT measured (rerun with a "
                f"longer --secs); against the budget the ratio is below {tm / secs:.2f}x"
            )
            if proj:
                bp = min(proj, key=lambda p: proj[p])
                line += (
                    f"; against the best peer's projection ({LABELS[bp]}, {proj[bp]:.0f} s) "
                    f"{tm / proj[bp]:.2f}x"
                )
            out.append(line)
        else:
            out.append(
                f"time to target, {LABELS[best_m]} {tm:.1f} s against the best peer "
                f"({LABELS[best_p]}) {tp:.1f} s, measured: {tm / max(tp, 1e-9):.2f}x, goal "
                f"<= 0.5x {'met' if tm <= 0.5 * tp else 'NOT met'}"
            )
        if math.isinf(tl):
            out.append("time to target against the local copy: the local copy's median missed it")
        else:
            out.append(
                f"time to target, {LABELS[best_m]} {tm:.1f} s against the local copy {tl:.1f} s: "
                f"{tm / max(tl, 1e-9):.2f}x, goal <= 1.3x {'met' if tm <= 1.3 * tl else 'NOT met'}"
            )
    for m in [s for s in METFS if s in summary]:
        f = statistics.median(summary[m]["frac_after"])
        goal = "" if METFS[m][1] else f", goal >= 90 % {'met' if f >= 0.9 else 'NOT met'}"
        out.append(
            f"{LABELS[m]}: {100 * f:.0f} % of wall time in training steps once the first "
            f"mini-epoch is staged{goal}"
        )
    for p in peer:
        f = statistics.median(summary[p]["frac_after"])
        c = statistics.median(summary[p]["cap"])
        why = ""
        if c < 0.8:
            why = (
                f": it trains faster than it reads (steps take {100 * f:.0f} % of its wall time)"
                if f < 0.5
                else ": its training steps, not the tier, held it back"
            )
        out.append(
            f"{LABELS[p]}: read the tier at {100 * c:.0f} % of the cap, goal >= 80 % "
            f"{'met' if c >= 0.8 else 'NOT met' + why}; {100 * f:.0f} % of wall time in "
            "training steps after its first batch"
        )
    for p in SAME_AS_LOCAL:
        d = summary.get(p, {}).get("same_diff")
        if d is not None:
            out.append(
                f"{LABELS[p]} trains the local copy's batches: largest difference of test accuracy "
                f"at the sample counts both measured {100 * d:.2f} points"
            )
    best_pa = max(peer, key=lambda p: statistics.median(summary[p]["acc"]))
    pa = statistics.median(summary[best_pa]["acc"])
    for m in [s for s in METFS if s in summary]:
        a = statistics.median(summary[m]["acc"])
        out.append(
            f"accuracy at {secs:g} s, {LABELS[m]} {100 * a:.2f} % against the best peer "
            f"({LABELS[best_pa]}) {100 * pa:.2f} %: goal (not below) {'met' if a >= pa else 'NOT met'}"
        )
    return out


def curves(
    summary_rows: list[dict], sides: list[str], target: float, secs: float, step: float
) -> dict:
    """Median accuracy of each side's seeds at every `step` seconds: `metfs plot`'s input."""
    series = []
    # Runs end a step after the budget at most: the last point is the run's end.
    grid = [round(i * step, 3) for i in range(int(secs / step) + 2)]
    for side in sides:
        rs = [r for r in summary_rows if r["side"] == side and not r["error"] and r["curve"]]
        if not rs:
            continue
        pts = [
            [t, round(100 * statistics.median(held(r["curve"], t) for r in rs), 3)] for t in grid
        ]
        series.append({"name": LABELS[side], "points": pts})
    return {
        "title": f"Test accuracy against wall time (median of {len({r['seed'] for r in summary_rows})} seeds)",
        "x_label": "wall time, s",
        "y_label": "test accuracy, %",
        "series": series,
        "hlines": [
            {"y": round(100 * target, 3), "label": f"target {100 * target:.2f} % (seeds' median)"}
        ],
    }


def plot(cfg: argparse.Namespace, doc: dict) -> str:
    if not cfg.png and not cfg.curves:
        return "curves: not written (neither --curves nor --png)"
    path = cfg.curves or cfg.work / "curves.json"
    Path(path).write_text(json.dumps(doc, indent=1))
    if not cfg.png:
        return f"curves: {path} (no --png asked)"
    probe = subprocess.run(
        [cfg.metfs, "plot", "--help"], capture_output=True, text=True, check=False
    )
    if probe.returncode != 0:
        return f"PNG not drawn: {cfg.metfs} has no `plot` subcommand (curves in {path})"
    r = subprocess.run(
        [cfg.metfs, "plot", str(path), str(cfg.png)], capture_output=True, text=True, check=False
    )
    if r.returncode != 0:
        return f"PNG not drawn: metfs plot failed: {r.stderr.strip()[-500:]}"
    return f"PNG: {cfg.png} (curves {path})"


def shm_or_tmp() -> str | None:
    """/dev/shm where it exists (the tier's objects, the local copy and every side's cache in
    memory: a busy shared disk would otherwise be what is measured), else the default."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def describe(side: str, cfg: argparse.Namespace, n: int) -> str:
    """How `side` is configured, and per whose documentation."""
    if side == "local":
        return f"the job's loader ({THREADS} threads) over a local copy of the whole dataset"
    if side in METFS:
        flags, block = METFS[side]
        return (
            f"metfs mount --budget {cfg.cache_mib}MiB {' '.join(flags)}; pass_end "
            + (
                "block=true (the job waits for staging)"
                if block
                else "non-blocking (a `wait` answer gives a bonus pass over the current "
                "mini-epoch; at rf 1 the job advances as soon as the next one is staged)"
            )
            + (", with loss, accuracy and val_accuracy" if side in ADAPTIVE else "")
        )
    if side == "streaming":
        return peers.streaming_settings(cfg.cache_mib, SAMPLE_BYTES, cfg.shard_mib, n)["desc"]
    if side == "direct":
        return peers.DIRECT_DESC + f"; a torch DataLoader, batches of {BATCH}"
    pc = SimpleNamespace(cache_mib=cfg.cache_mib)
    return peers.describe(side, pc) + f"; read by the job's loader ({THREADS} threads)"


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help="1,500 samples, 1 seed, 3 s per run, local + every metfs side + direct",
    )
    ap.add_argument("--samples", type=int, default=20_000)
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--sides", default=",".join(SIDES))
    ap.add_argument(
        "--secs",
        type=float,
        default=240,
        help="wall-time budget of every run: long enough for the best peer to reach the "
        "target measured (about 120-140 s at the cap) and to finish its schedule",
    )
    ap.add_argument(
        "--epochs",
        type=float,
        default=5,
        help="sample budget (and cosine schedule length) in training sets",
    )
    ap.add_argument("--snap-secs", type=float, default=2, help="weights copied at least this often")
    ap.add_argument(
        "--val", type=int, default=500, help="validation samples (the adaptive policies')"
    )
    ap.add_argument("--test", type=int, default=2_500, help="test samples (the reported accuracy)")
    ap.add_argument(
        "--cache-frac", type=float, default=1 / 3, help="cache budget, a fraction of the dataset"
    )
    ap.add_argument(
        "--rate-mib",
        default="auto",
        help="tier cap in MiB/s, or auto: a tier epoch takes --ratio times the local copy's",
    )
    ap.add_argument("--ratio", type=float, default=4)
    ap.add_argument(
        "--shard-mib",
        type=int,
        default=4,
        help="MDS shard size for Streaming (4-8 MiB: many shards per shuffle block)",
    )
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--no-install", action="store_true", help="do not install missing peers")
    ap.add_argument(
        "--allow-missing",
        action="store_true",
        help="a side that cannot run is skipped and said so in the table (default: stop)",
    )
    ap.add_argument(
        "--allow-slow-tier",
        action="store_true",
        help="go on when the tier cannot hold its cap on this machine (default: stop)",
    )
    ap.add_argument("--json", type=Path, help="write every run's numbers here")
    ap.add_argument(
        "--runs",
        type=Path,
        help="append every finished run here (JSON lines) and reuse the runs already there: "
        "a long benchmark resumed where it stopped",
    )
    ap.add_argument("--curves", type=Path, help="write the curves (metfs plot's input) here")
    ap.add_argument("--png", type=Path, help="draw the curves here with metfs plot")
    cfg = ap.parse_args()
    if cfg.quick:
        # 8 s a side: each side's clock includes its start (a mount and its first mini-epoch),
        # which took more than 3 s on a loaded machine, leaving a side no batch to count.
        cfg.samples, cfg.seeds, cfg.secs, cfg.epochs, cfg.snap_secs = 1_500, "0", 8, 3, 1
        cfg.val, cfg.test = 200, 500
        cfg.allow_slow_tier = True
        if cfg.sides == ",".join(SIDES):
            cfg.sides = (
                "local,metfs-rf1,metfs-score,metfs-bollinger,metfs-rf4,metfs-rf4-block,direct"
            )
    if os.geteuid() != 0:
        raise SystemExit("tta.py: needs root (FUSE mounts, a tmpfs for s3fs, dropping caches)")
    sides = [s for s in cfg.sides.split(",") if s]
    for s in sides:
        if s not in SIDES:
            raise SystemExit(f"tta.py: --sides: unknown side `{s}` (known: {', '.join(SIDES)})")
    if "local" not in sides:
        raise SystemExit("tta.py: --sides must include local (it fixes the targets)")
    seeds = [int(s) for s in cfg.seeds.split(",")]
    runs = RunsFile(cfg.runs, cfg)
    # The optimiser imports torch._dynamo on first use: another 3 s.
    FORKS.set_forkserver_preload(["__main__", "torch", "torch._dynamo"])
    benchlib.build()
    cfg.metfs = str(benchlib.metfs_bin())
    skipped = {}
    for s in list(sides):
        tool = "metfs" if s.startswith("metfs") else s
        why = None if s == "local" else peers.available(tool, cfg)
        if why:
            if not cfg.allow_missing:
                raise SystemExit(f"tta.py: side {s} cannot run: {why} (--allow-missing skips it)")
            skipped[s] = why
            sides.remove(s)
            log(f"skipping {s}: {why}")
    dataset_bytes = cfg.samples * SAMPLE_BYTES
    cfg.cache_mib = int(dataset_bytes * cfg.cache_frac) // MIB
    cfg.work = Path(
        os.environ.get("TTA_WORK") or tempfile.mkdtemp(prefix="metfs-tta.", dir=shm_or_tmp())
    )
    cfg.work.mkdir(parents=True, exist_ok=True)
    cfg.streaming = peers.streaming_settings(
        cfg.cache_mib, SAMPLE_BYTES, cfg.shard_mib, cfg.samples, BATCH
    )
    t_start = time.monotonic()
    auto = cfg.rate_mib == "auto"
    tier = peers.Tier(cfg.work, int((1000 if auto else float(cfg.rate_mib)) * MIB))
    rows: list[dict] = []
    out: list[str] = []
    try:
        keys = build_dataset(
            cfg.work, cfg.samples, tier, "streaming" in sides, cfg.shard_mib, cfg.val, cfg.test
        )
        for seed in seeds:
            rows.append(
                runs.run(
                    ("local", seed), lambda seed=seed: one(cfg, tier, "local", seed, keys), None
                )
            )
        local = {r["seed"]: r for r in rows if r["side"] == "local"}
        budget = cfg.epochs * cfg.samples
        for seed, r in local.items():
            if r["error"] or not r["curve"]:
                raise SystemExit(f"tta.py: the local copy of seed {seed} failed: {r['error']}")
            if r["samples"] < budget and not cfg.quick:
                raise SystemExit(
                    f"tta.py: the local copy of seed {seed} ran out of time ({r['samples']:,} of "
                    f"{budget:,.0f} samples in {cfg.secs:g} s): its final accuracy is not a "
                    "finished schedule's, so no target is fixed; raise --secs"
                )
        # Each seed's target: its local copy's final test accuracy minus one point (the local
        # copy reaches it by construction; the other sides of that seed are held to it).
        targets = {seed: r["curve"][-1][1] - 0.01 for seed, r in local.items()}
        target = statistics.median(targets.values())
        # The training's own speed: the local copy's samples per second of wall time after its
        # first batch (its reads come from the page cache after the first epoch).
        sps = statistics.median(
            r["samples"] / (r["secs"] - (r["t_first"] or 0)) for r in local.values()
        )
        compute_epoch = cfg.samples / sps
        if auto:
            tier.start_proxy(int(dataset_bytes / (cfg.ratio * compute_epoch)))
        checked, _ = peers.check_cap(
            tier,
            f"{PREFIX}/files",
            keys,
            SAMPLE_BYTES,
            cfg.allow_slow_tier,
            secs=1.5 if cfg.quick else 4.0,
        )
        tier_epoch = dataset_bytes / tier.rate
        head = (
            "Target accuracy per seed (its local copy's final test accuracy minus one point), "
            "fixed before the other runs: "
            + ", ".join(f"seed {k} {100 * v:.2f} %" for k, v in sorted(targets.items()))
            + f" (median {100 * target:.2f} %).\n"
            f"Compute: the local copy trains {sps:,.0f} samples/s, an epoch in {compute_epoch:.1f} s; "
            f"tier capped at {tier.rate / MIB:.1f} MiB/s: a full-shuffle epoch from the tier takes "
            f"{tier_epoch:.1f} s, {tier_epoch / compute_epoch:.1f}x the epoch's compute.\n{checked}."
        )
        print(head, flush=True)
        others = [s for s in sides if s != "local"]
        for k, seed in enumerate(seeds):
            j = k % max(len(others), 1)
            for side in others[j:] + others[:j]:
                run = lambda side=side, seed=seed: one(cfg, tier, side, seed, keys)  # noqa: E731
                rows.append(runs.run((side, seed), run, tier.rate))
        summary = summarise(rows, sides, targets, cfg.secs, tier.rate)
        out = [
            head,
            "",
            f"Dataset: {cfg.samples:,} samples of {SAMPLE_BYTES >> 10} KiB ({dataset_bytes / MIB:.0f} MiB); "
            f"cache budget {cfg.cache_mib} MiB ({cfg.cache_frac:.2f} of it) for every side; "
            f"{len(seeds)} seed(s) {seeds}; time budget {cfg.secs:g} s per run; sample budget "
            f"{cfg.epochs:g} epochs; medians (min–max); report made at commit {commit()}.",
            "",
            table(summary, sides, rows, dataset_bytes, cfg.secs, skipped),
            "",
            "Commit each side ran at: "
            + "; ".join(
                f"{LABELS[s]} {', '.join(sorted({str(r.get('commit')) for r in rows if r['side'] == s}))}"
                for s in sides
            )
            + ".",
            "",
            "Configuration of each side:",
        ]
        out += [f"* {LABELS[s]}: {describe(s, cfg, cfg.samples)}" for s in sides]
        out.append("")
        out += goals(summary, cfg.secs)
        for s, why in skipped.items():
            out.append(f"skipped {s}: {why}")
        out.append(plot(cfg, curves(rows, sides, target, cfg.secs, cfg.snap_secs / 2)))
        out.append(f"total {time.monotonic() - t_start:.0f} s")
        print("\n".join(out), flush=True)
        if cfg.json:
            cfg.json.write_text(
                json.dumps(
                    {
                        "rows": rows,
                        "skipped": skipped,
                        "target": target,
                        "targets": targets,
                        "sides": sides,
                        "cache_mib": cfg.cache_mib,
                        "rate": tier.rate,
                        "compute_epoch": compute_epoch,
                        "dataset_bytes": dataset_bytes,
                        "summary": summary,
                        "report": out,
                    },
                    indent=1,
                    default=str,
                )
            )
    finally:
        log("stopping the tier")
        tier.stop()
        log("removing the work directory")
        if not cfg.keep:
            shutil.rmtree(cfg.work, ignore_errors=True)
        log("done")
    sys.stdout.flush()
    os._exit(0)


def commit() -> str:
    r = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return r.stdout.strip() or "unknown"


if __name__ == "__main__":
    main()
