"""Client of the metfs control socket.

The daemon speaks newline-delimited JSON over a Unix socket: one request object per line with an
``"op"`` field, one response object per line with an ``"ok"`` field. Failures carry
``{"error": {"code": ..., "message": ...}}`` and are raised here as :class:`MetfsError`.

Every message carries ``"v"``, the protocol's major version (:data:`PROTOCOL_VERSION`). A reply
of another major version is refused with ``unsupported_version``, naming both versions; one
without ``"v"`` comes from a daemon older than the field and is read as version 1. The
messages are defined once, in the daemon (``protocol/src``, the ``metfs-protocol`` crate), and described by the JSON
schema ``docs/protocol.schema.json`` generated from it; the typed replies here (:class:`Hello`,
:class:`Status`, :class:`FilesView`, :class:`Decision`) are tested against that schema, their
fields named as there except where ``PROTOCOL_NAMES`` says otherwise.

This module uses the standard library only.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import numbers
import os
import socket as _socket
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, cast, get_args

from .pathlist import PathList

if TYPE_CHECKING:
    from typing import Self

__all__ = [
    "PROTOCOL_VERSION",
    "Client",
    "Decision",
    "DecisionKind",
    "FilesView",
    "Hello",
    "MetfsConnectionError",
    "MetfsError",
    "NotResumed",
    "Status",
    "check_version",
    "metrics_to_floats",
]

#: Protocol major version spoken by this client: the ``"v"`` of every message.
PROTOCOL_VERSION = 1

#: Environment variable naming the control socket when no path is given.
SOCKET_ENV = "METFS_SOCKET"

#: Environment variable naming the job when no job is given.
JOB_ENV = "METFS_JOB"

#: Longest response line accepted from the daemon (a ``files`` answer for a large view is long).
MAX_RESPONSE_BYTES = 1 << 30

#: Largest packed file list accepted after a ``files`` reply (10M paths take ~1 GB).
MAX_PACKED_BYTES = 1 << 34

#: Ops whose repetition has no further effect; they are retried once after a dropped connection
#: even when the request may already have reached the daemon.
_IDEMPOTENT_OPS = frozenset({"hello", "status", "files", "apply"})

#: Decisions the daemon may answer to ``pass_end``, ``advance`` and ``apply``.
#: What ``pass_end``, ``advance`` and ``apply`` may answer.
DecisionKind = Literal["repeat", "advance", "wait"]
DECISIONS: tuple[DecisionKind, ...] = get_args(DecisionKind)


class MetfsError(Exception):
    """A request failed.

    ``code`` is the daemon's machine-readable error code (``bad_json``, ``line_too_long``,
    ``unknown_op``, ``bad_request``, ``bad_metrics``, ``unsupported_version``,
    ``staging_failed``, ``shutting_down``, ``too_many_connections``, ``not_permitted`` (direct
    paths asked by a user who may not read the cache), ``no_lease`` (``release`` of a lease not
    held), ``internal``) or one of the client's own:
    ``no_socket``, ``connection_failed``, ``connection_lost``, ``timeout``, ``bad_response``,
    ``unsupported_version`` (a reply of another protocol major version),
    ``bad_metrics`` (a metric rejected before sending), ``peer_failed`` (another rank's daemon
    failed in a multi-node job).
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"[{code}] {message}")
        self.code = code
        self.message = message


class MetfsConnectionError(MetfsError, ConnectionError):
    """The daemon cannot be reached, or the connection to it was lost."""


# --------------------------------------------------------------------------------------------
# Response types
# --------------------------------------------------------------------------------------------


def check_version(message: Mapping[str, Any], what: str) -> None:
    """Refuses a message of another protocol major version, naming both versions.

    A message without ``"v"`` was written before the field existed and is version 1.
    """
    v = message.get("v", 1)
    if isinstance(v, bool) or v != PROTOCOL_VERSION:
        raise MetfsError(
            "unsupported_version",
            f"{what} is protocol version {v!r}; this client speaks version {PROTOCOL_VERSION}",
        )


def _req_int(obj: Mapping[str, Any], name: str, op: str) -> int:
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise MetfsError(
            "bad_response",
            f"`{op}` response has no integer field `{name}`: {json.dumps(obj)[:500]}",
        )
    return value


def _req_number(obj: Mapping[str, Any], name: str, op: str) -> float:
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MetfsError(
            "bad_response",
            f"`{op}` response has no numeric field `{name}`: {json.dumps(obj)[:500]}",
        )
    return float(value)


def _opt_number(obj: Mapping[str, Any], name: str) -> float | None:
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _opt_int(obj: Mapping[str, Any], name: str) -> int | None:
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _opt_str(obj: Mapping[str, Any], name: str) -> str | None:
    value = obj.get(name)
    return value if isinstance(value, str) else None


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
    def from_response(cls, obj: Any, what: str) -> NotResumed:
        """Reads one ``NotResumed`` object of the reply ``what``."""
        if not (
            isinstance(obj, Mapping)
            and isinstance(obj.get("job"), str)
            and isinstance(obj.get("reason"), str)
        ):
            raise MetfsError(
                "bad_response",
                f"`{what}` response has a malformed `not_resumed`: {json.dumps(obj)[:500]}",
            )
        return cls(
            job=obj["job"],
            reason=obj["reason"],
            epoch=_req_int(obj, "epoch", what),
            mini_epoch=_req_int(obj, "mini_epoch", what),
            passes=_req_int(obj, "passes", what),
        )


