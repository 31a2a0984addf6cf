"""PyTorch integration: a dataset and sampler that follow the view, and a pass loop helper.

::

    import metfs
    from metfs.torch import MetDataset, met_loader, met_train

    client = metfs.Client(job="digits")
    ds = MetDataset(client, load_sample)            # load_sample(path) -> (x, y) tensors

    def step(batch):                                # one optimiser step; returns the loss
        x, y = batch
        opt.zero_grad(); loss = F.cross_entropy(model(x), y); loss.backward(); opt.step()
        return loss

    run = met_train(client, ds, step, epochs=2, batch_size=32)
    print(run.rf_per_mini_epoch())

:class:`MetSampler` asks for the view's file list every time a ``DataLoader`` starts iterating
(the start of a pass; the list crosses the socket again only when the view's generation
changed) and yields *paths*; :class:`MetDataset` loads whatever path it is given.
So the view is followed across switches also with worker processes, persistent or not.
:func:`met_train` runs :func:`metfs.passes` with a fresh loader per pass and reports the mean
of what ``step_fn`` returns (plus ``eval_fn()``'s metrics) after each pass.

``MetDataset(client, load_sample, direct=True)`` (or a client made with ``direct=True``) hands
the loader, and so the worker processes, the staged copies of the view's files in the cache
instead of the mount's paths: read without FUSE, at the disk's speed. The main process asks for
the view (at every pass) and holds the lease that keeps its slot while the workers read it
(:meth:`metfs.Client.files`); the workers only open paths.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from .client import Client, FilesView, metrics_to_floats
from .coordinator import Coordinator
from .loop import Pass, Passes, passes
from .signals import FRESH_BATCHES, FreshLoss

__all__ = ["MetDataset", "MetSampler", "met_loader", "met_train"]


class MetDataset(Dataset[Any]):
    """A map-style dataset over the current view of a metfs mount.

    ``loader(path)`` turns one file (absolute path) into one sample. An item key may be a path
    (what :class:`MetSampler` yields, robust across view switches) or an index into the file
    list of the last :meth:`refresh` (what plain and distributed samplers use). The file list is
    read at construction and by :meth:`refresh`.

    ``direct=True`` gives ``loader`` the view's files as their copies in the cache (the view's
    ``paths``, which are then its ``direct_paths``), read without FUSE, under the client's lease on the view (see
    :meth:`metfs.Client.files`), which each refresh moves to the view it reads; ``None``
    follows the client (``Client(direct=...)``), ``False`` gives the mount's paths.
    """

    def __init__(
        self, client: Client, loader: Callable[[str], Any], *, direct: bool | None = None
    ) -> None:
        self.client: Client | None = client
        self.loader = loader
        self.direct = direct
        self.view: FilesView = client.files(direct=direct)

    @property
    def paths(self) -> Sequence[str]:
        """The paths ``loader`` is given, as of the last refresh: absolute paths under the
        mount, or with ``direct`` of the copies in the cache."""
        return self.view.paths

    @property
    def generation(self) -> int:
        """Generation of the view as of the last refresh."""
        return self.view.generation

    def refresh(self, force: bool = False) -> FilesView:
        """Brings the file list up to date with the daemon's current view.

        One short round trip: the daemon sends the (possibly long) file list again only when
        the generation changed, or always with ``force``.
        """
        if self.client is None:
            raise RuntimeError("MetDataset.refresh() in a worker process: refresh in the parent")
        self.view = self.client.files(None if force else self.view, direct=self.direct)
        return self.view

    def set_view(self, view: FilesView) -> None:
        """Uses a view already read (e.g. by :func:`metfs.passes`) instead of asking again."""
        self.view = view

    def __len__(self) -> int:
        return len(self.view)

    def __getitem__(self, key: int | str) -> Any:
        if isinstance(key, str):
            return self.loader(key)
        return self.loader(self.view.paths[key])

    def __getstate__(self) -> dict[str, Any]:
        # Worker processes only load files; the socket stays in the parent.
        state = self.__dict__.copy()
        state["client"] = None
        return state


class MetSampler(Sampler[str]):
    """Yields the paths of the current view, re-read from the daemon at construction and at
    every ``iter()``.

    A ``DataLoader`` calls ``iter(sampler)`` in the main process when a pass begins, so each
    pass sees the view of that moment. ``shuffle`` permutes the paths with a generator seeded by
    ``seed`` (a new permutation every pass). The paths are the dataset's (``paths``: the mount's,
    or with ``direct`` the copies in the cache).
    """

    def __init__(self, dataset: MetDataset, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        # Also at construction, so that len() of a loader built at the start of a pass (as
        # Lightning does when it reloads dataloaders) counts the current view.
        dataset.refresh()
        self.shuffle = shuffle
        self._gen = torch.Generator()
        self._gen.manual_seed(seed)
        #: Generations of the views iterated over, one entry per pass.
        self.generations: list[int] = []

    def __len__(self) -> int:
        return len(self.dataset)

    def __iter__(self) -> Iterator[str]:
        # Not a generator function: the refresh happens at iter() time, before workers start.
        view = self.dataset.refresh()
        self.generations.append(view.generation)
        paths = view.paths
        if not self.shuffle:
            return iter(paths)
        order = torch.randperm(len(paths), generator=self._gen)
        # Each path is built as the loader asks for it, not a list of the whole view per pass.
        return (paths[i] for i in order.tolist())


def met_loader(
    dataset: MetDataset,
    batch_size: int = 32,
    *,
    shuffle: bool = True,
    seed: int = 0,
    **kwargs: Any,
) -> DataLoader[Any]:
    """A ``DataLoader`` over ``dataset`` with a :class:`MetSampler` (follows the view).

    Build it once and iterate it once per pass; further keyword arguments (``num_workers``,
    ``collate_fn``, ``pin_memory``, ``persistent_workers``...) go to ``DataLoader``.
    """
    sampler = MetSampler(dataset, shuffle=shuffle, seed=seed)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, **kwargs)


def _batch_metrics(out: Any) -> dict[str, float]:
    if out is None:
        return {}
    if isinstance(out, Mapping):
        return metrics_to_floats(out)
    return metrics_to_floats({"loss": out})


def met_train(
    client: Client,
    dataset: MetDataset,
    step_fn: Callable[[Any], Any],
    *,
    epochs: int = 1,
    batch_size: int = 32,
    eval_fn: Callable[[], Mapping[str, Any]] | None = None,
    on_pass: Callable[[Pass, dict[str, float]], None] | None = None,
    block: bool = False,
    coordinator: Coordinator | None = None,
    max_passes: int | None = None,
    fresh_batches: int = FRESH_BATCHES,
    **loader_kwargs: Any,
) -> Passes:
    """Trains over the mount pass by pass until ``epochs`` MET epochs are done.

    For each pass the current view is read once, a ``DataLoader`` over it is built
    (``batch_size``, shuffled; ``loader_kwargs`` go to ``DataLoader``), and ``step_fn(batch)``
    runs for every batch. ``step_fn`` returns a loss (number or one-element tensor), a dict of
    metrics, or ``None``; their means over the pass, weighted by batch, plus ``eval_fn()``'s
    metrics, are reported with ``pass_end``. ``on_pass(p, metrics)`` is called after each pass
    (e.g. to log). The first ``fresh_batches`` losses of a mini-epoch's first pass are sent as
    its fresh-data loss, and the run's progress (passes of ``max_passes``, else MET epochs)
    goes with every pass (:mod:`metfs.signals`). The loader reads the view's direct paths when ``dataset`` was made with
    ``direct=True`` (or the client with ``direct=True``). Returns the finished
    :class:`metfs.Passes` with the decision history.
    """
    run = passes(
        client,
        epochs,
        block=block,
        coordinator=coordinator,
        max_passes=max_passes,
        direct=dataset.direct,
    )
    loader_kwargs.setdefault("shuffle", True)
    fresh = FreshLoss(fresh_batches)
    for p in run:
        assert p.view is not None
        dataset.set_view(p.view)
        loader = DataLoader(dataset, batch_size=batch_size, **loader_kwargs)
        sums: dict[str, float] = {}
        batches = 0
        fresh.begin(p.fresh)
        for batch in loader:
            out = _batch_metrics(step_fn(batch))
            for name, value in out.items():
                sums[name] = sums.get(name, 0.0) + value
            if "loss" in out:
                # The step computed this loss before training on the batch.
                fresh.add(out["loss"])
            batches += 1
        p.fresh_loss = fresh.take()
        metrics = {name: total / max(batches, 1) for name, total in sums.items()}
        if eval_fn is not None:
            metrics.update(metrics_to_floats(eval_fn()))
        p.report(metrics)
        if on_pass is not None:
            on_pass(p, dict(metrics))
    return run
