"""Lightning integration: one Lightning training epoch is one pass over the current mini-epoch.

::

    import lightning as L, metfs
    from metfs.lightning import MetCallback
    from metfs.torch import MetDataset, met_loader

    client = metfs.Client(job="digits")
    ds = MetDataset(client, load_sample)

    class Model(L.LightningModule):
        ...
        def train_dataloader(self):
            return met_loader(ds, batch_size=32)     # rebuilt every epoch: follows the view

    trainer = L.Trainer(max_epochs=-1, callbacks=[MetCallback(client, epochs=2)])
    trainer.fit(Model())

:class:`MetCallback` reports ``trainer.callback_metrics`` with ``pass_end`` at the end of every
training epoch and sets ``trainer.should_stop`` once ``epochs`` MET epochs are done. It sets the
trainer's ``reload_dataloaders_every_n_epochs`` to 1, so that ``train_dataloader()`` is called
again, and counts the files of the new view, after every pass. Give the trainer a ``max_epochs``
larger than any run needs (``-1``: unbounded).

``MetCallback(client, direct=True)`` (or ``MetDataset(client, load_sample, direct=True)``)
hands the loader's workers the staged copies of the view's files in the cache, read without
FUSE, under the client's lease on the view (:meth:`metfs.Client.files`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

try:
    import lightning.pytorch as pl
except ImportError:  # pragma: no cover - the older package name
    import pytorch_lightning as pl

from .batchsize import AdjustBs
from .client import Client, metrics_to_floats
from .coordinator import Coordinator, default_coordinator
from .loop import release_left_view
from .signals import FRESH_BATCHES, FreshLoss, PassSignals
from .tracker import PassTracker, TracksPasses

__all__ = ["MetCallback"]


class MetCallback(pl.Callback, TracksPasses):
    """Reports each Lightning training epoch (one pass) to metfs; stops after ``epochs``.

    ``metrics`` selects which ``trainer.callback_metrics`` to send (default: all). ``block``
    asks the daemon to wait for staging instead of answering ``wait``. ``coordinator`` decides
    across ranks (default: the local daemon, or rank 0 under ``torch.distributed``, which
    Lightning's DDP strategies initialise).
    ``adjust_bs`` (:class:`metfs.batchsize.AdjustBs`) sizes each rank's batch under ADJUST_BS, read
    with :meth:`local_batch_size` and changed by all ranks together at a pass's end.

    ``direct`` (when a bool) sets ``client.direct`` when ``fit`` sets up, before the train
    dataloader is built, so the ``MetDataset`` objects over this client that leave their own
    ``direct`` at ``None`` (and their :class:`metfs.torch.MetSampler`) hand the workers the
    view's direct paths (the copies in the cache, without FUSE, under the client's lease:
    :meth:`metfs.Client.files`) or the mount's. When training ends after an advance, a lease
    still held on the view left is released.

    With every pass go the run's progress (MET epochs of ``epochs``) and, after a mini-epoch's
    first pass, its fresh-data loss: the mean of the losses ``training_step`` returned for its
    first ``fresh_batches`` batches, each computed before the step that trained on it
    (:mod:`metfs.signals`).

    After training, ``decisions`` holds the decision after each pass, ``generations`` the
    generation after each pass, and ``done`` whether the requested MET epochs were completed.
    """

    def __init__(
        self,
        client: Client,
        epochs: int = 1,
        *,
        metrics: Sequence[str] | None = None,
        block: bool = False,
        coordinator: Coordinator | None = None,
        adjust_bs: AdjustBs | None = None,
        direct: bool | None = None,
        fresh_batches: int = FRESH_BATCHES,
    ) -> None:
        super().__init__()
        self.fresh = FreshLoss(fresh_batches)
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
            raise ValueError(f"epochs must be a positive int, got {epochs!r}")
        #: The pass-tracking state: target epoch, decisions, generations, done.
        self.tracker = PassTracker(epochs)
        self.client = client
        self.metrics = list(metrics) if metrics is not None else None
        self.block = block
        self.coordinator = coordinator
        self.adjust_bs = adjust_bs
        self.direct = direct

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # A plain attribute the Trainer's data connector sets in __init__; a new view (other
        # files, another count) needs a new loader every pass.
        every = getattr(trainer, "reload_dataloaders_every_n_epochs", 0)
        if stage == "fit" and every != 1:
            trainer.reload_dataloaders_every_n_epochs = 1
        if stage == "fit" and self.direct is not None:
            self.client.direct = self.direct

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.coordinator is None:
            self.coordinator = default_coordinator()
        self.tracker.start(self.coordinator.start(self.client))
        if self.adjust_bs is not None:
            self.adjust_bs.start(self.coordinator, self.client)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.fresh.begin(self.tracker.fresh)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if not self.fresh.wants:
            return
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if loss is not None:
            self.fresh.add(loss.detach() if hasattr(loss, "detach") else loss)

    def _select(self, trainer: pl.Trainer) -> dict[str, float]:
        logged: dict[str, Any] = dict(trainer.callback_metrics)
        if self.metrics is not None:
            missing = [m for m in self.metrics if m not in logged]
            if missing:
                raise KeyError(
                    f"metrics {missing} were not logged this epoch (have {sorted(logged)}); "
                    "log them with self.log(..., on_epoch=True)"
                )
            logged = {m: logged[m] for m in self.metrics}
        return metrics_to_floats(logged)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        assert self.coordinator is not None
        signals = PassSignals(progress=self.tracker.progress(), fresh_loss=self.fresh.take())
        decision = self.coordinator.pass_end(
            self.client, self._select(trainer), self.block, signals
        )
        if self.adjust_bs is not None:
            self.adjust_bs.boundary(self.coordinator)
        done = self.tracker.record(decision)
        if done:
            trainer.should_stop = True

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.decisions:
            release_left_view(self.client, self.decisions[-1].generation)
        message = self.tracker.unfinished("raise the Trainer's max_epochs (-1: unbounded)")
        if message is not None:
            warnings.warn(message, RuntimeWarning, stacklevel=2)