@dataclass(frozen=True)
class Hello:
    """Answer to ``hello``: the daemon's protocol and identity."""

    protocol: int
    version: str | None
    mountpoint: str | None
    job: str | None
    #: On a shared mount (``metfs mount --share``): the job's place (``path`` of its view,
    #: ``share_bytes``, ``view_bytes``, ``samples``, ``token``); ``None`` on a plain mount.
    share: dict[str, Any] | None = None
    #: On a shared mount restarted with this job's place saved, why the place could not be
    #: resumed (the job starts over at epoch 0); ``None`` otherwise.
    not_resumed: NotResumed | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_response(cls, obj: dict[str, Any]) -> Hello:
        """Builds the answer from a response object."""
        share = obj.get("share")
        if share is not None and not (
            isinstance(share, dict) and isinstance(share.get("path"), str)
        ):
            raise MetfsError("bad_response", f"`hello` response has a malformed `share`: {share!r}")
        return cls(
            protocol=_req_int(obj, "protocol", "hello"),
            version=_opt_str(obj, "version"),
            mountpoint=_opt_str(obj, "mountpoint"),
            job=_opt_str(obj, "job"),
            share=share,
            not_resumed=(
                None
                if obj.get("not_resumed") is None
                else NotResumed.from_response(obj["not_resumed"], "hello")
            ),
            raw=obj,
        )

    @property
    def view_path(self) -> str | None:
        """Where this job's view is: ``MNT/<job>`` on a shared mount, else the mountpoint."""
        if self.share is not None:
            return str(self.share["path"])
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
    why: str
    metric: str
    value: float | None
    finished: bool
    compared: int

    @classmethod
    def from_response(cls, obj: Any) -> Replay | None:
        """Reads ``replay`` of a ``status`` response: ``None`` when it is absent or null."""
        if obj is None:
            return None
        if not (
            isinstance(obj, Mapping)
            and isinstance(obj.get("why"), str)
            and isinstance(obj.get("metric"), str)
            and isinstance(obj.get("finished"), bool)
        ):
            raise MetfsError(
                "bad_response",
                f"`status` response has a malformed `replay`: {json.dumps(obj)[:500]}",
            )
        return cls(
            run=_req_int(obj, "run", "status replay"),
            mini_epochs=_req_int(obj, "mini_epochs", "status replay"),
            why=obj["why"],
            metric=obj["metric"],
            value=_opt_number(obj, "value"),
            finished=obj["finished"],
            compared=_req_int(obj, "compared", "status replay"),
        )


@dataclass(frozen=True)
class Status:
    """Answer to ``status``: where the daemon is and what it holds.

    ``passes_done`` is the protocol's ``pass``: passes completed over the current mini-epoch.
    ``rf`` is the passes per mini-epoch the policy expects (a float: adaptive policies give a
    fractional estimate). ``policy`` is the protocol's ``rf_policy`` (``fixed``, ``score``,
    ``bollinger``, ``learned``). Fields the daemon may leave out are ``None``; every field it sent is
    in ``raw``.

    ``effective_rf`` is the passes a mini-epoch actually got, averaged over those completed
    since the daemon started: with a non-blocking ``pass_end``, passes answered ``wait`` while
    the next mini-epoch stages (bonus passes) raise it above ``rf``. ``last_rf`` is the last
    completed mini-epoch's, ``mini_epoch_bonus_passes`` the current one's bonus passes so far,
    ``stalled_mini_epochs`` how many completed mini-epochs got bonus passes (each a
    ``stall_rf`` event in the daemon's event log).

    ``replay``, under ``rf_policy`` ``learned``, is the earlier run being replayed and why
    (:class:`Replay`); ``None`` for other policies and while there is no earlier run.
    """

    epoch: int
    mini_epoch: int
    mini_epochs: int
    passes_done: int
    rf: float
    generation: int
    next_ready: bool
    cache_bytes: int | None
    budget_bytes: int | None
    tier_bytes_read: int | None
    view_files: int | None
    mountpoint: str | None
    policy: str | None
    effective_rf: float | None
    last_rf: int | None
    mini_epoch_bonus_passes: int | None
    completed_mini_epochs: int | None
    stalled_mini_epochs: int | None
    replay: Replay | None
    #: On a shared mount: the saved jobs whose places this start could not resume, and why;
    #: ``None`` on a plain mount.
    not_resumed: list[NotResumed] | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    #: Fields named differently from the protocol: attribute -> protocol field.
    PROTOCOL_NAMES: ClassVar[dict[str, str]] = {"passes_done": "pass", "policy": "rf_policy"}

    @classmethod
    def from_response(cls, obj: dict[str, Any]) -> Status:
        """Builds the answer from a response object."""
        next_ready = obj.get("next_ready")
        if not isinstance(next_ready, bool):
            raise MetfsError(
                "bad_response",
                f"`status` response has no boolean field `next_ready`: {json.dumps(obj)[:500]}",
            )
        return cls(
            epoch=_req_int(obj, "epoch", "status"),
            mini_epoch=_req_int(obj, "mini_epoch", "status"),
            mini_epochs=_req_int(obj, "mini_epochs", "status"),
            passes_done=_req_int(obj, "pass", "status"),
            rf=_req_number(obj, "rf", "status"),
            generation=_req_int(obj, "generation", "status"),
            next_ready=next_ready,
            cache_bytes=_opt_int(obj, "cache_bytes"),
            budget_bytes=_opt_int(obj, "budget_bytes"),
            tier_bytes_read=_opt_int(obj, "tier_bytes_read"),
            view_files=_opt_int(obj, "view_files"),
            mountpoint=_opt_str(obj, "mountpoint"),
            policy=_opt_str(obj, "rf_policy"),
            effective_rf=_opt_number(obj, "effective_rf"),
            last_rf=_opt_int(obj, "last_rf"),
            mini_epoch_bonus_passes=_opt_int(obj, "mini_epoch_bonus_passes"),
            completed_mini_epochs=_opt_int(obj, "completed_mini_epochs"),
            stalled_mini_epochs=_opt_int(obj, "stalled_mini_epochs"),
            replay=Replay.from_response(obj.get("replay")),
            not_resumed=_not_resumed_list(obj.get("not_resumed")),
            raw=obj,
        )

    def __getitem__(self, name: str) -> Any:
        """Any field of the raw response, e.g. ``status["stage_bytes"]``."""
        return self.raw[name]

    def get(self, name: str, default: Any = None) -> Any:
        """Any field of the raw response, or ``default``."""
        return self.raw.get(name, default)


