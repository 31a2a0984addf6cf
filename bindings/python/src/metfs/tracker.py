"""Pass tracking: the one state machine behind :func:`metfs.passes` and the framework callbacks.

A training job that follows metfs goes through the same states whatever drives its passes
(the plain loop, Keras, Lightning)::

    new --start(status)--> running --record(decision)--> running ... --> done

:meth:`PassTracker.start` takes the daemon's status when training begins and fixes the target:
``start_epoch + epochs``. :meth:`PassTracker.record` takes the decision that followed each pass
(``repeat``, ``wait`` or ``advance``) and keeps the history (decisions, generations, passes over
the current mini-epoch). The job is done once a decision's epoch reaches the target; a tracker
with ``max_passes`` also stops asking for passes after that many.

The tracker does no I/O: the caller asks its coordinator for the status and the decisions and
feeds them in, so the same rules hold for every integration and can be tested on their own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .client import Client, Decision, Status

if TYPE_CHECKING:
    from .batchsize import AdjustBs

__all__ = ["PassTracker", "TracksPasses"]


class PassTracker:
    """Counts passes and decides when the requested MET epochs are done.

    ``epochs`` is the number of full MET epochs to train (0: none, the job is done at
    :meth:`start`). ``max_passes`` caps the passes (``None``: no cap); it only affects
    :attr:`wants_pass`, never :attr:`done`.

    :meth:`start` may be called again (e.g. a second ``fit``): it sets a new target from the new
    status and keeps the history of earlier passes.
    """

    def __init__(self, epochs: int, *, max_passes: int | None = None) -> None:
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
            raise ValueError(f"epochs must be a non-negative int, got {epochs!r}")
        if max_passes is not None and max_passes < 0:
            raise ValueError(f"max_passes must be non-negative, got {max_passes!r}")
        self.epochs = epochs
        self.max_passes = max_passes
        #: The daemon's epoch at the last :meth:`start` (``None`` before it).
        self.start_epoch: int | None = None
        #: ``start_epoch + epochs``: the job is done once a decision's epoch reaches it.
        self.target_epoch: int | None = None
        #: The decision after each pass, in order, across every :meth:`start`.
        self.decisions: list[Decision] = []
        #: The generation after each pass (the view the next pass reads), in order.
        self.generations: list[int] = []
        #: Passes already completed over the current mini-epoch (the protocol's ``pass``).
        self.passes_done = 0
        #: Whether the requested MET epochs are complete.
        self.done = False

    @property
    def started(self) -> bool:
        """Whether :meth:`start` was called."""
        return self.target_epoch is not None

    @property
    def passes(self) -> int:
        """Passes recorded so far."""
        return len(self.decisions)

    @property
    def wants_pass(self) -> bool:
        """Whether another pass should run: started, not done, and under ``max_passes``."""
        return (
            self.started
            and not self.done
            and (self.max_passes is None or self.passes < self.max_passes)
        )

    @property
    def fresh(self) -> bool:
        """Whether the next pass is the first over its mini-epoch (fresh data)."""
        return self.passes_done == 0

    def progress(self) -> float:
        """The elapsed fraction of the run once the coming pass ends, in [0, 1]: passes of
        ``max_passes`` when capped (the budget a learning-rate schedule is usually set in),
        else MET epochs of ``epochs`` by the last known position."""
        if self.max_passes:
            return min(1.0, (self.passes + 1) / self.max_passes)
        if self.start_epoch is None or self.epochs == 0:
            return 0.0
        last = self.decisions[-1] if self.decisions else None
        done = 0.0
        if last is not None:
            per_epoch = last.mini_epochs
            part = last.mini_epoch / per_epoch if per_epoch else 0
            done = last.epoch - self.start_epoch + part
        return min(1.0, max(0.0, done / self.epochs))

    def start(self, status: Status) -> None:
        """Begins (or begins again) from the daemon's ``status``: fixes the target epoch."""
        self.start_epoch = status.epoch
        self.target_epoch = status.epoch + self.epochs
        self.passes_done = status.passes_done
        self.done = status.epoch >= self.target_epoch

    def record(self, decision: Decision) -> bool:
        """Records the decision that followed one pass; returns :attr:`done` after it."""
        if self.target_epoch is None:
            raise RuntimeError("PassTracker.record() before start(): no target epoch yet")
        self.decisions.append(decision)
        self.generations.append(decision.generation)
        self.passes_done = decision.passes_done
        if decision.epoch >= self.target_epoch:
            self.done = True
        return self.done

    def unfinished(self, hint: str) -> str | None:
        """A warning for a training run that ended early, or ``None`` when the job is done.

        ``hint`` tells the user how to give the framework more epochs.
        """
        if self.done:
            return None
        return (
            f"metfs: training ended after {self.passes} passes, before the {self.epochs} "
            f"requested MET epoch(s) were done; {hint}"
        )


class TracksPasses:
    """The tracker's state as read-only attributes of the object that drives the passes.

    Mixed into :class:`metfs.Passes` and the Keras and Lightning callbacks, so all three expose
    the same names; the subclass sets ``self.tracker``.
    """

    tracker: PassTracker
    client: Client
    #: ADJUST_BS for this rank (``adjust_bs=`` of the loop or callback), or ``None``.
    adjust_bs: AdjustBs | None = None

    def local_batch_size(self, global_batch: int | None = None) -> int:
        """This rank's local batch size under ADJUST_BS (paper 003; :class:`metfs.batchsize.AdjustBs`
        given as ``adjust_bs=``): its node's share of the global batch by the nodes'
        throughputs, split over the node's ranks, the same sizes on every rank and changed by
        all ranks together at a pass boundary when a straggler is found. ``global_batch``, if
        given, must be the ``AdjustBs``'s. Raises ``ValueError`` without ``adjust_bs`` and
        ``RuntimeError`` before training starts."""
        if self.adjust_bs is None:
            raise ValueError(
                "local_batch_size needs ADJUST_BS: pass adjust_bs=metfs.batchsize.AdjustBs(GLOBAL_BATCH) "
                "to metfs.passes() or to the callback"
            )
        if global_batch is not None and global_batch != self.adjust_bs.global_batch:
            raise ValueError(
                f"global_batch {global_batch} is not the adjust_bs's {self.adjust_bs.global_batch}"
            )
        return self.adjust_bs.batch_size

    @property
    def epochs(self) -> int:
        """MET epochs requested."""
        return self.tracker.epochs

    @property
    def start_epoch(self) -> int | None:
        """The daemon's epoch when training began (``None`` before)."""
        return self.tracker.start_epoch

    @property
    def target_epoch(self) -> int | None:
        """``start_epoch + epochs``: training ends after the pass whose decision reaches it."""
        return self.tracker.target_epoch

    @property
    def done(self) -> bool:
        """Whether the requested MET epochs are complete."""
        return self.tracker.done

    @property
    def decisions(self) -> list[Decision]:
        """The decision after each pass, in order."""
        return self.tracker.decisions

    @property
    def generations(self) -> list[int]:
        """The generation after each pass, in order."""
        return self.tracker.generations
