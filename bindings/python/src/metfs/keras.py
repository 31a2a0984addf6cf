"""Keras 3 integration: one Keras epoch is one pass over the current mini-epoch.

::

    import keras, metfs
    from metfs.keras import MetCallback, MetSequence

    client = metfs.Client("/nvme/cache/metfs.sock", job="digits")
    train = MetSequence(client, load_sample, batch_size=32)   # load_sample(path) -> (x, y)
    met = MetCallback(client, epochs=2, datasets=[train])
    model.fit(train, epochs=10_000, validation_data=(x_val, y_val), callbacks=[met])

:class:`MetCallback` sends each Keras epoch's ``logs`` (``loss``, ``accuracy``, ``val_*``...) to
the daemon with ``pass_end`` and stops training once ``epochs`` MET epochs are done, so pass
``fit`` an ``epochs`` larger than any run needs. :class:`MetSequence` re-reads the view's files
at the start of every pass and loads them with your function.

Keras fixes the number of steps per epoch when ``fit`` starts, while mini-epochs differ in their
number of files; :class:`MetSequence` therefore keeps the number of batches it had at the start
(or ``steps``) and spreads each view's files evenly over them, so every file of the view is used
exactly once per pass and batch sizes vary a little around ``batch_size``.

``MetSequence(..., direct=True)`` (or ``MetCallback(..., direct=True)``, or a client made with
``direct=True``) gives your function the staged copies of the view's files in the cache instead
of the mount's paths, read without FUSE, under the client's lease on the view
(:meth:`metfs.Client.files`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np
import numpy.typing as npt

from .batchsize import AdjustBs
from .client import Client, FilesView, metrics_to_floats
from .coordinator import Coordinator, default_coordinator
from .loop import release_left_view
from .signals import FRESH_BATCHES, FreshLoss, PassSignals
from .tracker import PassTracker, TracksPasses

__all__ = ["MetCallback", "MetSequence", "default_collate"]


def default_collate(samples: list[Any]) -> Any:
    """Stacks per-sample outputs into a batch.

    Samples that are tuples (``(x, y)`` or ``(x, y, w)``) are stacked field by field; dicts key
    by key; arrays are stacked into one array.
    """
    first = samples[0]
    if isinstance(first, tuple):
        return tuple(np.stack([s[i] for s in samples]) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: np.stack([s[k] for s in samples]) for k in first}
    return np.stack(samples)


class MetSequence(keras.utils.PyDataset):
    """A ``keras.utils.PyDataset`` over the current view of a metfs mount.

    ``loader(path)`` turns one file (absolute path) into one sample, e.g. ``(x, y)``;
    ``collate`` turns a list of samples into a batch (default :func:`default_collate`).
    The file list is re-read at the start of every pass (Keras epoch) and shuffled (``shuffle``,
    ``seed``). ``steps`` fixes the number of batches per pass; by default it is
    ``ceil(files / batch_size)`` of the view shown at construction. Further keyword arguments
    (``workers``, ``use_multiprocessing``, ``max_queue_size``) go to ``PyDataset``; with more
    than one worker, give this dataset to :class:`MetCallback` (``datasets=[...]``) so that it
    is refreshed before the workers start.

    ``direct=True`` gives ``loader`` the view's direct paths (the copies in the cache, read
    without FUSE) under the client's lease, which each refresh moves to the view it reads;
    ``None`` follows the client (``Client(direct=...)``, which ``MetCallback(direct=...)``
    sets), ``False`` gives the mount's paths.
    """

    def __init__(
        self,
        client: Client,
        loader: Callable[[str], Any],
        batch_size: int = 32,
        *,
        shuffle: bool = True,
        seed: int | None = None,
        collate: Callable[[list[Any]], Any] = default_collate,
        steps: int | None = None,
        direct: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.client = client
        self.loader = loader
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.collate = collate
        self._rng = np.random.default_rng(seed)
        self._refreshed = False
        self.direct = direct
        self.view: FilesView = client.files(direct=direct)
        if steps is None:
            steps = max(1, math.ceil(len(self.view) / batch_size))
        if steps < 1:
            raise ValueError(f"steps must be at least 1, got {steps}")
        self.steps = steps
        #: Generations of the views this dataset served, one entry per refresh.
        self.generations: list[int] = []
        self._batches: list[npt.NDArray[Any]] = []
        self._split()

    def _split(self) -> None:
        n = len(self.view)
        if n == 0:
            raise RuntimeError(
                f"the metfs view at {self.view.mountpoint} (generation "
                f"{self.view.generation}) has no files"
            )
        order = self._rng.permutation(n) if self.shuffle else np.arange(n)
        if n < self.steps:
            # Fewer files than steps: wrap around so that no batch is empty.
            order = np.resize(order, self.steps)
        self._batches = np.array_split(order, self.steps)
        self.generations.append(self.view.generation)

    def refresh(self) -> FilesView:
        """Brings the view's files up to date (the list crosses the socket only when the
        generation changed) and re-shuffles them."""
        self.view = self.client.files(self.view, direct=self.direct)
        self._split()
        self._refreshed = True
        return self.view

    @property
    def num_batches(self) -> int:
        return self.steps

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, index: int) -> Any:
        if not 0 <= index < self.steps:
            raise IndexError(f"batch {index} out of range 0..{self.steps - 1}")
        paths = self.view.paths
        return self.collate([self.loader(paths[j]) for j in self._batches[index]])

    def on_epoch_begin(self) -> None:
        if not self._refreshed:
            self.refresh()

    def on_epoch_end(self) -> None:
        self._refreshed = False

    def __getstate__(self) -> dict[str, Any]:
        # Worker processes only load files; the socket stays in the parent.
        state = self.__dict__.copy()
        state["client"] = None
        return state


class MetCallback(keras.callbacks.Callback, TracksPasses):
    """Reports each Keras epoch (one pass) to metfs and stops after ``epochs`` MET epochs.

    ``metrics`` selects which ``logs`` entries to send (default: all of them). ``block`` asks the
    daemon to wait for staging instead of answering ``wait``. ``datasets`` are
    :class:`MetSequence` objects to refresh at the start of each pass. ``coordinator`` decides
    across ranks (default: the local daemon, or rank 0 under ``torch.distributed``).
    ``adjust_bs`` (:class:`metfs.batchsize.AdjustBs`) sizes each rank's batch under ADJUST_BS, read
    with :meth:`local_batch_size` and changed by all ranks together at a pass's end.

    ``direct`` (when a bool) sets ``client.direct`` when training begins, so the
    :class:`MetSequence` objects over this client that leave their own ``direct`` at ``None``
    read the view's direct paths (the copies in the cache, without FUSE, under the client's
    lease: :meth:`metfs.Client.files`) or the mount's. When training ends after an advance, a
    lease still held on the view left is released.

    With every pass go the run's progress (MET epochs of ``epochs``) and, after a mini-epoch's
    first pass, its fresh-data loss: Keras's running mean of the training loss over the first
    ``fresh_batches`` batches, each computed before the step that trained on it
    (:mod:`metfs.signals`). Send ``val_loss`` (``validation_data``) for the held-out measure
    per pass that ``--rf-policy paced`` prefers.

    After training, ``decisions`` holds the decision after each pass and ``done`` says whether
    the requested MET epochs were completed.
    """

    def __init__(
        self,
        client: Client,
        epochs: int = 1,
        *,
        metrics: Sequence[str] | None = None,
        block: bool = False,
        datasets: Sequence[MetSequence] = (),
        coordinator: Coordinator | None = None,
        adjust_bs: AdjustBs | None = None,
        verbose: int = 0,
        direct: bool | None = None,
        fresh_batches: int = FRESH_BATCHES,
    ) -> None:
        super().__init__()
        self.fresh_batches = FreshLoss(fresh_batches).batches  # checks it
        self._fresh = False
        self._fresh_loss: float | None = None
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
            raise ValueError(f"epochs must be a positive int, got {epochs!r}")
        #: The pass-tracking state: target epoch, decisions, generations, done.
        self.tracker = PassTracker(epochs)
        self.client = client
        self.metrics = list(metrics) if metrics is not None else None
        self.block = block
        self.datasets = list(datasets)
        self.coordinator = coordinator
        self.adjust_bs = adjust_bs
        self.verbose = verbose
        self.direct = direct

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self.direct is not None:
            self.client.direct = self.direct
        if self.coordinator is None:
            self.coordinator = default_coordinator()
        self.tracker.start(self.coordinator.start(self.client))
        if self.adjust_bs is not None:
            self.adjust_bs.start(self.coordinator, self.client)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        for ds in self.datasets:
            ds.refresh()
        self._fresh = self.tracker.fresh
        self._fresh_loss = None

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        # Keras's batch logs hold the running mean of the loss since the pass began, each
        # batch's loss computed before its step: over the first batches of a first pass, the
        # fresh-data loss.
        if self._fresh and batch < self.fresh_batches and logs and "loss" in logs:
            value = float(logs["loss"])
            if math.isfinite(value):
                self._fresh_loss = value

    def _select(self, logs: dict[str, Any] | None) -> dict[str, float]:
        logs = dict(logs or {})
        if self.metrics is not None:
            missing = [m for m in self.metrics if m not in logs]
            if missing:
                raise KeyError(
                    f"metrics {missing} are not in this epoch's logs (have {sorted(logs)})"
                )
            logs = {m: logs[m] for m in self.metrics}
        return metrics_to_floats(logs)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        assert self.coordinator is not None
        signals = PassSignals(
            progress=self.tracker.progress(),
            fresh_loss=self._fresh_loss if self._fresh else None,
        )
        decision = self.coordinator.pass_end(self.client, self._select(logs), self.block, signals)
        if self.adjust_bs is not None:
            self.adjust_bs.boundary(self.coordinator)
        done = self.tracker.record(decision)
        if self.verbose and self.coordinator.is_leader:
            print(
                f"metfs: pass {len(self.decisions)} -> {decision.decision} "
                f"(epoch {decision.epoch}, mini-epoch {decision.mini_epoch}, "
                f"generation {decision.generation})"
            )
        if done:
            self.model.stop_training = True

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self.decisions:
            release_left_view(self.client, self.decisions[-1].generation)
        message = self.tracker.unfinished("give fit() a larger epochs=")
        if message is not None:
            warnings.warn(message, RuntimeWarning, stacklevel=2)