def _not_resumed_list(obj: Any) -> list[NotResumed] | None:
    """``status``'s ``not_resumed``: ``None`` when absent or null."""
    if obj is None:
        return None
    if not isinstance(obj, list):
        raise MetfsError(
            "bad_response", f"`status` response has a malformed `not_resumed`: {obj!r:.500}"
        )
    return [NotResumed.from_response(n, "status") for n in obj]


def _under(root: str, files: Sequence[str]) -> Sequence[str]:
    """``files`` (relative paths) as absolute paths under ``root``: for a packed list the same
    buffer with another prefix (no string per file), else a plain list."""
    if isinstance(files, PathList):
        return files.with_prefix(root.rstrip("/") + "/")
    return [os.path.join(root, f.lstrip("/")) for f in files]


@dataclass(frozen=True)
class FilesView:
    """The current view: its position, generation and files.

    ``files`` are paths relative to the mount, as the daemon sends them; ``paths`` are the same
    files as absolute paths under ``mountpoint``. Iterating yields the absolute paths. Both are
    read-only sequences of ``str``: for a list the daemon sent packed (what :meth:`Client.files`
    asks for), a :class:`metfs.pathlist.PathList` over one shared buffer, which builds each
    string when it is read; ``list(view.files)`` gives a plain list.

    A view asked for with ``direct`` (:meth:`Client.files`) also has ``direct_root``, the slot
    directory in the cache that holds the view's files, and ``direct_paths``, each file's copy
    there (``direct_root/<file>``, the same buffer as ``files`` for a packed list): complete,
    immutable files that may be read directly, bypassing FUSE, while the client's lease on the
    view's generation holds (see :meth:`Client.files`). ``paths`` and iteration stay the mount's
    paths; :attr:`readable_paths` is what a loader should open: the direct paths when there are
    some, else the mount's. Without ``direct``, ``direct_root`` is ``None`` and
    ``direct_paths`` empty.
    """

    generation: int
    epoch: int
    mini_epoch: int
    mountpoint: str
    files: Sequence[str]
    #: How many files the view holds.
    count: int = 0
    paths: Sequence[str] = field(default=(), repr=False)
    #: With ``direct``: the slot directory in the cache that holds the view's files.
    direct_root: str | None = None
    direct_paths: Sequence[str] = field(default=(), repr=False)

    #: Fields computed here rather than sent by the daemon.
    DERIVED: ClassVar[frozenset[str]] = frozenset({"paths", "direct_paths"})

    @classmethod
    def from_response(
        cls, obj: dict[str, Any], payload: bytes | bytearray | None = None
    ) -> FilesView:
        """Builds the view from a response object, and the bytes after it for a packed list."""
        mountpoint = obj.get("mountpoint")
        if not isinstance(mountpoint, str) or not mountpoint:
            raise MetfsError("bad_response", "`files` response has no string `mountpoint`")
        direct_root = obj.get("direct_root")
        if direct_root is not None and (not isinstance(direct_root, str) or not direct_root):
            raise MetfsError(
                "bad_response", f"`files` response has a malformed `direct_root`: {direct_root!r}"
            )
        files: Sequence[str]
        if payload is not None:
            count = _req_int(obj, "count", "files")
            packed = obj.get("packed")
            names_bytes = packed.get("names_bytes") if isinstance(packed, dict) else None
            if isinstance(names_bytes, bool) or not isinstance(names_bytes, int):
                raise MetfsError("bad_response", "`files` response has no `packed.names_bytes`")
            try:
                files = PathList(payload, count, names_bytes)
            except ValueError as e:
                raise MetfsError("bad_response", f"`files` packed list: {e}") from None
        else:
            listed = obj.get("files")
            if not isinstance(listed, list) or not all(isinstance(f, str) for f in listed):
                raise MetfsError("bad_response", "`files` response has no list of strings `files`")
            files = list(listed)
        sent = obj.get("count")
        return cls(
            generation=_req_int(obj, "generation", "files"),
            epoch=_req_int(obj, "epoch", "files"),
            mini_epoch=_req_int(obj, "mini_epoch", "files"),
            mountpoint=mountpoint,
            files=files,
            # A daemon older than `count` sends none: the list's length is the count.
            count=sent if isinstance(sent, int) and not isinstance(sent, bool) else len(files),
            paths=_under(mountpoint, files),
            direct_root=direct_root,
            direct_paths=() if direct_root is None else _under(direct_root, files),
        )

    def with_direct_root(self, direct_root: str | None) -> FilesView:
        """The same view with another ``direct_root`` (``None``: without direct paths); the
        lists share this view's buffer."""
        if direct_root == self.direct_root:
            return self
        return dataclasses.replace(
            self,
            direct_root=direct_root,
            direct_paths=() if direct_root is None else _under(direct_root, self.files),
        )

    @property
    def readable_paths(self) -> Sequence[str]:
        """What a reader should open: ``direct_paths`` for a direct view, else ``paths``."""
        return self.direct_paths if self.direct_root is not None else self.paths

    def __len__(self) -> int:
        return len(self.files)

    def __iter__(self) -> Iterator[str]:
        return iter(self.paths)


