"""Short real trainings with Keras, PyTorch and Lightning over a metfs view.

Each function trains a small classifier on the digits samples of ``scripts/make_dataset.py``
through one of the integrations and returns what the tests check: the decisions, the
generations seen, and the files each pass read.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import numpy.typing as npt
from realmount import dataset_module

import metfs

NUM_CLASSES = 10


class ReadLog:
    """Records which files a loader read, and the bytes it read."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.bytes = 0

    def load(self, path: str) -> tuple[npt.NDArray[Any], np.int64]:
        """Loads one sample (features, label) and records it."""
        ds = dataset_module()
        self.paths.append(path)
        self.bytes += os.path.getsize(path)
        return ds.load_sample(path), np.int64(ds.label_of(path))

    def take(self) -> list[str]:
        """The paths read since the last call."""
        out, self.paths = self.paths, []
        return out


def validation_arrays(val_dir: str | None) -> tuple[npt.NDArray[Any], npt.NDArray[Any]] | None:
    """The validation set as arrays, if there is one."""
    if val_dir is None:
        return None
    arrays: tuple[npt.NDArray[Any], npt.NDArray[Any]] = dataset_module().load_folder(val_dir)
    return arrays


# ---------------------------------------------------------------------------------------------
# Keras
# ---------------------------------------------------------------------------------------------


def keras_training(
    client: metfs.Client,
    epochs: int,
    val_dir: str | None = None,
    batch_size: int = 16,
    fit_epochs: int = 1000,
    direct: bool | None = None,
) -> dict[str, Any]:
    """Trains a small Keras MLP with MetSequence + MetCallback (given ``direct``); returns what
    happened."""
    import keras

    from metfs.keras import MetCallback, MetSequence

    keras.utils.set_random_seed(0)
    log = ReadLog()
    per_pass: list[list[str]] = []

    class PassFiles(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            log.take()  # Keras reads a batch before training to build the model

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            per_pass.append(log.take())

    train = MetSequence(client, log.load, batch_size=batch_size, seed=0)
    met = MetCallback(client, epochs=epochs, datasets=[train], direct=direct)
    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(NUM_CLASSES, activation="softmax"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    val = validation_arrays(val_dir)
    # PassFiles runs before MetCallback so that it sees the pass's reads before the switch.
    history = model.fit(
        train, epochs=fit_epochs, validation_data=val, callbacks=[PassFiles(), met], verbose=0
    )
    return {
        "callback": met,
        "sequence": train,
        "history": history.history,
        "per_pass": per_pass,
        "bytes": log.bytes,
    }


# ---------------------------------------------------------------------------------------------
# PyTorch
# ---------------------------------------------------------------------------------------------


def _torch_model() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, NUM_CLASSES)
    )


def torch_training(
    client: metfs.Client,
    epochs: int,
    val_dir: str | None = None,
    batch_size: int = 16,
    num_workers: int = 0,
    direct: bool | None = None,
) -> dict[str, Any]:
    """Trains a small PyTorch MLP with MetDataset (given ``direct``) + met_train; returns what
    happened."""
    import torch
    import torch.nn.functional as F

    from metfs.torch import MetDataset, met_train

    model = _torch_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    log = ReadLog()
    ds = MetDataset(client, log.load, direct=direct)
    val = validation_arrays(val_dir)
    per_pass: list[list[str]] = []
    reported: list[dict[str, float]] = []

    def step(batch: Any) -> dict[str, Any]:
        x, y = batch
        opt.zero_grad()
        out = model(x)
        loss = F.cross_entropy(out, y)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        opt.step()
        return {"loss": loss, "accuracy": (out.argmax(1) == y).float().mean()}

    def evaluate() -> dict[str, float]:
        if val is None:
            return {}
        with torch.no_grad():
            pred = model(torch.from_numpy(val[0])).argmax(1).numpy()
        return {"val_accuracy": float((pred == val[1]).mean())}

    def on_pass(p: metfs.Pass, metrics: dict[str, float]) -> None:
        per_pass.append(log.take() if num_workers == 0 else list(p.paths))
        reported.append(metrics)

    run = met_train(
        client,
        ds,
        step,
        epochs=epochs,
        batch_size=batch_size,
        eval_fn=evaluate,
        on_pass=on_pass,
        num_workers=num_workers,
    )
    return {"run": run, "per_pass": per_pass, "reported": reported, "model": model}


# ---------------------------------------------------------------------------------------------
# Lightning
# ---------------------------------------------------------------------------------------------


def lightning_training(
    client: metfs.Client,
    epochs: int,
    batch_size: int = 16,
    tmpdir: str = ".",
    direct: bool | None = None,
) -> dict[str, Any]:
    """Trains a small Lightning module with met_loader + MetCallback (given ``direct``);
    returns what happened."""
    import lightning.pytorch as pl
    import torch
    import torch.nn.functional as F

    from metfs.lightning import MetCallback
    from metfs.torch import MetDataset, met_loader

    log = ReadLog()
    ds = MetDataset(client, log.load)
    per_pass: list[list[str]] = []
    loader_lengths: list[int] = []

    class Digits(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _torch_model()

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            out = self.net(x)
            loss = F.cross_entropy(out, y)
            acc = (out.argmax(1) == y).float().mean()
            self.log("loss", loss, on_step=False, on_epoch=True)
            self.log("accuracy", acc, on_step=False, on_epoch=True)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=0.01)

        def train_dataloader(self) -> Any:
            loader = met_loader(ds, batch_size=batch_size)
            loader_lengths.append(len(ds))
            return loader

    class PassFiles(pl.Callback):
        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            per_pass.append(log.take())

    met = MetCallback(client, epochs=epochs, direct=direct)
    trainer = pl.Trainer(
        max_epochs=-1,
        callbacks=[PassFiles(), met],
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmpdir,
    )
    trainer.fit(Digits())
    return {
        "callback": met,
        "trainer": trainer,
        "per_pass": per_pass,
        "loader_lengths": loader_lengths,
    }
