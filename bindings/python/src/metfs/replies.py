"""The daemon's replies as typed objects, and the one reader that checks them.

Each reply the client reads is a frozen dataclass (:class:`Hello`, :class:`Decision`, here;
:class:`metfs.Status` in :mod:`metfs.status`; :class:`metfs.FilesView` in :mod:`metfs.views`)
whose fields are named as the protocol's, except where its ``PROTOCOL_NAMES`` says otherwise;
objects nested in a reply are dataclasses too (:class:`NotResumed`, :class:`Replay`) or
``TypedDict`` s (:class:`JobShare`, the parts of ``status``). :func:`read_reply` reads any of
them from a reply object by the field's type: a field without a default must be there (the
protocol requires it), one with a default takes it when absent (as the daemon's own reader
does), and a value of the wrong type raises ``MetfsError("bad_response")`` naming the field.
``tests/test_protocol_schema.py`` compares each type with the schema (names, required or not,
value types and enums).

No ``from __future__ import annotations`` here: with it, Python 3.11's ``TypedDict`` takes
every key for required.
"""

import dataclasses
import json
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import (
    Any,
    ClassVar,
    Literal,
    TypedDict,
    TypeVar,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

from .errors import MetfsError
from .protocol import DecisionKind, ReplayWhy
from .reasons import Reason

__all__ = [
    "Decision",
    "Hello",
    "JobShare",
    "Left",
    "NotResumed",
    "Released",
    "Replay",
    "read_reply",
]

_T = TypeVar("_T")


class _Mismatch(Exception):
    """A value that is not of its field's type: where it is and what was wanted."""

    def __init__(self, where: str, wanted: str, missing: bool = False) -> None:
        super().__init__(where)
        self.where = where
        self.wanted = wanted
        self.missing = missing


_HINTS: dict[Any, dict[str, Any]] = {}


def _hints(cls: Any) -> dict[str, Any]:
    """The resolved field types of a dataclass or ``TypedDict`` (kept once read)."""
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = get_type_hints(cls)
    return hints


def _excerpt(obj: Any) -> str:
    try:
        return json.dumps(obj)[:500]
    except (TypeError, ValueError):
        return repr(obj)[:500]


def _name(tp: Any) -> str:
    """A short description of a type for an error message."""
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_name(a) for a in get_args(tp))
    if origin is not None:
        return getattr(origin, "__name__", str(origin))
    return {type(None): "null", int: "an integer", float: "a number", str: "a string"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _convert(tp: Any, value: Any, where: str) -> Any:
    """``value`` as ``tp`` (an int where a float is wanted becomes a float), or ``_Mismatch``."""
    if tp is Any:
        return value
    origin = get_origin(tp)
    if origin is Literal:
        if any(type(value) is type(a) and value == a for a in get_args(tp)):
            return value
    elif origin in (Union, types.UnionType):
        arms = get_args(tp)
        if value is None and type(None) in arms:
            return None
        others = [a for a in arms if a is not type(None)]
        if len(others) == 1:  # an optional value: what is wrong inside it is told
            return _convert(others[0], value, where)
        for arm in others:
            try:
                return _convert(arm, value, where)
            except _Mismatch:
                pass
    elif tp is type(None):
        if value is None:
            return None
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif origin in (list, Sequence):
        if isinstance(value, list):
            (item,) = get_args(tp)
            return [_convert(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    elif origin in (dict, Mapping):
        if isinstance(value, dict) and all(isinstance(k, str) for k in value):
            _, item = get_args(tp)
            return {k: _convert(item, v, f"{where}.{k}") for k, v in value.items()}
    elif is_typeddict(tp):
        if isinstance(value, Mapping):
            out = dict(value)  # fields this client does not know are kept as sent
            for key, key_tp in _hints(tp).items():
                if key in value:
                    out[key] = _convert(key_tp, value[key], f"{where}.{key}")
                elif key in tp.__required_keys__:
                    raise _Mismatch(f"{where}.{key}", _name(key_tp), missing=True)
            return out
    elif dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if isinstance(value, Mapping):
            return _read(tp, value, f"{where}.")
    else:  # pragma: no cover - a type this reader was not written for
        raise TypeError(f"read_reply cannot read {tp!r}")
    raise _Mismatch(where, _name(tp))


def _read(cls: type[_T], obj: Mapping[str, Any], prefix: str) -> _T:
    renames: dict[str, str] = getattr(cls, "PROTOCOL_NAMES", {})
    derived: frozenset[str] = getattr(cls, "DERIVED", frozenset())
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in derived or not f.init:
            continue
        if f.name == "raw":
            kwargs["raw"] = obj
            continue
        name = renames.get(f.name, f.name)
        if name in obj:
            kwargs[f.name] = _convert(hints[f.name], obj[name], prefix + name)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise _Mismatch(prefix + name, _name(hints[f.name]), missing=True)
    return cls(**kwargs)


def read_reply(cls: type[_T], obj: Any, what: str, where: str = "") -> _T:
    """Reads the dataclass ``cls`` from the reply (or the part ``where`` of the reply) to
    ``what``, checking every field's type; a missing or malformed field raises
    ``MetfsError("bad_response")`` naming it."""
    try:
        if not isinstance(obj, Mapping):
            raise _Mismatch(where or "reply", "an object")
        return _read(cls, obj, f"{where}." if where else "")
    except _Mismatch as e:
        if e.missing:
            raise MetfsError(
                "bad_response",
                f"`{what}` response has no field `{e.where}` ({e.wanted}): {_excerpt(obj)}",
            ) from None
        raise MetfsError(
            "bad_response",
            f"`{what}` response has a malformed `{e.where}` (not {e.wanted}): {_excerpt(obj)}",
        ) from None


@dataclass(frozen=True)
class NotResumed:
    """A job of a shared mount's save file whose place the daemon's restart could not resume:
    ``reason`` says why, ``epoch``, ``mini_epoch`` and ``passes`` where it was when saved. The job
    starts over at epoch 0; its first ``hello`` after the restart carries this
    (:attr:`Hello.not_resumed`), and ``status`` lists every such job (:attr:`Status.not_resumed`).
    """

    job: str
    reason: str
    epoch: int
    mini_epoch: int
    passes: int

    @classmethod
    def from_response(cls, obj: Any, what: str) -> "NotResumed":
        """Reads one ``NotResumed`` object of the reply ``what``."""
        return read_reply(cls, obj, what, "not_resumed")


class JobShare(TypedDict):
    """A job's place on a shared mount, in ``hello``'s ``share``: ``path``, the directory of
    its view (``MNT/<job>``); ``share_bytes``, what of the store it may pin (its current and
    next views), fixed at join; ``view_bytes``, the most one of its views holds (half its
    share); ``samples`` of its dataset (the source, or its subset); ``token``, to give back in a
    later ``hello`` of the same job (see :class:`metfs.Client`)."""

    path: str
    share_bytes: int
    view_bytes: int
    samples: int
    token: str


@dataclass(frozen=True)
class Hello:
    """Answer to ``hello``: the daemon's protocol and identity.

    ``protocol`` is the daemon's protocol major version, ``version`` its own (``metfs
    --version``), ``mountpoint`` where the view is mounted, ``job`` the job the client named.
    """

    protocol: int
    version: str
    mountpoint: str
    job: str | None
    #: On a shared mount (``metfs mount --share``): the job's place (:class:`JobShare`: ``path``
    #: of its view, ``share_bytes``, ``view_bytes``, ``samples``, ``token``); ``None`` on a plain
    #: mount.
    share: JobShare | None = None
    #: On a shared mount restarted with this job's place saved, why the place could not be
    #: resumed (the job starts over at epoch 0); ``None`` otherwise.
    not_resumed: NotResumed | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_response(cls, obj: dict[str, Any]) -> "Hello":
        """Builds the answer from a response object."""
        return read_reply(cls, obj, "hello")

    @property
    def view_path(self) -> str:
        """Where this job's view is: ``MNT/<job>`` on a shared mount, else the mountpoint."""
        if self.share is not None:
            return self.share["path"]
        return self.mountpoint


@dataclass(frozen=True)
class Replay:
    """``status``'s ``replay`` under ``rf_policy`` ``learned``: the earlier run of the rf history
    that this run replays, and why (the history file records the same on this run as
    ``replayed``).

    ``run`` is the replayed run's id in the history file and ``mini_epochs`` how many mini-epochs
    its schedule covers (the fallback policy decides after them). ``why`` is ``best`` (the best
    final value of ``metric`` among ``compared`` runs), ``latest`` (no run recorded the metric:
    the latest finished run) or ``furthest`` (none finished either: the one that got furthest).
    ``metric`` is ``min:TERM`` or ``max:TERM``; ``value`` is the replayed run's final value of it,
    ``None`` when that run did not record it; ``finished`` says whether the run ended normally.
    """

    run: int
    mini_epochs: int
    why: ReplayWhy
    metric: str
    value: float | None
    finished: bool
    compared: int

    @classmethod
    def from_response(cls, obj: Any) -> "Replay | None":
        """Reads ``replay`` of a ``status`` response: ``None`` when it is absent or null."""
        if obj is None:
            return None
        return read_reply(cls, obj, "status", "replay")


@dataclass(frozen=True)
class Decision:
    """Answer to ``pass_end``, ``advance`` and ``apply``.

    ``decision`` is ``"repeat"`` (train another pass over the same view), ``"advance"`` (the view
    now shows the next mini-epoch) or ``"wait"`` (the policy wants to advance but the next
    mini-epoch is not staged yet: train another pass over the same view). The position fields
    are those *after* the decision; ``passes_done`` is the protocol's ``pass``, ``rf`` the
    passes per mini-epoch the policy expects, ``next_ready`` whether the next mini-epoch is
    staged. ``reason`` says why the policy decided so (:data:`metfs.reasons.Reason`, one shape
    per policy, told apart by ``policy``); only ``pass_end`` has one (``None`` otherwise).

    In a multi-rank job (:mod:`metfs.coordinator`) the coordinator also says whether every
    rank's next mini-epoch was staged when the leader decided (``all_ready``, and the
    ``not_ready_ranks``), and, on a follower, the leader's view's generation
    (``leader_generation``); ``None`` without a coordinator.
    """

    decision: DecisionKind
    generation: int
    epoch: int
    mini_epoch: int
    passes_done: int
    rf: float
    mini_epochs: int
    next_ready: bool
    reason: Reason | None = None
    all_ready: bool | None = None
    not_ready_ranks: list[int] | None = None
    leader_generation: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    #: Fields named differently from the protocol: attribute -> protocol field.
    PROTOCOL_NAMES: ClassVar[dict[str, str]] = {"passes_done": "pass"}
    #: Fields the client fills in (the coordinator), not read from the reply.
    DERIVED: ClassVar[frozenset[str]] = frozenset(
        {"all_ready", "not_ready_ranks", "leader_generation"}
    )

    @classmethod
    def from_response(cls, obj: dict[str, Any], op: str) -> "Decision":
        """Builds the decision from a response object to ``op``."""
        return read_reply(cls, obj, op)

    @property
    def advanced(self) -> bool:
        """Whether the view moved to the next mini-epoch."""
        return self.decision == "advance"

    @property
    def position(self) -> tuple[int, int]:
        """``(epoch, mini_epoch)`` after the decision."""
        return (self.epoch, self.mini_epoch)


@dataclass(frozen=True)
class Released:
    """Answer to ``release``: the generation whose lease ended."""

    released: int
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Left:
    """Answer to ``leave``: the job that left the shared mount."""

    left: str
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