@dataclass(frozen=True)
class Decision:
    """Answer to ``pass_end``, ``advance`` and ``apply``.

    ``decision`` is ``"repeat"`` (train another pass over the same view), ``"advance"`` (the view
    now shows the next mini-epoch) or ``"wait"`` (the policy wants to advance but the next
    mini-epoch is not staged yet: train another pass over the same view). The position fields
    are those *after* the decision; ``passes_done`` is the protocol's ``pass``.
    """

    decision: DecisionKind
    generation: int
    epoch: int
    mini_epoch: int
    passes_done: int
    rf: float | None
    reason: dict[str, Any]
    raw: dict[str, Any] = field(repr=False, compare=False)

    #: Fields named differently from the protocol: attribute -> protocol field.
    PROTOCOL_NAMES: ClassVar[dict[str, str]] = {"passes_done": "pass"}

    @classmethod
    def from_response(cls, obj: dict[str, Any], op: str) -> Decision:
        """Builds the decision from a response object to ``op``."""
        decision = obj.get("decision")
        if decision not in DECISIONS:
            raise MetfsError(
                "bad_response",
                f"`{op}` response has no decision among {DECISIONS}: {json.dumps(obj)[:500]}",
            )
        reason = obj.get("reason")
        return cls(
            decision=cast(DecisionKind, decision),
            generation=_req_int(obj, "generation", op),
            epoch=_req_int(obj, "epoch", op),
            mini_epoch=_req_int(obj, "mini_epoch", op),
            passes_done=_opt_int(obj, "pass") or 0,
            rf=_opt_number(obj, "rf"),
            reason=reason if isinstance(reason, dict) else {},
            raw=obj,
        )

    @property
    def advanced(self) -> bool:
        """Whether the view moved to the next mini-epoch."""
        return self.decision == "advance"

    @property
    def position(self) -> tuple[int, int]:
        """``(epoch, mini_epoch)`` after the decision."""
        return (self.epoch, self.mini_epoch)


# --------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------


def _metric_to_float(name: str, value: Any) -> float:
    """Converts one metric value to a finite float or raises ``MetfsError("bad_metrics")``."""
    if isinstance(value, bool):
        raise MetfsError("bad_metrics", f"metric `{name}` must be a number, got a bool ({value})")
    if isinstance(value, numbers.Real):
        out = float(value)
    else:
        item = getattr(value, "item", None)  # numpy scalars and arrays, torch tensors
        size = getattr(value, "numel", None) or getattr(value, "size", None)
        if callable(size):
            size = size()
        if item is None or not callable(item):
            raise MetfsError(
                "bad_metrics",
                f"metric `{name}` must be a number, got {type(value).__name__} ({value!r:.80})",
            )
        if isinstance(size, int) and size != 1:
            raise MetfsError(
                "bad_metrics",
                f"metric `{name}` must be a single number, got {type(value).__name__} "
                f"with {size} elements",
            )
        try:
            scalar = item()
        except (ValueError, RuntimeError, TypeError) as e:
            raise MetfsError(
                "bad_metrics", f"metric `{name}` must be a single number: {e}"
            ) from None
        if isinstance(scalar, bool) or not isinstance(scalar, numbers.Real):
            raise MetfsError(
                "bad_metrics",
                f"metric `{name}` must be a number, got {type(scalar).__name__} ({scalar!r:.80})",
            )
        out = float(scalar)
    if not math.isfinite(out):
        raise MetfsError("bad_metrics", f"metric `{name}` must be finite, got {out}")
    return out


def metrics_to_floats(metrics: Mapping[str, Any] | None) -> dict[str, float]:
    """Converts a mapping of metric name to number into plain floats.

    Accepts Python numbers, numpy scalars and one-element arrays, and one-element torch tensors
    (via ``.item()``). Rejects anything else, and NaN or infinite values, with
    ``MetfsError("bad_metrics")`` naming the metric.
    """
    if metrics is None:
        return {}
    if not isinstance(metrics, Mapping):
        raise MetfsError(
            "bad_metrics",
            f"metrics must be a mapping of name to number, got {type(metrics).__name__}",
        )
    out: dict[str, float] = {}
    for name, value in metrics.items():
        if not isinstance(name, str) or not name:
            raise MetfsError("bad_metrics", f"metric names must be non-empty strings, got {name!r}")
        out[name] = _metric_to_float(name, value)
    return out


