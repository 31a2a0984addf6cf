"""Why a policy decided as it did: a ``pass_end`` decision's ``reason``, one shape per policy.

:data:`Reason` is one of :class:`FixedReason`, :class:`ScoreReason`, :class:`BollingerReason`,
:class:`LearnedReason` and :class:`PacedReason`, told apart by ``policy``. Any of them carries
``bound``, ``rf_min`` and ``rf_max`` when the rf bounds overrode the policy's verdict. A field
that only some of a policy's decisions have is absent from the others; a field that may be
unknown is ``None``. ``tests/test_protocol_schema.py`` checks every type against the schema's
``Reason``.

No ``from __future__ import annotations`` here: with it, Python 3.11's ``TypedDict`` takes
every key for required.
"""

from typing import Literal, NotRequired, TypeAlias, TypedDict

__all__ = [
    "BandSide",
    "BollingerReason",
    "Bound",
    "CurrentPoint",
    "FixedReason",
    "HeldOut",
    "HeldOutFreshLoss",
    "HeldOutSchedule",
    "HeldOutValLoss",
    "LearnedReason",
    "LearnedSource",
    "PacedReason",
    "PacedWhy",
    "Reason",
    "Scope",
    "ScoreReason",
    "Spread",
]

#: Whether a statistic is kept for the run or restarts with every mini-epoch.
Scope: TypeAlias = Literal["run", "per_mini_epoch"]
#: Which exit from the Bollinger band advances.
BandSide: TypeAlias = Literal["below", "either", "above"]
#: Which standard deviation the band's width is taken from.
Spread: TypeAlias = Literal["sample", "population"]
#: Whether the band is computed with the score it judges.
CurrentPoint: TypeAlias = Literal["excluded", "included"]
#: Which bound on rf overrode the policy's verdict.
Bound: TypeAlias = Literal["rf_min", "rf_max"]
#: Where a ``learned`` decision came from: the recorded schedule, or the fallback policy.
LearnedSource: TypeAlias = Literal["history", "fallback"]
#: The rule that decided a ``paced`` verdict.
PacedWhy: TypeAlias = Literal["staging", "stall_free", "cap", "held_out"]


class _Bounds(TypedDict):
    """The rf bounds, present when one overrode the verdict."""

    bound: NotRequired[Bound]
    rf_min: NotRequired[int]
    rf_max: NotRequired[int]


class FixedReason(_Bounds):
    """``fixed``: advance after ``rf`` passes; ``passes`` so far."""

    policy: Literal["fixed"]
    rf: int
    passes: int


class ScoreReason(_Bounds):
    """``score``: advance once the score (``current``) has not improved on ``best`` for
    ``wait_th`` passes (``wait`` so far); ``best`` is kept per ``best_scope``."""

    policy: Literal["score"]
    best: float
    current: float
    improved: bool
    wait: int
    wait_th: int
    best_scope: Scope
    passes: int


class BollingerReason(_Bounds):
    """``bollinger``: advance when the score (``current``) leaves the band of the last
    ``window`` scores on ``side``. While the window fills, ``filling`` is true and ``have``
    counts its scores; afterwards the band (``ma``, ``std``, ``lower``, ``upper``) and how it
    is drawn (``side``, ``spread``, ``current_point``) are given instead."""

    policy: Literal["bollinger"]
    filling: NotRequired[bool]
    have: NotRequired[int]
    ma: NotRequired[float]
    std: NotRequired[float]
    lower: NotRequired[float]
    upper: NotRequired[float]
    current: float
    window: int
    k: float
    window_scope: Scope
    side: NotRequired[BandSide]
    spread: NotRequired[Spread]
    current_point: NotRequired[CurrentPoint]
    passes: int


class LearnedReason(_Bounds):
    """``learned``: from the recorded schedule (``source`` ``history``: advance after ``rf``
    passes, ``passes`` so far), or past its ``schedule_len`` mini-epochs from the fallback
    policy (``source`` ``fallback``, its reason in ``fallback``); ``sequence`` is the
    mini-epoch's number in the run."""

    policy: Literal["learned"]
    source: LearnedSource
    sequence: int
    rf: NotRequired[int]
    passes: NotRequired[int]
    schedule_len: int
    fallback: NotRequired["Reason"]


class HeldOutValLoss(TypedDict):
    """The validation loss decided: repeat while a repeat's expected ``gain`` is at least
    ``need`` (``None`` before they are measured); ``fresh_gain`` is a first pass's."""

    rule: Literal["val_loss"]
    gain: float | None
    need: float | None
    fresh_gain: float | None


class HeldOutFreshLoss(TypedDict):
    """The fresh-data loss decided: repeat up to the ``target`` rf it steers."""

    rule: Literal["fresh_loss"]
    target: int
    fresh_per_pass: float | None


class HeldOutSchedule(TypedDict):
    """No held-out signal yet: repeat up to the cap."""

    rule: Literal["schedule"]


#: ``paced``'s held-out rule, by the signal it used (``rule``).
HeldOut: TypeAlias = HeldOutValLoss | HeldOutFreshLoss | HeldOutSchedule


class PacedReason(_Bounds):
    """``paced``: ``why`` names the rule that decided (the next mini-epoch not staged, fewer
    passes than the stall-free rf, the ``cap``, or the held-out rule, whose account is
    ``held_out``); ``progress``, ``next_ready`` and ``stall_free_rf`` are what it knew
    (``None``: not known)."""

    policy: Literal["paced"]
    why: PacedWhy
    cap: int
    progress: float | None
    next_ready: bool | None
    stall_free_rf: int | None
    held_out: HeldOut | None
    passes: int


#: Why a policy decided as it did, by ``policy``.
Reason: TypeAlias = FixedReason | ScoreReason | BollingerReason | LearnedReason | PacedReason
