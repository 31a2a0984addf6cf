"""The pass loop: one :class:`Pass` per iteration over the current mini-epoch.

Typical use::

    import metfs

    with metfs.Client() as client:
        run = metfs.passes(client, epochs=2)
        for p in run:
            for path in p.paths:          # the files of the current view
                ...                       # train on them
            p.report(loss=loss, accuracy=acc)
        print(run.rf_per_mini_epoch())

After the body of the loop finishes a pass, the loop sends ``pass_end`` with the pass's metrics
and follows the daemon's decision: another pass over the same view (``repeat`` or ``wait``) or
the next mini-epoch (``advance``). It stops once the requested number of MET epochs is done.

With ``metfs.passes(client, direct=True)`` each pass's ``paths`` are the staged copies of the
view's files in the cache, read without FUSE, under the client's lease on the view (see
:meth:`metfs.Client.files`); the loop body reads them as it would the mount's.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .batchsize import AdjustBs
from .client import Client, Decision, FilesView, MetfsError, metrics_to_floats
from .coordinator import Coordinator, default_coordinator
from .signals import PassSignals
from .tracker import PassTracker, TracksPasses

__all__ = ["Pass", "PassRecord", "Passes", "passes", "release_left_view"]


@dataclass
class Pass:
    """One pass over the current view.

    ``index`` counts the passes of this loop from 0; ``pass_in_mini_epoch`` counts the passes
    already completed over this mini-epoch before this one. ``files`` are relative to the mount;
    ``paths`` are what to open: the files under the mount, or with ``direct`` their copies in
    the cache; ``mount_paths`` are always the files under the mount. This is the rule of
    :class:`metfs.FilesView` (``paths``, ``mount_paths``), whose sequences these are: read-only
    sequences of ``str``, the same objects for every pass over one view. Set ``metrics`` (or call :meth:`report`) before the
    next iteration; the loop sends them with ``pass_end``. ``decision`` holds the daemon's
    answer once it is known.

    ``fresh`` says whether this is the first pass over its mini-epoch: then set ``fresh_loss``
    to the mean loss of its first few batches, each computed before the step that trains on it
    (:class:`metfs.FreshLoss` measures it), and the loop sends it as the fresh-data loss.
    ``progress`` is the elapsed fraction of the run the loop sends (passes of ``max_passes``,
    else MET epochs of ``epochs``); set it when the job counts its budget otherwise.
    """

    index: int
    generation: int
    epoch: int
    mini_epoch: int
    pass_in_mini_epoch: int
    mountpoint: str
    files: Sequence[str] = field(repr=False)
    paths: Sequence[str] = field(repr=False)
    #: The view's files under the mount (the same as ``paths`` without ``direct``).
    mount_paths: Sequence[str] = field(default=(), repr=False)
    metrics: dict[str, Any] = field(default_factory=dict)
    decision: Decision | None = None
    #: This rank's local batch size for this pass with ``adjust_bs`` (ADJUST_BS), else ``None``.
    batch_size: int | None = None
    #: The view this pass reads (its ``paths`` are this pass's).
    view: FilesView | None = field(default=None, repr=False, compare=False)
    #: Whether this is the first pass over its mini-epoch (its samples are unseen so far).
    fresh: bool = False
    #: The fresh-data loss of this (first) pass, when the body measured it.
    fresh_loss: float | None = None
    #: The elapsed fraction of the run once this pass ends, sent with ``pass_end``.
    progress: float | None = None

    def report(self, metrics: Mapping[str, Any] | None = None, **named: Any) -> None:
        """Adds metrics of this pass, e.g. ``p.report(loss=0.3, accuracy=0.9)``.

        Values are checked at once (numbers only, finite), so a bad metric fails here, in the
        training code, rather than at the next iteration.
        """
        merged: dict[str, Any] = dict(metrics or {})
        merged.update(named)
        metrics_to_floats(merged)
        self.metrics.update(merged)

    @property
    def position(self) -> tuple[int, int]:
        """``(epoch, mini_epoch)`` of this pass."""
        return (self.epoch, self.mini_epoch)

    def __len__(self) -> int:
        return len(self.paths)


@dataclass(frozen=True)
class PassRecord:
    """What one pass was and what followed it (kept for every pass; no file lists)."""

    index: int
    generation: int
    epoch: int
    mini_epoch: int
    files: int
    metrics: dict[str, float]
    decision: Decision


class Passes(TracksPasses):
    """An iterable of passes over the current view until ``epochs`` MET epochs are done.

    Created by :func:`passes`. Iterate it once; afterwards (or during) ``records``,
    ``decisions`` and ``generations`` tell what happened. ``start_epoch`` is the daemon's epoch
    when iteration began and ``target_epoch = start_epoch + epochs``: the loop ends after the
    pass whose decision reaches it. ``max_passes`` caps the number of passes (``None``: no
    cap). The counting is :class:`metfs.tracker.PassTracker`'s (``tracker``). With
    ``adjust_bs`` (:class:`metfs.batchsize.AdjustBs`), each pass carries this rank's local batch size
    (``Pass.batch_size``, also :meth:`local_batch_size`), which every rank changes together at a
    pass boundary when a straggler is found. ``direct`` chooses the paths each pass reads (see
    :func:`passes`).
    """

    def __init__(
        self,
        client: Client,
        epochs: int = 1,
        *,
        block: bool = False,
        coordinator: Coordinator | None = None,
        max_passes: int | None = None,
        adjust_bs: AdjustBs | None = None,
        direct: bool | None = None,
    ) -> None:
        #: The pass-tracking state: target epoch, decisions, generations, done.
        self.tracker = PassTracker(epochs, max_passes=max_passes)
        self.client = client
        self.block = block
        self.coordinator = coordinator if coordinator is not None else default_coordinator()
        self.records: list[PassRecord] = []
        self.adjust_bs = adjust_bs
        #: Direct paths or the mount's (``None``: as the client, see :meth:`Client.files`).
        self.direct = direct
        self._started = False

    @property
    def max_passes(self) -> int | None:
        """Cap on the number of passes (``None``: no cap)."""
        return self.tracker.max_passes

    @property
    def is_leader(self) -> bool:
        """Whether this rank decides (single process: always)."""
        return self.coordinator.is_leader

    def rf_per_mini_epoch(self) -> list[tuple[int, int, int]]:
        """``(epoch, mini_epoch, passes)`` for every mini-epoch trained over, in order."""
        out: list[tuple[int, int, int]] = []
        for r in self.records:
            if out and out[-1][:2] == (r.epoch, r.mini_epoch):
                out[-1] = (r.epoch, r.mini_epoch, out[-1][2] + 1)
            else:
                out.append((r.epoch, r.mini_epoch, 1))
        return out

    def __iter__(self) -> Iterator[Pass]:
        if self._started:
            raise RuntimeError("a Passes loop can be iterated only once; call metfs.passes() again")
        self._started = True
        return self._run()

    def _run(self) -> Iterator[Pass]:
        tracker = self.tracker
        tracker.start(self.coordinator.start(self.client))
        if self.adjust_bs is not None:
            self.adjust_bs.start(self.coordinator, self.client)
        view: FilesView | None = None
        decision: Decision | None = None
        while tracker.wants_pass:
            # The list is sent again only when the generation moved: a pass over an unchanged
            # view costs one short round trip, whatever the view's size. With direct paths this
            # also moves the client's lease to the view read now.
            if self.direct is None:
                view = self.coordinator.files(self.client, view)
            else:
                view = self.coordinator.files(self.client, view, direct=self.direct)
            p = Pass(
                index=tracker.passes,
                generation=view.generation,
                epoch=view.epoch,
                mini_epoch=view.mini_epoch,
                pass_in_mini_epoch=tracker.passes_done,
                mountpoint=view.mountpoint,
                files=view.files,
                paths=view.paths,
                mount_paths=view.mount_paths,
                batch_size=None if self.adjust_bs is None else self.adjust_bs.batch_size,
                view=view,
                fresh=tracker.fresh,
                progress=tracker.progress(),
            )
            yield p
            metrics = metrics_to_floats(p.metrics)
            signals = PassSignals(progress=p.progress, fresh_loss=p.fresh_loss if p.fresh else None)
            decision = self.coordinator.pass_end(self.client, metrics, self.block, signals)
            p.decision = decision
            if self.adjust_bs is not None:
                # Collective, right after pass_end on every rank: new sizes hold from the next
                # pass on, on every rank at once.
                self.adjust_bs.boundary(self.coordinator)
            self.records.append(
                PassRecord(
                    index=p.index,
                    generation=p.generation,
                    epoch=p.epoch,
                    mini_epoch=p.mini_epoch,
                    files=len(p.paths),
                    metrics=metrics,
                    decision=decision,
                )
            )
            tracker.record(decision)
        if decision is not None:
            release_left_view(self.client, decision.generation)


def release_left_view(client: Client, generation: int) -> None:
    """After the last pass, whose decision left the view at ``generation``: a lease the client
    still holds on an older view (the one the pass read, before an advance) would keep that
    slot, and with it the staging of the next mini-epoch, waiting until the next ``files``;
    it is released. A lease on the current view is kept (the daemon would not free it anyway).
    """
    held = client.lease
    if held is None or held == generation:
        return
    try:
        client.release(held)
    except MetfsError as e:
        if e.code != "no_lease":  # moved or gone meanwhile: nothing of that view is held
            raise


def passes(
    client: Client,
    epochs: int = 1,
    *,
    block: bool = False,
    coordinator: Coordinator | None = None,
    max_passes: int | None = None,
    adjust_bs: AdjustBs | None = None,
    direct: bool | None = None,
) -> Passes:
    """Passes over the current view until ``epochs`` full MET epochs have completed.

    Yields one :class:`Pass` per pass with the view's files (asked of the daemon at every pass,
    and sent again only when the view's generation changed), generation and position. Set
    ``p.metrics`` or call ``p.report(...)`` in the loop body; before yielding the next pass,
    the loop reports them with ``pass_end`` (``block``: wait for staging instead of answering
    ``wait``). The returned object also keeps the decision history (``.decisions``,
    ``.records``, ``.rf_per_mini_epoch()``).

    ``coordinator`` decides across ranks; by default the local daemon decides, or rank 0's when
    ``torch.distributed`` is initialised (see :mod:`metfs.coordinator`). ``adjust_bs``
    (:class:`metfs.batchsize.AdjustBs`) gives each pass this rank's local batch size
    (``p.batch_size``) under ADJUST_BS; record the rank's work with ``adjust_bs.record``.

    ``direct=True`` gives each pass the view's files as their copies in the cache
    (``p.paths``; ``p.mount_paths`` are the files under the mount), read without FUSE: the view is asked for
    with ``direct`` (:meth:`metfs.Client.files`), so the client holds a lease on the view of
    the current pass, moved at each pass, that keeps its slot while it is read (also by
    forked loader workers: only this process talks to the daemon). When the loop ends after
    an advance, the lease on the view it left is released. ``None`` (the default) follows the
    client (``Client(direct=...)``, ``False`` unless set); ``False``: the mount's paths.
    """
    return Passes(
        client,
        epochs,
        block=block,
        coordinator=coordinator,
        max_passes=max_passes,
        adjust_bs=adjust_bs,
        direct=direct,
    )