# --------------------------------------------------------------------------------------------
# Client
# --------------------------------------------------------------------------------------------


class Client:
    """A persistent connection to one metfs daemon's control socket.

    ``socket`` is the socket path; without it, the environment variable ``METFS_SOCKET``.
    ``job`` names the training job (for rf history and per-job state); without it,
    ``METFS_JOB`` if set. ``timeout`` bounds each request that does not wait for staging
    (``None``: no bound); ``wait_timeout`` bounds requests that wait for staging
    (``pass_end(block=True)``, ``advance(wait=True)``, ``apply(wait=True)``; ``None``: no bound).

    The client connects and sends ``hello`` at construction (``connect=False`` defers that to
    the first request), so a dead daemon is reported at once with ``MetfsConnectionError``.
    A connection the daemon dropped is re-established once per request: a request that cannot
    have reached the daemon is resent; one that may have reached it is resent only if repeating
    it is harmless (``hello``, ``status``, ``files``, ``apply``), otherwise
    ``MetfsConnectionError("connection_lost")`` is raised.

    On a shared mount (``metfs mount --share``) the ``hello`` joins the job under its name
    (required there) and answers once its first view is staged; ``subset`` (one of
    ``{"manifest": PATH}``, ``{"labels": [...]}``, ``{"fraction": F, "seed": S}``),
    ``rf_policy`` and ``rf`` choose what it reads and how often; every request carries the
    job's name, a reconnection the token the daemon gave, and :meth:`leave` ends it (else it
    is dropped after the mount's ``share.idle_secs`` without a request). The job's view is at
    ``client.info.view_path``. A shared mount saves each job's place, so a job whose daemon
    was restarted resumes where it was when it joins again with its name and ``token`` (the
    one ``client.info.share["token"]`` gave; a client that stays alive resends it by itself).

    ``direct=True`` makes :meth:`files` ask for direct paths by default (the view's files in
    the cache, read without FUSE, under a lease: see :meth:`files`); the loaders that take a
    ``direct`` of their own (:func:`metfs.passes`, ``MetDataset``, ``MetSequence``) follow the
    client when theirs is ``None``.

    The client is safe to share between threads (requests are serialised) and is a context
    manager that closes the connection.
    """

    def __init__(
        self,
        socket: str | None = None,
        job: str | None = None,
        timeout: float | None = None,
        *,
        wait_timeout: float | None = None,
        connect: bool = True,
        subset: Mapping[str, Any] | None = None,
        rf_policy: str | None = None,
        rf: int | None = None,
        direct: bool = False,
        token: str | None = None,
    ) -> None:
        path = socket if socket is not None else os.environ.get(SOCKET_ENV)
        if not path:
            raise MetfsError(
                "no_socket",
                f"no control socket given: pass socket=... or set {SOCKET_ENV} "
                "(the daemon's default is CACHE_DIR/metfs.sock)",
            )
        self.socket_path: str = os.fspath(path)
        self.job: str | None = job if job is not None else (os.environ.get(JOB_ENV) or None)
        self.timeout = timeout
        self.wait_timeout = wait_timeout
        self.subset: dict[str, Any] | None = dict(subset) if subset is not None else None
        self.rf_policy = rf_policy
        self.rf = rf
        #: Whether :meth:`files` asks for direct paths when its ``direct`` is ``None``.
        self.direct = direct
        #: A direct ``files`` was answered and no ``release`` or ``close`` followed: later
        #: ``files`` stay direct, so the lease follows the view (and a new connection takes
        #: one again) instead of pinning an old slot.
        self._leasing = False
        #: The generation this connection holds a lease on, as its answers said.
        self._lease: int | None = None
        self._token: str | None = token
        self._sock: _socket.socket | None = None
        self._buf = bytearray()
        self._lock = threading.RLock()
        self._hello: Hello | None = None
        if connect:
            self.connect()

    # -- connection -----------------------------------------------------------------------

    def connect(self) -> Hello:
        """Opens the connection (if closed) and performs the ``hello`` handshake."""
        with self._lock:
            if self._sock is None:
                self._open()
            assert self._hello is not None
            return self._hello

    def _open(self) -> None:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except FileNotFoundError:
            sock.close()
            raise MetfsConnectionError(
                "connection_failed",
                f"metfs control socket {self.socket_path} does not exist: is the daemon "
                "running (`metfs mount ...`) and is this the socket it was given?",
            ) from None
        except ConnectionRefusedError:
            sock.close()
            raise MetfsConnectionError(
                "connection_failed",
                f"nothing listens on metfs control socket {self.socket_path}: "
                "the daemon has exited (see its log) or the mount was unmounted",
            ) from None
        except TimeoutError:
            sock.close()
            raise MetfsConnectionError(
                "timeout",
                f"connecting to metfs control socket {self.socket_path} timed out",
            ) from None
        except OSError as e:
            sock.close()
            raise MetfsConnectionError(
                "connection_failed",
                f"cannot connect to metfs control socket {self.socket_path}: {e}",
            ) from None
        self._sock = sock
        self._buf.clear()
        request = self._hello_request()
        try:
            self._send(request)
            # A join on a shared mount answers once the job's first view is staged.
            resp = self._recv(self.wait_timeout if self.job else self.timeout, "hello")
        except (OSError, ConnectionError) as e:
            self._close_socket()
            raise MetfsConnectionError(
                "connection_failed",
                f"the metfs daemon at {self.socket_path} closed the connection during the "
                f"handshake ({e}): is it shutting down?",
            ) from None
        except BaseException:
            self._close_socket()
            raise
        if not resp.get("ok"):
            self._close_socket()
            raise _error_from(resp)
        self._took_hello(Hello.from_response(resp))

    def _hello_request(self) -> dict[str, Any]:
        request: dict[str, Any] = {"op": "hello", "version": PROTOCOL_VERSION}
        if self.job:
            request["job"] = self.job
        if self.subset is not None:
            request["subset"] = self.subset
        if self.rf_policy is not None:
            request["rf_policy"] = self.rf_policy
        if self.rf is not None:
            request["rf"] = self.rf
        if self._token is not None:
            request["token"] = self._token
        return request

    def _took_hello(self, hello: Hello) -> None:
        self._hello = hello
        if hello.share is not None:
            self._token = str(hello.share.get("token"))

    def _with_job(self, request: dict[str, Any]) -> dict[str, Any]:
        if self.job:
            request["job"] = self.job
        return request

    def _close_socket(self) -> None:
        # A lease is the connection's: it ends with it.
        self._lease = None
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
                self._buf.clear()

    def close(self) -> None:
        """Closes the connection, which ends its lease (if :meth:`files` took one with
        ``direct``). A later request reconnects; a later ``files`` takes a lease only if asked
        with ``direct`` (or the client was made with ``direct=True``)."""
        with self._lock:
            self._leasing = False
            self._close_socket()

    @property
    def lease(self) -> int | None:
        """The generation whose slot the open connection holds a lease on (taken by
        :meth:`files` with ``direct``), or ``None``: none taken, released, or lost with a
        dropped connection (the next ``files`` takes it again)."""
        return self._lease

    @property
    def connected(self) -> bool:
        """Whether a connection is open."""
        return self._sock is not None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client(socket={self.socket_path!r}, job={self.job!r})"

    # -- wire -------------------------------------------------------------------------------

    def _peer_closed(self) -> bool:
        """Whether the daemon closed its end while we were idle (a pending EOF or error)."""
        assert self._sock is not None
        if self._buf:
            return False
        # Non-blocking for the peek: with a timeout set, CPython waits for the socket to become
        # readable before `recv` (MSG_DONTWAIT or not), so every request on an idle, healthy
        # connection would first wait out the client's whole timeout. `_send` sets it back.
        self._sock.settimeout(0.0)
        try:
            data = self._sock.recv(1, _socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True
        return data == b""

    def _send(self, request: Mapping[str, Any]) -> None:
        assert self._sock is not None
        try:
            message = {"v": PROTOCOL_VERSION, **request}
            line = json.dumps(message, allow_nan=False, separators=(",", ":")) + "\n"
        except (TypeError, ValueError) as e:
            raise MetfsError("bad_request", f"request cannot be encoded as JSON: {e}") from None
        self._sock.settimeout(self.timeout)
        self._sock.sendall(line.encode("utf-8"))

    def _recv(self, timeout: float | None, op: str) -> dict[str, Any]:
        assert self._sock is not None
        self._sock.settimeout(timeout)
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line = bytes(self._buf[:nl])
                del self._buf[: nl + 1]
                break
            if len(self._buf) > MAX_RESPONSE_BYTES:
                raise MetfsError(
                    "bad_response", f"`{op}` response is longer than {MAX_RESPONSE_BYTES} bytes"
                )
            try:
                chunk = self._sock.recv(1 << 16)
            except TimeoutError:
                raise MetfsError(
                    "timeout", f"no answer to `{op}` from {self.socket_path} within {timeout} s"
                ) from None
            if not chunk:
                raise ConnectionResetError(errno.ECONNRESET, "daemon closed the connection")
            self._buf.extend(chunk)
        try:
            obj = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise MetfsError(
                "bad_response", f"`{op}` response is not JSON ({e}): {line[:200]!r}"
            ) from None
        if not isinstance(obj, dict) or not isinstance(obj.get("ok"), bool):
            raise MetfsError(
                "bad_response", f"`{op}` response is not an object with `ok`: {line[:200]!r}"
            )
        check_version(obj, f"`{op}` reply")
        return obj

    def _recv_packed(
        self, resp: Mapping[str, Any], timeout: float | None, op: str
    ) -> bytearray | None:
        """The bytes after a reply whose ``packed`` says a list follows (else ``None``)."""
        packed = resp.get("packed")
        if not resp.get("ok") or not isinstance(packed, dict):
            return None
        n = packed.get("bytes")
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_PACKED_BYTES:
            raise MetfsError(
                "bad_response",
                f"`{op}` reply announces a packed list of {n!r} bytes "
                f"(at most {MAX_PACKED_BYTES} are read)",
            )
        assert self._sock is not None
        out = bytearray(n)
        have = min(len(self._buf), n)
        out[:have] = self._buf[:have]
        del self._buf[:have]
        mv = memoryview(out)
        self._sock.settimeout(timeout)
        while have < n:
            try:
                got = self._sock.recv_into(mv[have:], min(n - have, 1 << 22))
            except TimeoutError:
                raise MetfsError(
                    "timeout",
                    f"the packed list after `{op}` stopped after {have} of {n} bytes "
                    f"({self.socket_path}, {timeout} s)",
                ) from None
            if not got:
                raise ConnectionResetError(errno.ECONNRESET, "daemon closed the connection")
            have += got
        mv.release()
        return out

    def request(self, request: Mapping[str, Any], *, wait: bool = False) -> dict[str, Any]:
        """Sends one request object and returns the successful response object.

        Raises ``MetfsError`` with the daemon's code when the response has ``"ok": false``.
        ``wait`` marks a request that may wait for staging (``wait_timeout`` applies to it).
        """
        return self._exchange(request, wait=wait)[0]

    def _exchange(
        self, request: Mapping[str, Any], *, wait: bool = False
    ) -> tuple[dict[str, Any], bytearray | None]:
        """:meth:`request`, with the packed bytes that follow a ``files`` reply in that form."""
        op = str(request.get("op", "?"))
        timeout = self.wait_timeout if wait else self.timeout
        with self._lock:
            for attempt in (0, 1):
                if self._sock is None:
                    self._open()
                elif self._peer_closed():
                    self._close_socket()
                    self._open()
                sent = False
                try:
                    self._send(request)
                    sent = True
                    resp = self._recv(timeout, op)
                    payload = self._recv_packed(resp, timeout, op)
                except MetfsError as e:
                    if e.code == "timeout":
                        # The answer may still come; the stream is out of step, start afresh.
                        self._close_socket()
                    raise
                except (OSError, ConnectionError) as e:
                    self._close_socket()
                    if attempt == 0 and (not sent or op in _IDEMPOTENT_OPS):
                        continue
                    if sent:
                        raise MetfsConnectionError(
                            "connection_lost",
                            f"the metfs daemon at {self.socket_path} closed the connection "
                            f"before answering `{op}` ({e}); the request may or may not have "
                            "been carried out. Is the daemon still running?",
                        ) from None
                    raise MetfsConnectionError(
                        "connection_lost",
                        f"cannot send `{op}` to the metfs daemon at {self.socket_path}: {e}",
                    ) from None
                if not resp["ok"]:
                    raise _error_from(resp)
                self._track_lease(request, resp)
                return resp, payload
        raise AssertionError("unreachable")

    def _track_lease(self, request: Mapping[str, Any], resp: Mapping[str, Any]) -> None:
        """Notes what a successful answer did to the connection's lease (also for requests
        sent with :meth:`request`)."""
        op = request.get("op")
        if op == "files" and request.get("direct") is True:
            generation = resp.get("generation")
            if isinstance(generation, int) and not isinstance(generation, bool):
                self._lease = generation
                self._leasing = True
        elif op == "release":
            self._lease = None
            self._leasing = False

    # -- ops --------------------------------------------------------------------------------

    def hello(self) -> Hello:
        """Performs the handshake again and returns the daemon's identity."""
        self._took_hello(Hello.from_response(self.request(self._hello_request())))
        assert self._hello is not None
        return self._hello

    def leave(self) -> None:
        """Leaves a shared mount: the job's view goes and its share of the store is freed."""
        if not self.job:
            raise MetfsError("bad_request", "`leave` needs the client's job name")
        self.request({"op": "leave", "job": self.job})
        self._token = None

    @property
    def info(self) -> Hello | None:
        """The last ``hello`` answer (``None`` before the first connection)."""
        return self._hello

    def status(self) -> Status:
        """The daemon's state: position, generation, staging readiness, bytes."""
        return Status.from_response(self.request(self._with_job({"op": "status"})))

    def files(self, known: FilesView | None = None, direct: bool | None = None) -> FilesView:
        """The current view's files (relative and absolute) with its generation and position.

        The list comes packed (one buffer, a string built only for the path read: see
        :class:`metfs.pathlist.PathList`). With ``known``, a view read earlier, the daemon sends
        no list while its generation is still ``known``'s, and ``known`` itself is returned:
        asking at every pass costs one short round trip, whatever the view's size.

        With ``direct=True`` the view also has ``direct_root`` and ``direct_paths`` (its
        :attr:`FilesView.readable_paths`): the staged copies of its files in the cache, complete
        and immutable, to be read directly instead of through FUSE (native speed where FUSE
        passthrough is not available), and this connection takes a **lease** on the view's
        generation: while it holds, the daemon does not evict that view's slot, even after the
        view has switched. Only the daemon's own user and root may ask (else ``MetfsError``
        ``not_permitted``: read through the mount). One lease per connection: it moves to the
        view answered by the next direct ``files``, and ends at :meth:`release`, at
        :meth:`close`, or when the connection drops (the daemon closes one idle for its
        ``control.idle_timeout_secs``, 600 s by default). Other processes may read the direct
        paths (forked ``DataLoader`` workers) while this client's connection holds the lease.

        ``direct=None`` (the default) is ``True`` for a client made with ``direct=True`` and
        for one that took a lease and has not released it since: the lease follows the view
        rather than pinning a slot the reader has left. The client remembers that it leases,
        so after a dropped connection (a reconnection loses the lease) the next ``files``
        takes the lease again, on the current view; between the drop and that ``files`` no
        lease is held, and a view that switched meanwhile may have been evicted. ``direct=False``
        asks for the mount's paths only; a lease held stays where it is until :meth:`release`.
        """
        with self._lock:
            want = direct if direct is not None else (self.direct or self._leasing)
            req: dict[str, Any] = {"op": "files", "form": "packed"}
            if known is not None:
                req["known_generation"] = known.generation
            if want:
                req["direct"] = True
            resp, payload = self._exchange(self._with_job(req))
        root: str | None = None
        if want:
            sent_root = resp.get("direct_root")
            if not isinstance(sent_root, str) or not sent_root:
                raise MetfsError(
                    "bad_response",
                    f"`files` with `direct` got no `direct_root` from {self.socket_path}: the "
                    "daemon is older than direct reads; read through the mount",
                )
            root = sent_root
        if known is not None and resp.get("unchanged") is True:
            if resp.get("generation") != known.generation:
                raise MetfsError(
                    "bad_response",
                    f"`files` reply says unchanged for generation {resp.get('generation')!r}; "
                    f"the list held is of generation {known.generation}",
                )
            return known.with_direct_root(root)
        return FilesView.from_response(resp, payload)

    def release(self, generation: int | None = None) -> int:
        """Ends this connection's lease (taken by :meth:`files` with ``direct``) and returns
        its generation; the view's slot may then be evicted once nothing else holds it, so the
        direct paths of that view must not be read any more.

        With ``generation``, only a lease on that generation is ended: a lease on another one
        stays and ``MetfsError`` ``no_lease`` is raised. Without a lease on this connection
        (none taken, already released, or lost with a dropped connection, which ended it) the
        daemon answers ``no_lease`` too. After a release, :meth:`files` asks for direct paths
        again only when told to (or the client was made with ``direct=True``).
        """
        if generation is not None and (
            isinstance(generation, bool) or not isinstance(generation, int) or generation < 0
        ):
            raise MetfsError(
                "bad_request", f"`generation` must be a non-negative int, got {generation!r}"
            )
        req: dict[str, Any] = {"op": "release"}
        if generation is not None:
            req["generation"] = generation
        with self._lock:
            try:
                resp = self.request(req)
            except MetfsError as e:
                if e.code == "no_lease" and (generation is None or self._lease is None):
                    # This connection holds no lease: nothing is leased, nor to be re-taken.
                    self._lease = None
                    self._leasing = False
                raise
        return _req_int(resp, "released", "release")

    def pass_end(
        self,
        metrics: Mapping[str, Any] | None = None,
        block: bool = False,
        *,
        progress: float | None = None,
        fresh_loss: float | None = None,
    ) -> Decision:
        """Reports the end of one pass over the current mini-epoch and returns the decision.

        ``metrics`` maps names to numbers (Python, numpy or one-element torch values); they are
        converted to floats here and anything else is rejected with ``bad_metrics`` before
        sending. With ``block=True``, when the policy wants to advance the daemon waits for the
        next mini-epoch to be staged and answers ``advance`` instead of ``wait``.

        ``progress`` (the elapsed fraction of the job's budget, in [0, 1]) and ``fresh_loss``
        (the loss of the first batches of a mini-epoch's first pass, before training on them)
        are the signals a policy such as ``paced`` reads (:mod:`metfs.signals`); out of range
        or not finite, they raise ``bad_metrics`` naming the field, before sending.
        """
        from .signals import PassSignals  # the signals module imports this one

        signals = PassSignals(progress=progress, fresh_loss=fresh_loss)
        request: dict[str, Any] = {
            "op": "pass_end",
            "metrics": metrics_to_floats(metrics),
            "block": bool(block),
            **signals.fields(),
        }
        if self.job:
            request["job"] = self.job
        return Decision.from_response(self.request(request, wait=block), "pass_end")

    def advance(self, wait: bool = False) -> Decision:
        """Forces an advance to the next mini-epoch.

        Without ``wait`` the answer is ``wait`` when the next mini-epoch is not staged yet; with
        ``wait=True`` the daemon blocks until it is staged and the view has switched.
        """
        return Decision.from_response(
            self.request(self._with_job({"op": "advance", "wait": bool(wait)}), wait=wait),
            "advance",
        )

    def apply(self, epoch: int, mini_epoch: int, wait: bool = True) -> Decision:
        """Moves the view to exactly ``mini_epoch`` of ``epoch`` (a decision made elsewhere).

        Used by followers in multi-node jobs; with ``wait=True`` blocks until that mini-epoch is
        staged and shown.
        """
        for name, value in (("epoch", epoch), ("mini_epoch", mini_epoch)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise MetfsError(
                    "bad_request", f"`{name}` must be a non-negative int, got {value!r}"
                )
        return Decision.from_response(
            self.request(
                self._with_job(
                    {"op": "apply", "epoch": epoch, "mini_epoch": mini_epoch, "wait": bool(wait)}
                ),
                wait=wait,
            ),
            "apply",
        )


def _error_from(resp: Mapping[str, Any]) -> MetfsError:
    err = resp.get("error")
    if isinstance(err, dict):
        code = str(err.get("code") or "internal")
        message = str(err.get("message") or "(no message)")
    else:
        code, message = "bad_response", f"failed response without an error object: {resp}"
    if code == "shutting_down":
        return MetfsConnectionError(code, message)
    return MetfsError(code, message)
