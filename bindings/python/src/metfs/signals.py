"""What a job tells the rf policy beside its metrics: the run's progress and the fresh-data loss.

``pass_end`` carries two optional fields the daemon's policies read (the protocol's
``progress`` and ``fresh_loss``; the validation loss travels as the metric ``val_loss``):

* ``progress``: the elapsed fraction of the job's budget in [0, 1] (passes, samples or epochs,
  as the job counts it), so a policy can let rf grow as training progresses (paper 001 §V.A);
* ``fresh_loss``: the **fresh-data loss**, the mean loss of the first batches of a new
  mini-epoch's first pass, each computed in the forward pass before the step that trains on
  it. Those samples are unseen by the model at that moment, so it is a held-out measure of the
  model as the previous mini-epoch left it, and it costs nothing: the loss is computed anyway.

:class:`PassSignals` checks and carries them; :class:`FreshLoss` measures the fresh-data loss
from per-batch losses. The integrations (``passes()``, ``met_train``, the Keras and Lightning
callbacks) fill both in; a caller of :meth:`metfs.Client.pass_end` may pass them itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .errors import MetfsError

__all__ = ["FRESH_BATCHES", "FreshLoss", "PassSignals"]

#: Batches the fresh-data loss averages by default: enough to average out one batch's noise,
#: few enough that the model has barely moved from where the previous mini-epoch left it.
FRESH_BATCHES = 8


def _finite(name: str, value: Any) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise MetfsError("bad_metrics", f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(x):
        raise MetfsError("bad_metrics", f"{name} must be a finite number, got {x}")
    return x


@dataclass(frozen=True)
class PassSignals:
    """``pass_end``'s ``progress`` and ``fresh_loss`` (each ``None`` when the job cannot say).

    Checked when made: ``progress`` a finite number in [0, 1], ``fresh_loss`` a finite number;
    anything else raises :class:`metfs.MetfsError` (``bad_metrics``) naming the field, before
    anything is sent.
    """

    progress: float | None = None
    fresh_loss: float | None = None

    def __post_init__(self) -> None:
        if self.progress is not None:
            p = _finite("progress", self.progress)
            if not 0.0 <= p <= 1.0:
                raise MetfsError("bad_metrics", f"progress must lie in [0, 1], got {p}")
            object.__setattr__(self, "progress", p)
        if self.fresh_loss is not None:
            object.__setattr__(self, "fresh_loss", _finite("fresh_loss", self.fresh_loss))

    def fields(self) -> dict[str, float]:
        """The fields to add to a ``pass_end`` request (those that are known)."""
        out: dict[str, float] = {}
        if self.progress is not None:
            out["progress"] = self.progress
        if self.fresh_loss is not None:
            out["fresh_loss"] = self.fresh_loss
        return out


class FreshLoss:
    """Measures the fresh-data loss of a mini-epoch's first pass.

    Call :meth:`begin` at the start of every pass with whether it is the first over its
    mini-epoch, :meth:`add` with each batch's loss as computed before that batch's step (what a
    training step returns), and :meth:`take` at the pass's end: the mean of the first
    ``batches`` losses of a first pass, else ``None``. Non-finite losses are skipped (a
    diverging batch says nothing held-out the daemon could use, and would be refused).
    """

    def __init__(self, batches: int = FRESH_BATCHES) -> None:
        if isinstance(batches, bool) or not isinstance(batches, int) or batches < 1:
            raise ValueError(f"batches must be a positive int, got {batches!r}")
        self.batches = batches
        self._fresh = False
        self._sum = 0.0
        self._n = 0

    def begin(self, fresh: bool) -> None:
        """A pass starts; ``fresh``: it is the first over its mini-epoch."""
        self._fresh = fresh
        self._sum = 0.0
        self._n = 0

    @property
    def wants(self) -> bool:
        """Whether the next batch's loss is still part of the measure."""
        return self._fresh and self._n < self.batches

    def add(self, loss: Any) -> None:
        """One batch's loss, computed before its step (ignored once enough are in)."""
        if not self.wants:
            return
        try:
            x = float(loss)
        except (TypeError, ValueError):
            return
        if math.isfinite(x):
            self._sum += x
            self._n += 1

    def take(self) -> float | None:
        """The fresh-data loss of the pass that ends, or ``None``; the measure restarts."""
        out = self._sum / self._n if self._fresh and self._n else None
        self.begin(False)
        return out
